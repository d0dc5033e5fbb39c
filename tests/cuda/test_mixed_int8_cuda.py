"""The mixed family's int8-activation CUDA kernels (dp4a) on a real GPU (marked `cuda`: skipped
without one). Run on the GPU machine with
``python -m pytest -m cuda tests/cuda/test_mixed_int8_cuda.py``: every sketch and the untuned
kernel against the float64 product of the rounded x (MixedFamily.kernel_reference), through
``qcompile.load`` and through a short tuning run."""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, build_untuned
from qcompile.kernels import MixedSpec, get_family
from qcompile.tune import tune
from schedules.cuda import mixed_int8
from schedules.variants import compute_for
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("mixed")
PRESET = targets.get("cuda")


def check(spec, kernel, seed: int) -> float:
    """Max error of ``kernel`` (a loaded qcompile Kernel) relative to max |reference|."""
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    x = torch.randn(spec.m, spec.k, device="cuda")
    y = kernel(x, kernel.prepare(**tensors))
    reference = FAMILY.kernel_reference(spec, x.cpu().numpy(), **tensors)
    got = y.cpu().numpy()
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error < 1e-5, error
    return error


@pytest.mark.parametrize(("k", "n", "m"), [(8192, 28672, 1), (4096, 4096, 1), (2048, 1024, 4),
                                           (1024, 512, 16)])
def test_untuned_kernels(tmp_path, k, n, m):
    spec = MixedSpec(k=k, n=n, m=m, outlier_share=0.002, int8_activations=True)
    result = build_untuned(spec, PRESET, tmp_path)
    check(spec, qcompile.load(result.so_path), seed=m)


@pytest.mark.parametrize("sketch", mixed_int8.SKETCHES)
def test_every_sketch(tmp_path, sketch):
    from qcompile.build import export

    spec = MixedSpec(k=2048, n=1024, m=2, outlier_share=0.01, int8_activations=True)
    hw = PRESET.hardware()
    knobs = {"k_lanes": 4, "n_lanes": 8, "load_groups": 2, "unroll": 64}
    sch = mixed_int8.sketch(_tvm.Schedule(_tvm.normalize_mod(compute_for(spec, "cuda"))),
                            spec, hw, sketch, knobs)
    so, _ = export(spec, PRESET, _tvm.Target(PRESET.tvm_target(hw)), sch.mod, tmp_path,
                   {"id": None, "sketch": sketch})
    check(spec, qcompile.load(so), seed=3)


def test_tune_then_build(tmp_path):
    spec = MixedSpec(k=1024, n=512, outlier_share=0.01, int8_activations=True)
    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    summary = tune(spec, PRESET, trials=8, storage=storage, progress=False)
    assert summary.trials > 0
    result = build(spec, PRESET, tmp_path / "out", storage=storage)
    check(spec, qcompile.load(result.so_path), seed=5)
