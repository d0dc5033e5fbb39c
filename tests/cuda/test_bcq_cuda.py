"""The BCQ family's CUDA kernels on a real GPU (marked `cuda`: skipped without one).

Run on the GPU machine with ``python -m pytest -m cuda tests/cuda/test_bcq_cuda.py``.
"""

import numpy as np
import pytest
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.errors import ArgumentError
from qcompile.kernels import BcqSpec, UniformSpec, get_family
from qcompile.quantize.rtn import quantize_rtn
from qcompile.testing import kernels
from qcompile.tune import tune
from schedules.variants import compute_for
from tuning_db import Storage

pytestmark = pytest.mark.cuda
FAMILY = get_family("bcq")
PRESET = targets.get("cuda")


def relative_error(got: torch.Tensor, reference: np.ndarray) -> float:
    assert torch.isfinite(got).all()
    return kernels.relative_error(got, reference)


@pytest.mark.parametrize("q,group_size,mu,m", [(3, 128, 8, 1), (2, 64, 8, 1), (3, 128, 4, 1),
                                               (2, 64, 4, 4), (4, -1, 4, 2), (1, 96, 3, 1)])
def test_untuned_kernels_are_correct(tmp_path, q, group_size, mu, m):
    k = 768 if mu == 3 else 1024
    spec = BcqSpec(k=k, n=768, q=q, group_size=group_size, mu=mu, m=m)
    kernel = qcompile.load(build_untuned(spec, PRESET, tmp_path).so_path)
    rng = np.random.default_rng(q * 10 + mu)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = kernel.prepare(**tensors)
    assert all(t.is_cuda for t in weights.tensors)
    x = torch.randn(m, k, device="cuda")
    y = kernel(x, weights)
    assert y.is_cuda and y.shape == (m, spec.n)
    assert relative_error(y, FAMILY.reference(spec, x.cpu().numpy(), **tensors)) < 1e-5


@pytest.mark.parametrize("knobs,stage_words,unroll_groups,words_inner,sums_first", [
    (dict(threads=128, cols=4, groups_per_block=2, unroll=16), True, True, False, False),
    (dict(threads=256, cols=2, groups_per_block=4, unroll=16), True, False, False, False),
    (dict(threads=64, cols=1, groups_per_block=1, unroll=16), False, False, False, False),
    (dict(threads=128, cols=4, groups_per_block=2, unroll=16), True, True, True, False),
    (dict(threads=128, cols=4, groups_per_block=4, unroll=16), True, False, True, False),
    (dict(threads=128, cols=4, groups_per_block=2, unroll=16), True, True, True, True),
])
def test_sketches_are_correct(tmp_path, knobs, stage_words, unroll_groups, words_inner,
                              sums_first):
    """Every sketch of the space (in-place words; staged, with the groups looped or unrolled,
    the words outer or inner), and the group sums read first (a grid point of the sweep)."""
    from qcompile import _tvm
    from qcompile.build import export
    from schedules.cuda import bcq as cuda_bcq

    spec = BcqSpec(k=2048, n=2048, q=3, group_size=128, mu=4)
    hw = PRESET.hardware()
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = cuda_bcq.sketch(_tvm.Schedule(mod), spec, hw, knobs, stage_words=stage_words,
                          unroll_groups=unroll_groups, words_inner=words_inner,
                          sums_first=sums_first)
    so, _ = export(spec, PRESET, _tvm.Target(PRESET.tvm_target(hw)), sch.mod, tmp_path,
                   {"id": None})
    kernel = qcompile.load(so)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(5))
    x = torch.randn(1, spec.k, device="cuda")
    y = kernel(x, kernel.prepare(**tensors))
    assert relative_error(y, FAMILY.reference(spec, x.cpu().numpy(), **tensors)) < 1e-5


@pytest.mark.parametrize("threads,groups_per_block", [(128, 1), (256, 2), (512, 4)])
def test_rotated_kernels_are_correct(tmp_path, threads, groups_per_block):
    """The rotated-chunk GEMV (mu = 8, one row) at pinned knobs, weights packed for its layout
    by ``Kernel.prepare`` from the manifest."""
    from qcompile import _tvm
    from qcompile.build import export
    from qcompile.kernels.layouts.bcq import ROTATED_CHUNKS
    from schedules.cuda import bcq_rotated

    spec = BcqSpec(k=2048, n=2048, q=3, group_size=128, mu=8)
    hw = PRESET.hardware()
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = bcq_rotated.sketch(_tvm.Schedule(mod), spec, hw,
                             {"threads": threads, "groups_per_block": groups_per_block})
    so, _ = export(spec, PRESET, _tvm.Target(PRESET.tvm_target(hw)), sch.mod, tmp_path,
                   {"id": None})
    kernel = qcompile.load(so)
    assert kernel.layout["kind"] == ROTATED_CHUNKS
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(threads))
    x = torch.randn(1, spec.k, device="cuda")
    y = kernel(x, kernel.prepare(**tensors))
    assert relative_error(y, FAMILY.reference(spec, x.cpu().numpy(), **tensors)) < 1e-5
    plain = FAMILY.prepare(spec, device="cuda", **tensors)   # the format's layout: refused
    with pytest.raises(ArgumentError, match="bcq planes .* reads rotated_chunks"):
        kernel(x, plain)
    assert torch.equal(kernel(x, kernel.relayout(plain)), y)


def test_uniform_weights_match_the_uniform_kernel_on_the_gpu(tmp_path):
    k, n = 2048, 1024
    rng = np.random.default_rng(3)
    layer = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32) * 0.02, 3, 128)
    gptq = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros}
    uniform = qcompile.load(build_untuned(UniformSpec(k=k, n=n, bits=3, group_size=128), PRESET,
                                          tmp_path).so_path)
    lut = qcompile.load(build_untuned(BcqSpec(k=k, n=n, q=3, group_size=128, mu=8), PRESET,
                                      tmp_path).so_path)
    x = torch.randn(k, device="cuda")
    y_uniform = uniform(x, uniform.prepare(**gptq)).double()
    y_lut = lut(x, lut.prepare(**gptq)).double()
    assert ((y_lut - y_uniform).abs().max() / y_uniform.abs().max()).item() < 1e-4


@pytest.mark.parametrize("mu", [4, 8])
def test_tune_then_build_from_the_record(tmp_path, mu):
    spec = BcqSpec(k=1024, n=1024, q=3, group_size=128, mu=mu)
    storage = Storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}")
    summary = tune(spec, PRESET, trials=8, storage=storage, progress=False)
    assert summary.best_us is not None and summary.trials == 8
    kernel = qcompile.load(build(spec, PRESET, tmp_path / "out", storage=storage).so_path)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    x = torch.randn(spec.k, device="cuda")
    y = kernel(x, kernel.prepare(**tensors))
    assert relative_error(y, FAMILY.reference(spec, x.cpu().numpy(), **tensors)) < 1e-5
