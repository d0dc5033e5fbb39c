"""The uniform family's fp16/bf16 tensor-core kernel (mma.sync m16n8k16) on a real GPU (marked
`cuda`: skipped without one): untuned kernels through ``qcompile.load``, x as the model hands
it, against the float64 product of that x, for every bit width, group size and zero-point
convention it takes, and tune -> build. Run with
``python -m pytest -m cuda tests/cuda/test_uniform_mma_f16_cuda.py``."""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.uniform.compute_cuda_mma_f16 import COMPUTE_NAME, stages
from qcompile.tune import tune
from schedules.variants import compute_for
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
#: The issue's bounds on max |y - ref| / max |ref| (the output's own rounding is most of it).
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


def check(spec, kernel, seed: int, sym: bool = False) -> float:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((spec.k, spec.n)).astype(np.float32) * 0.02
    tensors = FAMILY.quantize(spec, weight, sym=sym)
    tensors = {"qweight": tensors.qweight, "scales": tensors.scales, "qzeros": tensors.qzeros,
               "g_idx": tensors.g_idx}
    x = torch.randn(spec.m, spec.k, device="cuda").to(getattr(torch, spec.dtype))
    y = kernel(x, kernel.prepare(**tensors))
    assert y.dtype == x.dtype and y.shape == (spec.m, spec.n)
    reference = FAMILY.reference(spec, x.double().cpu().numpy(), **tensors)
    got = y.double().cpu().numpy()
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error <= TOLERANCE[spec.dtype], error
    return error


@pytest.mark.parametrize(("k", "n", "m", "bits", "group_size", "dtype"), [
    (8192, 28672, 16, 4, 128, "float16"), (8192, 28672, 1, 4, 128, "bfloat16"),
    (4096, 4096, 8, 4, 128, "bfloat16"), (2048, 1024, 11, 2, 64, "float16"),
    (1024, 512, 16, 4, 32, "float16"), (4096, 1024, 3, 2, 32, "bfloat16"),
    (2048, 2048, 16, 8, 128, "float16"), (1024, 4096, 5, 8, -1, "float16"),
    (4096, 1024, 2, 4, -1, "bfloat16"), (28672, 1024, 13, 2, 128, "float16"),
    (8192, 4096, 16, 3, 128, "float16"), (2048, 1024, 1, 3, 32, "bfloat16")])
def test_untuned_kernels(tmp_path, k, n, m, bits, group_size, dtype):
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, dtype=dtype)
    assert compute_for(spec, "cuda").attrs["qcompile.compute"] == COMPUTE_NAME
    check(spec, qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path), seed=m)


@pytest.mark.parametrize(("k", "n", "m", "bits", "group_size", "dtype"), [
    (8192, 28672, 8, 2, 128, "float16"), (28672, 8192, 1, 3, 64, "bfloat16"),
    (8192, 8192, 4, 8, 128, "float16"), (4096, 12288, 1, 4, 32, "float16"),
    (8192, 14336, 1, 4, 128, "float16")])
def test_staged_kernels(monkeypatch, tmp_path, k, n, m, bits, group_size, dtype):
    """Words staged in shared memory by cp.async (uneven slices at 8192x8192, a ring of 48 KB
    at 4096x12288, a ring under 48 KB whose block passed it with the partial sums at
    8192x14336): each unit waited for before it is read. 2- and 3-bit codes keep
    register buffers by default; their staged kernels (the split study's) are checked too."""
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module

    monkeypatch.setitem(kernel_module.WORD_STAGES, bits, kernel_module.WORD_STAGES[bits] or 3)
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, dtype=dtype)
    assert stages(spec) > 0
    check(spec, qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path), seed=m + bits)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_symmetric_weights(tmp_path, bits):
    spec = UniformSpec(k=1024, n=1024, m=4, bits=bits, dtype="float16")
    check(spec, qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path), seed=bits,
          sym=True)


@pytest.mark.parametrize(("k", "n", "m", "bits", "group_size", "dtype"), [
    (8192, 28672, 1, 4, 128, "float16"), (4096, 1024, 16, 3, 32, "bfloat16"),
    (2048, 1024, 5, 2, 64, "float16"), (1024, 512, 9, 8, 128, "float16")])
def test_act_order_kernels_gather_x_themselves(tmp_path, k, n, m, bits, group_size, dtype):
    """act_order specs: x in the checkpoint's order, the kernel reads x[:, perm[k]]."""
    from qcompile.tp.synthetic import random_act_order_layer

    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, dtype=dtype,
                       act_order=True)
    assert compute_for(spec, "cuda").attrs["qcompile.compute"] == COMPUTE_NAME
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    layer = random_act_order_layer(k, n, bits, group_size, np.random.default_rng(m))
    tensors = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros,
               "g_idx": layer.g_idx}
    x = torch.randn(m, k, device="cuda").to(getattr(torch, dtype))
    got = kernel(x, kernel.prepare(**tensors)).double().cpu().numpy()
    reference = FAMILY.reference(spec, x.double().cpu().numpy(), **tensors)
    error = float(np.abs(got - reference).max() / np.abs(reference).max())
    assert np.isfinite(got).all() and error <= TOLERANCE[dtype], error


def test_tune_then_build(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=16, dtype="float16")
    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    summary = tune(spec, PRESET, trials=2, storage=storage, progress=False)
    assert summary.trials > 0
    check(spec, qcompile.load(build(spec, PRESET, tmp_path / "out", storage=storage).so_path),
          seed=1)
