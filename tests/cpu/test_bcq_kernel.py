"""Compiled BCQ (LUT-GEMM) kernels against the reference and against the uniform kernel; prepare
from float, uniform GPTQ and BCQ tensors; tune, build and load through the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import qcompile
from qcompile import _tvm
from qcompile.errors import ArgumentError, FormatError, SpecError
from qcompile.kernels import BcqSpec, UniformSpec, get_family
from qcompile.quantize.rtn import quantize_rtn
from qcompile.testing.kernels import compile_fixed, relative_error
from schedules.cpu import bcq as cpu_bcq
from schedules.cpu import uniform as cpu_uniform
from schedules.variants import compute_for

BCQ = get_family("bcq")
UNIFORM = get_family("uniform")
TILES = {"n_blk": 2, "n_reg": 2, "g_in": 1}


CASES = [(8, 128, 1), (4, 64, 2), (3, -1, 1), (2, 32, 3), (5, 160, 1)]
SKETCH_CASES = [(cpu_bcq.vector_lookup, case) for case in CASES] + [
    (sketch, case) for sketch in (cpu_bcq.scalar_lookup, cpu_bcq.k_blocked)
    for case in (CASES[0], CASES[2])]


@pytest.mark.parametrize(("sketch", "case"), SKETCH_CASES,
                         ids=[f"{s.__name__}-mu{c[0]}-g{c[1]}-m{c[2]}" for s, c in SKETCH_CASES])
def test_kernel_matches_reference(avx2, sketch, case):
    mu, group_size, m = case
    k = 320 if mu == 5 else 384 if mu == 3 else 512
    spec = BcqSpec(k=k, n=64, q=3, group_size=group_size, mu=mu, m=m)
    function = compile_fixed(spec, avx2, sketch, TILES)
    rng = np.random.default_rng(mu * 10 + m)
    tensors = BCQ.example_tensors(spec, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = BCQ.run(spec, function, torch.from_numpy(x), BCQ.prepare(spec, **tensors))
    assert y.shape == (m, spec.n) and y.dtype == torch.float32
    assert relative_error(y.numpy(), BCQ.reference(spec, x, **tensors)) < 1e-5


@pytest.mark.parametrize(("bits", "group_size"), [(2, 128), (3, 128), (4, 32), (4, -1)])
def test_uniform_weights_through_lut_match_the_uniform_kernel(avx2, bits, group_size):
    """The 'Done when' bound: BCQ converted from uniform weights gives the uniform kernel's
    outputs within 1e-4 relative."""
    k, n = 1024, 128
    rng = np.random.default_rng(bits)
    layer = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32) * 0.02, bits, group_size)
    gptq = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros}
    uspec = UniformSpec(k=k, n=n, bits=bits, group_size=group_size)
    uniform = compile_fixed(uspec, avx2, cpu_uniform.register_tile, {"n_blk": 1, "n_reg": 4})
    bspec = BcqSpec(k=k, n=n, q=bits, group_size=group_size, mu=8)
    lut = compile_fixed(bspec, avx2, cpu_bcq.vector_lookup, TILES)
    x = torch.from_numpy(rng.standard_normal(k).astype(np.float32))
    y_uniform = UNIFORM.run(uspec, uniform, x, UNIFORM.prepare(uspec, **gptq)).numpy()
    y_lut = BCQ.run(bspec, lut, x, BCQ.prepare(bspec, **gptq)).numpy()
    rel = np.abs(y_lut.astype(np.float64) - y_uniform).max() / np.abs(y_uniform).max()
    assert rel < 1e-4, rel


def test_act_order_gptq_and_bias(avx2):
    k, n = 256, 64
    rng = np.random.default_rng(11)
    layer = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32), 4, 64)
    g_idx = rng.permutation(np.arange(k) // 64).astype(np.int32)
    bias = rng.standard_normal(n).astype(np.float32)
    spec = BcqSpec(k=k, n=n, q=4, group_size=64, mu=4)
    function = compile_fixed(spec, avx2, cpu_bcq.vector_lookup, TILES)
    tensors = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros,
               "g_idx": g_idx}
    prepared = BCQ.prepare(spec, bias=torch.from_numpy(bias), **tensors)
    assert "perm" in prepared.extras
    x = rng.standard_normal(k).astype(np.float32)
    y = BCQ.run(spec, function, torch.from_numpy(x), prepared).numpy()
    from qcompile.formats.gptq import GptqTensors

    weight = GptqTensors.from_tensors(bits=4, group_size=64, **tensors).dequantize()
    ref = x.astype(np.float64) @ weight + bias
    assert relative_error(y, ref) < 1e-5


def test_prepare_from_float_weights_quantizes_and_reports(avx2):
    k, n = 256, 64
    rng = np.random.default_rng(12)
    weight = rng.standard_normal((k, n)).astype(np.float32)
    spec = BcqSpec(k=k, n=n, q=3, group_size=64, mu=8)
    prepared = BCQ.prepare(spec, weight=weight)
    report = prepared.extras["quantization"]
    assert 0 < report.relative_error < report.greedy_error < 0.3
    function = compile_fixed(spec, avx2, cpu_bcq.scalar_lookup, TILES)
    x = rng.standard_normal(k).astype(np.float32)
    y = BCQ.run(spec, function, x, prepared).numpy()
    assert relative_error(y, BCQ.reference(spec, x, weight=weight)) < 1e-5
    exact = x.astype(np.float64) @ weight
    assert relative_error(y, exact) < 2 * report.relative_error + 0.1


def test_errors_name_the_rule():
    with pytest.raises(SpecError, match="group size 100 must be a multiple of mu=8"):
        BcqSpec(k=1000 // 10 * 32, n=8, group_size=100)
    with pytest.raises(SpecError, match="K=48 must be a multiple of 32"):
        BcqSpec(k=48, n=8, group_size=-1)
    with pytest.raises(SpecError, match="mu=9 is not supported"):
        BcqSpec(k=64, n=8, mu=9, group_size=-1)
    spec = BcqSpec(k=64, n=32, q=2, group_size=32, mu=4)
    with pytest.raises(ArgumentError, match="exactly one of"):
        BCQ.prepare(spec, weight=np.zeros((64, 32)), planes=np.zeros((2, 2, 32), np.int32))
    with pytest.raises(FormatError, match=r"weight must have shape \[K, N\]=\(64, 32\)"):
        BCQ.prepare(spec, weight=np.zeros((32, 64)))
    layer = quantize_rtn(np.ones((64, 32), np.float32), 3, 32)
    rule = r"qweight must have shape \[K\*bits/32, N\]=\(4, 32\).*got \(6, 32\)"
    with pytest.raises(FormatError, match=rule):
        BCQ.prepare(spec, qweight=layer.qweight, scales=layer.scales, qzeros=layer.qzeros)


def test_tune_build_load_through_the_cli(tmp_path, avx2):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    db = f"sqlite:///{tmp_path / 'tuning.sqlite'}"
    flags = ["--family", "bcq", "--bits", "2", "--mu", "4", "--group-size", "64",
             "--shape", "256x128", "--db", db]

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "qcompile.cli", *args], env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    name = "bcq_q2_g64_mu4_k256_n128_m1_f32"
    tuned = cli("tune", "--target", "avx2", *flags, "--trials", "2", "--quiet")
    assert f"tuned {name} for avx2: 2 trials" in tuned
    cli("build", "--target", "avx2", *flags, "--out", str(tmp_path / "out"))
    so = tmp_path / "out" / f"{name}.so"
    assert json.loads(so.with_suffix(".json").read_text())["spec"]["mu"] == 4
    kernel = qcompile.load(so)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 128)).astype(np.float32)
    prepared = kernel.prepare(weight=weight, iterations=2)
    x = rng.standard_normal(256).astype(np.float32)
    y = kernel(x, prepared)
    assert relative_error(y, BCQ.reference(kernel.spec, x, weight=weight, iterations=2)) < 1e-5


@pytest.mark.parametrize("sketch", cpu_bcq.SKETCHES, ids=lambda s: s.__name__)
def test_avx512_build_uses_16_lanes(sketch):
    """The space follows the ISA's width: on avx512 the tables are built (and, but for
    scalar_lookup, looked up and accumulated) 16 lanes wide (compiled only; this host may not
    run avx512)."""
    import targets

    preset = targets.get("avx512")
    hw = preset.hardware()
    spec = BcqSpec(k=256, n=128, q=2, group_size=64, mu=8)
    sch = sketch(_tvm.Schedule(compute_for(spec, "cpu")), spec, hw, TILES)
    asm = _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw))).mod.inspect_source(
        "asm")
    assert "%zmm" in asm
