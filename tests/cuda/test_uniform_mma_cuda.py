"""The uniform family's tensor-core kernel (int8 x, mma.sync) on a real GPU (marked `cuda`:
skipped without one): untuned kernels through ``qcompile.load`` against the float64 product of
the rounded x, every row count from 8 to 16, 2 and 4 bits, and tune -> build. Run with
``python -m pytest -m cuda tests/cuda/test_uniform_mma_cuda.py``."""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.tir.activations import quantized_activations
from qcompile.kernels.uniform.compute_cuda_mma import uses_tensor_cores
from qcompile.tune import tune
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("uniform")
PRESET = targets.get("cuda")


def check(spec, kernel, seed: int) -> float:
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(seed))
    x = torch.randn(spec.m, spec.k, device="cuda")
    y = kernel(x, kernel.prepare(**tensors))
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    reference = quantized_activations(x.cpu().numpy(), spec.group_size) @ weight
    got = y.cpu().numpy()
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error < 1e-5, error
    return error


@pytest.mark.parametrize(("k", "n", "m", "bits", "group_size"), [
    (8192, 28672, 16, 4, 128), (4096, 4096, 8, 4, 128), (2048, 1024, 11, 2, 64),
    (1024, 512, 16, 4, 32), (28672, 1024, 13, 2, 128)])
def test_untuned_kernels(tmp_path, k, n, m, bits, group_size):
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, int8_activations=True)
    assert uses_tensor_cores(spec)
    check(spec, qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path), seed=m)


def test_tune_then_build(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=16, int8_activations=True)
    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    summary = tune(spec, PRESET, trials=4, storage=storage, progress=False)
    assert summary.trials > 0
    check(spec, qcompile.load(build(spec, PRESET, tmp_path / "out", storage=storage).so_path),
          seed=1)
