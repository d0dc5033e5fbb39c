"""The mixed kernel with int8 activations (kernels/mixed/compute_int8.py): exact against the
activations it rounds (outliers on float x), close to float32 x, the spec's rules, the byte
planes in the tiled layout, and a tuning run replayed from the database."""

import numpy as np
import pytest
import torch

from qcompile.errors import SpecError
from qcompile.kernels import MixedSpec, get_family
from qcompile.kernels.layouts import mixed as weight_layout
from qcompile.kernels.tir import activations, int8_dot
from qcompile.kernels.tir import planes as tir_planes
from qcompile.testing.kernels import compile_fixed, relative_error, tune_and_load
from schedules.cpu import mixed_int8

FAMILY = get_family("mixed")


def tiled_register_tile(sch, spec, hw, tiles):
    """The int8 sketch with fixed decisions, in its column-tile layout when it has one."""
    if tiles["t_u"] * 8 % spec.g2 == 0:
        mixed_int8.with_layout(sch, spec, tiles["t_u"])
    return mixed_int8.register_tile(sch, spec, hw, tiles)


@pytest.mark.parametrize(("spec", "tiles"), [
    (MixedSpec(k=256, n=64, g4=64, outlier_share=0.01, int8_activations=True),
     {"t_u": 2, "m_u2": 4, "m_u4": 2, "n_blk": 1}),
    (MixedSpec(k=512, n=64, m=3, g1=32, g2=8, g4=64, four_bit_share=0.5, int8_activations=True),
     {"t_u": 4, "m_u2": 8, "m_u4": 4, "n_blk": 2}),
    (MixedSpec(k=256, n=32, m=2, g4=32, outlier_share=0.0, int8_activations=True),
     {"t_u": 2, "m_u2": 4, "m_u4": 4, "n_blk": 1}),
    (MixedSpec(k=256, n=40, g2=20, outlier_share=0.01, int8_activations=True),
     {"t_u": 1, "m_u2": 4, "m_u4": 2, "n_blk": 1}),
], ids=["gemv-1pct", "m3-g32-half4", "m2-no-outliers", "untiled-g2-20"])
def test_kernel_is_exact_on_the_activations_it_rounds(avx2, spec, tiles):
    function = compile_fixed(spec, avx2, tiled_register_tile, tiles)
    rng = np.random.default_rng(spec.k + spec.m)
    tensors = FAMILY.example_tensors(spec, rng)
    tiled = tiles["t_u"] * 8 % spec.g2 == 0
    layout = weight_layout.n_tiled(tiles["t_u"] * 8) if tiled else None
    weights = FAMILY.prepare(spec, layout=layout, **tensors)
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    x[0, :5] = 0.0  # zeros and an all-zero group must not divide by zero
    x[0, 2 * spec.g1:3 * spec.g1] = 0.0
    y = FAMILY.run(spec, function, torch.from_numpy(x), weights)
    assert relative_error(y, FAMILY.kernel_reference(spec, x, **tensors)) < 1e-5
    # Against float32 activations: the rounding of x to int8 per g1-group, about 5e-3.
    assert relative_error(y, FAMILY.reference(spec, x, **tensors)) < 3e-2


def test_outliers_multiply_the_float_activations(avx2):
    """With and without the CSR outliers: the difference is the sparse product of float x (not
    of the rounded x)."""
    spec = MixedSpec(k=256, n=64, g4=64, outlier_share=0.02, int8_activations=True)
    tiles = {"t_u": 2, "m_u2": 4, "m_u4": 2, "n_blk": 1}
    function = compile_fixed(spec, avx2, tiled_register_tile, tiles)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(1))
    silent = {**tensors, "values": np.zeros_like(tensors["values"])}
    x = np.random.default_rng(2).standard_normal(spec.k).astype(np.float32)
    layout = weight_layout.n_tiled(16)
    with_outliers = FAMILY.run(spec, function, x, FAMILY.prepare(spec, layout=layout, **tensors))
    without = FAMILY.run(spec, function, x, FAMILY.prepare(spec, layout=layout, **silent))
    sparse = x.astype(np.float64) @ FAMILY.checkpoint_tensors(spec, **tensors).outliers()
    np.testing.assert_allclose((with_outliers - without).numpy(), sparse, rtol=1e-4, atol=1e-5)
    rounded = activations.quantized_activations(x[None], spec.g1)[0]
    assert np.abs(rounded - x).max() > 1e-3  # the two x differ: the check above can tell


def test_spec_rules_name_the_numbers():
    with pytest.raises(SpecError, match="N divisible by 8.*got N=36"):
        MixedSpec(k=256, n=36, g2=4, int8_activations=True)
    with pytest.raises(SpecError, match="int8_activations must be True or False"):
        MixedSpec(k=256, n=64, int8_activations=1)
    plain = MixedSpec(k=256, n=64)
    assert "int8_activations" not in plain.to_dict()  # old specs keep their digest
    int8 = MixedSpec(k=256, n=64, int8_activations=True)
    assert int8.digest() != plain.digest() and int8.name() == plain.name() + "_xi8"
    assert MixedSpec.from_dict(int8.to_dict()) == int8


def test_byte_planes_round_trip_through_the_tiled_layout():
    spec = MixedSpec(k=256, n=64, int8_activations=True)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    operands = FAMILY.kernel_operands(spec, tensors, weight_layout.n_tiled(32))
    lay = spec.layout
    assert operands["codes2"].shape == (2, lay.rows2 // 16, 1, 32, 4)
    assert operands["codes4"].shape == (2, lay.rows4 // 8, 1, 32, 4)
    back = weight_layout.unpack(operands, weight_layout.n_tiled(32), spec.g2)
    for name, bits in (("codes2", 2), ("codes4", 4)):  # planes are the words' own bytes
        np.testing.assert_array_equal(back[name], tir_planes.byte_planes(tensors[name], bits))
        assert back[name].reshape(-1, spec.n, 4).view(np.int32)[..., 0].tolist() == \
            tensors[name].tolist()


def test_cli_flag_names_the_int8_spec():
    from qcompile.cli import build_parser, spec_from_args

    args = build_parser().parse_args([
        "build", "--target", "avx2", "--family", "mixed", "--shape", "1024x512",
        "--int8-activations", "--out", "unused"])
    assert spec_from_args(args) == MixedSpec(k=1024, n=512, int8_activations=True)


def test_plans_fit_the_layout_and_the_fields(avx2):
    hw = avx2.hardware()
    for n, g2 in ((64, 16), (28672, 16), (96, 32), (40, 8)):
        spec = MixedSpec(k=1024, n=n, g2=g2, int8_activations=True)
        for plan in mixed_int8.plans(spec, hw):
            assert n % plan.tile_n == 0
            assert plan.tiled == (plan.tile_n % g2 == 0)
            assert plan.n_blk.seed in plan.n_blk.values
            for knob, bits in ((plan.m_u, 2), (plan.m_u4, 4)):
                assert knob.seed in knob.values
                steps = int8_dot.chunk_rows_for(spec.g1, bits) // tir_planes.STEP
                assert all(steps % v == 0 for v in knob.values)


def test_tune_build_and_run_from_the_database(avx2, tmp_path):
    """The design space through MetaSchedule: records replay (layout and tensorize included)
    in a build, and the loaded kernel prepares its own weights."""
    spec = MixedSpec(k=256, n=64, g4=64, int8_activations=True)
    kernel = tune_and_load(spec, avx2, tmp_path)
    assert kernel.layout["kind"] == "n_tiled"
    rng = np.random.default_rng(0)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = kernel.prepare(**tensors)
    x = rng.standard_normal((1, spec.k)).astype(np.float32)
    y = kernel(torch.from_numpy(x), weights)
    assert relative_error(y, FAMILY.kernel_reference(spec, x, **tensors)) < 1e-5


def test_untuned_build_prepares_from_float_weights(avx2, tmp_path):
    """The heuristic schedule, weights quantized at prepare time (QuantLinear-free API)."""
    import qcompile
    from qcompile.build import build_untuned

    spec = MixedSpec(k=256, n=64, g4=64, int8_activations=True)
    kernel = qcompile.load(build_untuned(spec, avx2, tmp_path).so_path)
    rng = np.random.default_rng(3)
    weight = (rng.standard_t(4, size=(spec.k, spec.n)) * 0.02).astype(np.float32)
    calibration = rng.standard_normal((64, spec.k)).astype(np.float32)
    prepared = kernel.prepare(weight=weight, calibration=calibration)
    x = rng.standard_normal(spec.k).astype(np.float32)
    y = kernel(x, prepared)
    arrays = FAMILY.quantize(spec, weight, calibration=calibration).tensors.operands()
    assert relative_error(y, FAMILY.kernel_reference(spec, x, **arrays)) < 1e-5
