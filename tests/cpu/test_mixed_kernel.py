"""The fused mixed 2/4/16 kernel, compiled with fixed schedules and untuned, against the
reference dequantization; prepare from float weights plus calibration; the CLI's flags."""

import numpy as np
import pytest
import torch

import qcompile
from qcompile.build import build_untuned
from qcompile.cli import build_parser, main, spec_from_args
from qcompile.errors import ArgumentError
from qcompile.kernels import MixedSpec, get_family
from qcompile.testing.kernels import compile_fixed, relative_error
from schedules.cpu import mixed as cpu_mixed

FAMILY = get_family("mixed")


@pytest.mark.parametrize(("spec", "tiles"), [
    (MixedSpec(k=512, n=256, g4=64), {"n_blk": 2, "n_reg": 2}),
    (MixedSpec(k=512, n=128, m=3, g1=32, g2=8, g4=64, outlier_share=0.01),
     {"n_blk": 1, "n_reg": 4, "g_unroll": 2}),
    (MixedSpec(k=256, n=64, m=2, g4=32, four_bit_share=0.5, outlier_share=0.0),
     {"n_blk": 1, "n_reg": 1}),
], ids=["gemv", "m3-g32-1pct", "no-outliers"])
def test_kernel_matches_reference_dequantization(cpu_preset, spec, tiles):
    function = compile_fixed(spec, cpu_preset, cpu_mixed.register_tile, tiles)
    rng = np.random.default_rng(spec.k + spec.m)
    tensors = FAMILY.example_tensors(spec, rng)
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    y = FAMILY.run(spec, function, torch.from_numpy(x), FAMILY.prepare(spec, **tensors))
    assert y.shape == (spec.m, spec.n) and y.dtype == torch.float32
    assert relative_error(y.numpy(), FAMILY.reference(spec, x, **tensors)) < 1e-5


def test_outliers_are_part_of_the_fused_call(avx2):
    """The same dense part with and without its CSR outliers: the difference is exactly the
    sparse product."""
    spec = MixedSpec(k=256, n=128, g4=64, outlier_share=0.01)
    function = compile_fixed(spec, avx2, cpu_mixed.register_tile, {"n_blk": 2, "n_reg": 2})
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(1))
    silent = {**tensors, "values": np.zeros_like(tensors["values"])}
    x = np.random.default_rng(2).standard_normal(spec.k).astype(np.float32)
    with_outliers = FAMILY.run(spec, function, x, FAMILY.prepare(spec, **tensors)).numpy()
    without = FAMILY.run(spec, function, x, FAMILY.prepare(spec, **silent)).numpy()
    columns = np.repeat(np.arange(spec.n), np.diff(tensors["row_ptr"]))
    sparse = np.zeros(spec.n)
    np.add.at(sparse, columns, tensors["values"][: spec.layout.nnz].astype(np.float64)
              * x[tensors["cols"][: spec.layout.nnz]])
    np.testing.assert_allclose(with_outliers - without, sparse, rtol=1e-4, atol=1e-5)


def test_untuned_build_loads_and_prepares_from_float_weights(tmp_path, avx2):
    spec = MixedSpec(k=512, n=256, g4=64)
    result = build_untuned(spec, avx2, tmp_path)
    kernel = qcompile.load(result.so_path)
    rng = np.random.default_rng(3)
    weight = (rng.standard_t(4, size=(spec.k, spec.n)) * 0.02).astype(np.float32)
    calibration = torch.from_numpy(rng.standard_normal((128, spec.k)).astype(np.float32))
    prepared = kernel.prepare(weight=torch.from_numpy(weight), calibration=calibration)
    report = prepared.extras["report"]
    assert report["average_bits"] < 3.2 and report["outliers"] == spec.layout.nnz
    x = rng.standard_normal(spec.k).astype(np.float32)
    y = kernel(x, prepared)
    quantized = FAMILY.quantize(spec, weight, calibration=calibration.numpy()).tensors
    assert relative_error(y, x.astype(np.float64) @ quantized.dequantize()) < 1e-5
    exact = x.astype(np.float64) @ weight
    assert 0.01 < relative_error(y, exact) < 0.5  # a 2.9-bit approximation, not noise
    with pytest.raises(ArgumentError, match="x must have shape"):
        kernel(np.ones(spec.k + 1, np.float32), prepared)


def test_cli_names_the_mixed_spec():
    args = build_parser().parse_args([
        "build", "--target", "avx2", "--family", "mixed", "--shape", "1024x512", "--g1", "32",
        "--g2", "8", "--g4", "128", "--four-bit-share", "0.5", "--outlier-share", "0.005",
        "--batch", "2", "--out", "unused"])
    spec = spec_from_args(args)
    assert spec == MixedSpec(k=1024, n=512, m=2, g1=32, g2=8, g4=128, four_bit_share=0.5,
                             outlier_share=0.005)
    assert spec.name() == "mixed_g32_8_128_q50_o0p5_k1024_n512_m2_f32"
    assert spec.layout.groups4 == 16 and spec.layout.nnz == 2621


def test_cli_reports_a_broken_rule(capsys):
    code = main(["build", "--target", "avx2", "--family", "mixed", "--shape", "1000x512",
                 "--out", "unused"])
    assert code == 2
    assert "K=1000 must be divisible by g1=16" in capsys.readouterr().err
