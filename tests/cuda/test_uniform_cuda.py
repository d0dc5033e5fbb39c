"""The uniform family's CUDA kernels on a real GPU (marked `cuda`: skipped without one).

Run on the GPU machine with ``python -m pytest -m cuda tests/cuda``. Kernels built there embed
code compiled for that GPU; ``test_kernels_exported_without_a_gpu`` checks kernels exported on a
machine without one (tools/studies/cuda_prebuilt.py build, carried over in QCOMPILE_PREBUILT_CUDA).
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.errors import ArgumentError
from qcompile.kernels import UniformSpec, get_family
from qcompile.tune import tune
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("uniform")
PRESET = targets.get("cuda")


def check(kernel, seed: int, tolerance: float = 1e-5) -> float:
    spec = kernel.spec
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = kernel.prepare(**tensors)
    assert all(t.is_cuda for t in weights.tensors)
    x = torch.randn(spec.m, spec.k, device="cuda").to(getattr(torch, spec.dtype))
    y = kernel(x, weights)
    assert y.is_cuda and y.shape == (spec.m, spec.n) and y.dtype == x.dtype
    got = y.float().cpu().numpy()
    reference = FAMILY.reference(spec, x.float().cpu().numpy(), **tensors)
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error < tolerance, error
    return error


# Every bit width and both layouts, each M at 4 bits (a kernel is built and JIT-compiled per
# case: seconds each, so the set stays small).
@pytest.mark.parametrize("bits,group_size,m", [
    (4, 128, 1), (4, 128, 4), (4, 128, 16), (2, 64, 4), (3, 128, 16), (8, 32, 1), (4, -1, 4)])
def test_untuned_kernels_are_correct(tmp_path, bits, group_size, m):
    spec = UniformSpec(k=1024, n=768, bits=bits, group_size=group_size, m=m)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    check(kernel, seed=bits * 16 + m)


def test_large_layer_is_correct(tmp_path):
    spec = UniformSpec(k=8192, n=28672, m=1)
    check(qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path), seed=1)


def test_tune_then_build_and_run(tmp_path):
    spec = UniformSpec(k=1024, n=1024, m=1)
    storage = Storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}")
    summary = tune(spec, PRESET, trials=4, storage=storage, progress=False)
    assert summary.best_us is not None and summary.trials == 4
    result = build(spec, PRESET, tmp_path / "out", storage=storage)
    assert result.record_id == summary.record_id
    check(qcompile.load(result.so_path), seed=2)


def test_activation_on_the_wrong_device_is_refused(tmp_path):
    spec = UniformSpec(k=512, n=256)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    weights = kernel.prepare(**FAMILY.example_tensors(spec, np.random.default_rng(0)))
    with pytest.raises(ArgumentError, match="x is on cpu but the kernel's weights are on cuda"):
        kernel(torch.randn(spec.k), weights)


@pytest.mark.skipif(not os.environ.get("QCOMPILE_PREBUILT_CUDA"),
                    reason="set QCOMPILE_PREBUILT_CUDA to a directory of kernels exported on a "
                           "machine without a GPU (tools/studies/cuda_prebuilt.py build)")
def test_kernels_exported_without_a_gpu():
    libraries = sorted(Path(os.environ["QCOMPILE_PREBUILT_CUDA"]).glob("*.so"))
    assert libraries
    for so in libraries:
        check(qcompile.load(so), seed=len(so.name), tolerance=1e-4)
