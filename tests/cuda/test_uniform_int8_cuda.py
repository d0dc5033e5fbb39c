"""The uniform family's int8-activation CUDA kernels on a real GPU (marked `cuda`): the dp4a
kernel and the one-row GEMV that rounds x inside (compute_cuda_gemv_int8.py).

Each kernel is checked twice: against the float64 product of the int8-rounded activations it
multiplies (exact up to float32 sums: 1e-5) and against float x (the rounding of x: 3e-2).
"""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, build_untuned
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.layouts import uniform as layout
from qcompile.kernels.tir.activations import quantized_activations
from qcompile.kernels.uniform import compute_cuda_gemv_int8 as gemv
from qcompile.kernels.uniform.compute_cuda_int8 import uniform_compute_cuda_int8
from qcompile.kernels.uniform.compute_cuda_mma import uses_tensor_cores
from qcompile.testing.kernels import relative_error
from qcompile.tune import tune
from schedules.cuda import uniform_int8
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("uniform")
PRESET = targets.get("cuda")


def check(spec, run, prepare, seed: int) -> None:
    """``run(x, weights)`` -> y on the GPU; ``prepare(**tensors)`` -> the kernel's weights."""
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = prepare(**tensors)
    x = torch.randn(spec.m, spec.k, device="cuda")
    y = run(x, weights)
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    x_np = x.cpu().numpy()
    assert relative_error(y, quantized_activations(x_np, spec.group_size) @ weight) < 1e-5
    assert relative_error(y, x_np.astype(np.float64) @ weight) < 3e-2


@pytest.mark.parametrize("bits,group_size,m", [
    (4, 128, 1), (4, 128, 4), (4, 128, 16), (2, 64, 1), (2, 128, 4), (3, 128, 1), (3, 32, 16)])
def test_untuned_kernels_are_correct(tmp_path, bits, group_size, m):
    spec = UniformSpec(k=1024, n=768, bits=bits, group_size=group_size, m=m,
                       int8_activations=True)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    check(spec, kernel, kernel.prepare, seed=bits * 16 + m)


@pytest.mark.parametrize("x_stage", uniform_int8.X_STAGES)
@pytest.mark.parametrize("knobs", [
    {"k_lanes": 8, "n_lanes": 32, "n_vecs": 1, "m_lanes": 1, "load_words": 4, "unroll": 64},
    {"k_lanes": 4, "n_lanes": 8, "n_vecs": 2, "m_lanes": 2, "load_words": 1, "unroll": 0},
], ids=["k8-n32-lw4", "k4-n8-nv2-ml2"])
def test_every_sketch_matches_reference(x_stage, knobs):
    spec = UniformSpec(k=2048, n=1024, bits=4, group_size=128, m=2, int8_activations=True)
    hw = PRESET.hardware()
    mod = _tvm.normalize_mod(uniform_compute_cuda_int8(spec))  # M = 2 takes tensor cores
    sch = uniform_int8.sketch(_tvm.Schedule(mod), spec, hw, x_stage, knobs)
    function = _tvm.tvm.compile(sch.mod, target=_tvm.Target(PRESET.tvm_target(hw)))[spec.name()]

    def run(x, weights):
        y = torch.empty(spec.m, spec.n, device="cuda")
        function(x, *weights.tensors, y)
        return y

    def prepare(**tensors):
        return FAMILY.prepare(spec, device="cuda", layout=layout.plane_words(), **tensors)

    check(spec, run, prepare, seed=7)


def test_large_layer_is_correct(tmp_path):
    spec = UniformSpec(k=8192, n=28672, m=1, int8_activations=True)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    check(spec, kernel, kernel.prepare, seed=1)


def test_tune_then_build_and_run(tmp_path):
    spec = UniformSpec(k=1024, n=2048, m=1, bits=3, int8_activations=True)
    assert not gemv.fits(spec) and not uses_tensor_cores(spec)   # 3 bits: dp4a, sampled knobs
    storage = Storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}")
    summary = tune(spec, PRESET, trials=4, storage=storage, progress=False)
    assert summary.best_us is not None and summary.trials == 4
    kernel = qcompile.load(build(spec, PRESET, tmp_path / "out", storage=storage).so_path)
    check(spec, kernel, kernel.prepare, seed=2)


@pytest.mark.parametrize(("k", "n", "bits", "group_size"), [
    (2688, 1024, 4, 128),     # 21 groups over 16 lanes: the last step splits a warp
    (11008, 4096, 4, 128),    # 86 groups over 32 lanes
    (4096, 4096, 2, 32),
    (4096, 14336, 4, 64),
])
def test_one_row_gemv_is_correct(tmp_path, k, n, bits, group_size):
    spec = UniformSpec(k=k, n=n, m=1, bits=bits, group_size=group_size, int8_activations=True)
    assert gemv.fits(spec)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    check(spec, kernel, kernel.prepare, seed=k % 97)


def test_one_row_gemv_tune_then_build(tmp_path):
    """Its space is one schedule: tuning measures it and records it; build takes the record."""
    spec = UniformSpec(k=1024, n=2048, m=1, int8_activations=True)
    assert gemv.fits(spec)
    storage = Storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}")
    summary = tune(spec, PRESET, trials=4, storage=storage, progress=False)
    assert summary.best_us is not None and summary.trials > 0
    result = build(spec, PRESET, tmp_path / "out", storage=storage)
    assert result.record_id is not None
    kernel = qcompile.load(result.so_path)
    check(spec, kernel, kernel.prepare, seed=3)
