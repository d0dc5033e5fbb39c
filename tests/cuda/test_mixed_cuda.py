"""The mixed family's CUDA kernel on a real GPU (marked `cuda`: skipped without one).

Run on the GPU machine with ``python -m pytest -m cuda tests/cuda/test_mixed_cuda.py``: both
dequantization orders, built untuned and through a short tuning run, against the float64
reference; prepare from float weights plus calibration data on the GPU.
"""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, build_untuned
from qcompile.kernels import MixedSpec, get_family
from qcompile.tune import tune
from schedules.cuda import mixed as cuda_mixed
from schedules.variants import compute_for
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("mixed")
PRESET = targets.get("cuda")


def check(spec, function, seed: int) -> float:
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    prepared = FAMILY.prepare(spec, device="cuda", **tensors)
    x = torch.randn(spec.m, spec.k, device="cuda")
    y = torch.full((spec.m, spec.n), float("nan"), device="cuda")
    function(x, *prepared.tensors, y)
    reference = FAMILY.reference(spec, x.cpu().numpy(), **tensors)
    got = y.cpu().numpy()
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error < 1e-5, error
    return error


@pytest.mark.parametrize("order", cuda_mixed.ORDERS)
@pytest.mark.parametrize("m", [1, 4])
def test_both_orders_match_reference(order, m):
    spec = MixedSpec(k=4096, n=4096, m=m)
    hw = PRESET.hardware()
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = cuda_mixed.heuristic_schedule(_tvm.Schedule(mod), spec, hw, order)
    lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(PRESET.tvm_target(hw)))
    check(spec, lib[spec.name()], seed=m)


@pytest.mark.parametrize("sketch", cuda_mixed.SKETCHES)
@pytest.mark.parametrize("knobs", [
    {"k_lanes": 8, "n_lanes": 32, "load_groups": 1, "unroll": 64},
    {"k_lanes": 32, "n_lanes": 8, "load_groups": 4, "unroll": 64},
    {"k_lanes": 16, "n_lanes": 16, "load_groups": 2, "unroll": 0},
], ids=["k8-n32-lg1", "k32-n8-lg4", "k16-n16-lg2"])
def test_every_sketch_matches_reference(sketch, knobs):
    """Both orders in both K-lane layouts (K lanes in a warp / across warps), at the H200
    shape's K and g4 with a smaller N."""
    spec = MixedSpec(k=8192, n=2048)
    hw = PRESET.hardware()
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = cuda_mixed.sketch(_tvm.Schedule(mod), spec, hw, sketch, knobs)
    lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(PRESET.tvm_target(hw)))
    check(spec, lib[spec.name()], seed=3)


def test_untuned_and_tuned_kernels_load_and_run(tmp_path):
    spec = MixedSpec(k=2048, n=2048, outlier_share=0.005)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path / "untuned").so_path)
    check(spec, kernel.function, seed=1)
    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    summary = tune(spec, PRESET, trials=8, storage=storage, progress=False)
    assert summary.best_us is not None
    tuned = qcompile.load(build(spec, PRESET, tmp_path / "tuned", storage=storage).so_path)
    check(spec, tuned.function, seed=2)


def test_prepare_from_float_weights_on_the_gpu(tmp_path):
    spec = MixedSpec(k=1024, n=1024)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    rng = np.random.default_rng(0)
    weight = (rng.standard_t(4, size=(spec.k, spec.n)) * 0.02).astype(np.float32)
    calibration = rng.standard_normal((256, spec.k)).astype(np.float32)
    prepared = kernel.prepare(weight=weight, calibration=calibration)
    x = torch.randn(spec.k, device="cuda")
    y = kernel(x, prepared)
    quantized = FAMILY.quantize(spec, weight, calibration=calibration).tensors
    reference = x.double().cpu().numpy() @ quantized.dequantize()
    assert np.abs(y.cpu().numpy() - reference).max() / np.abs(reference).max() < 1e-5
