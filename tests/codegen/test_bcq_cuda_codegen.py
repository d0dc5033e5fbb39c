"""CUDA kernels of the BCQ family, built on this machine without a GPU.

The generated CUDA C (two kernels: the LUT kernel with its tables and its groups' sums of x in
shared memory and partial sums per K slice, then the sum over slices) is checked for
structure, compiled by ptxas when nvcc is installed, and run kernel after kernel on the CPU
emulator against the float64 reference, every output poisoned first.
"""

import re

import numpy as np
import pytest
import torch

import targets
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import LoadError, SpecError
from qcompile.kernels import BcqSpec, get_family
from qcompile.kernels.bcq.compute import bcq_compute
from qcompile.testing.cuda_emulator import aligned, emulate_all, ptxas_report
from schedules.cuda import bcq as cuda_bcq
from schedules.variants import compute_for

FAMILY = get_family("bcq")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())
_BODY = re.compile(r'extern "C" __global__ [^;{]*\{')   # kernel definitions, not declarations


def schedule(spec, knobs, stage_words=False, unroll_groups=False, words_inner=False,
             sums_first=False):
    # this space's compute even where the family picks the rotated one (mu = 8, one row)
    mod = _tvm.normalize_mod(bcq_compute(spec, gpu=True))
    return cuda_bcq.sketch(_tvm.Schedule(mod), spec, HW, knobs, stage_words=stage_words,
                           unroll_groups=unroll_groups, words_inner=words_inner,
                           sums_first=sums_first)


def cuda_source(mod) -> str:
    lib = _tvm.tvm.compile(mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


def run_emulated(spec, knobs, seed, stage_words=False, unroll_groups=False, words_inner=False,
                 sums_first=False):
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    planes, alpha, z = (t.numpy() for t in FAMILY.prepare(spec, **tensors).tensors)
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    y = aligned(np.full((spec.m, spec.n), np.nan, dtype=np.float32))
    slices = spec.groups // knobs["groups_per_block"]
    buffers = {"x": aligned(x), "planes": aligned(planes), "alpha": aligned(alpha),
               "z": aligned(z), "y": y,
               "y_rf": aligned(np.full((slices, spec.m, spec.n), np.nan, np.float32))}
    emulate_all(schedule(spec, knobs, stage_words, unroll_groups, words_inner, sums_first).mod,
                TARGET, buffers)
    assert not np.isnan(y).any(), "the kernels left outputs unwritten"
    return y, FAMILY.reference(spec, x, **tensors)


CASES = [  # (q, group_size, mu, m, k, n, knobs, stage_words, unroll_groups[, words_inner,
    #          sums_first])
    (3, 128, 4, 1, 512, 256, dict(threads=32, cols=2, groups_per_block=2, unroll=16), True,
     False),
    (3, 128, 4, 1, 512, 512, dict(threads=32, cols=4, groups_per_block=2, unroll=16), True,
     True),
    (3, 128, 8, 1, 512, 256, dict(threads=64, cols=1, groups_per_block=1, unroll=0), False,
     False),
    (2, 64, 4, 2, 512, 256, dict(threads=32, cols=4, groups_per_block=4, unroll=64), False,
     False),
    (2, 64, 4, 2, 512, 256, dict(threads=64, cols=4, groups_per_block=4, unroll=16), True,
     True),
    (4, -1, 8, 1, 256, 128, dict(threads=32, cols=1, groups_per_block=1, unroll=16), False,
     False),
    (1, 96, 3, 3, 384, 64, dict(threads=32, cols=2, groups_per_block=2, unroll=16), False,
     False),
    (3, 128, 8, 2, 512, 256, dict(threads=32, cols=2, groups_per_block=1, unroll=0), True,
     True),
    (3, 128, 4, 1, 512, 512, dict(threads=32, cols=4, groups_per_block=2, unroll=16), True,
     True, True),
    (3, 128, 4, 1, 1024, 256, dict(threads=32, cols=4, groups_per_block=4, unroll=16), True,
     False, True),
    (2, 64, 4, 2, 512, 256, dict(threads=64, cols=2, groups_per_block=2, unroll=16), True,
     True, True),
    (3, 128, 4, 2, 512, 256, dict(threads=32, cols=4, groups_per_block=2, unroll=16), True,
     True, True, True),
    (3, 128, 8, 1, 512, 256, dict(threads=64, cols=1, groups_per_block=2, unroll=0), False,
     False, False, True),
]


@pytest.mark.parametrize("case", CASES)
def test_emulated_kernels_match_reference(case):
    q, group_size, mu, m, k, n, knobs, stage_words, unroll_groups, *extra = case
    words_inner, sums_first = (*extra, False, False)[:2]
    spec = BcqSpec(k=k, n=n, q=q, group_size=group_size, mu=mu, m=m)
    y, ref = run_emulated(spec, knobs, seed=q * 10 + mu, stage_words=stage_words,
                          unroll_groups=unroll_groups, words_inner=words_inner,
                          sums_first=sums_first)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-5


def test_heuristic_schedule_is_correct():
    spec = BcqSpec(k=1024, n=512, q=3, group_size=128, mu=4)
    knobs = cuda_bcq.heuristic_knobs(spec, HW)
    stage = cuda_bcq.can_stage_words(spec)
    y, ref = run_emulated(spec, knobs, seed=1, stage_words=stage)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-5


def test_generated_cuda_has_the_papers_structure():
    spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=8)
    knobs = cuda_bcq.heuristic_knobs(spec, HW)
    source = cuda_source(schedule(spec, knobs, stage_words=True).mod)
    assert len(_BODY.findall(source)) == 2                    # no kernel before the lookups
    table = re.search(r"__shared__ (?:alignas\(\d+\) )?float table_shared(?:_ptr)?\[(\d+)\]",
                      source)
    assert table, "the tables live in shared memory"
    assert int(table.group(1)) == knobs["groups_per_block"] * 16 * 256   # l tables of 2**8
    assert "__syncthreads()" in source
    assert "& (uint)255" in source                                        # an 8-bit key
    assert "y_rf" in source                                               # K-slice partials
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_heuristic_kernel_at_the_issue_shape():
    """7168x28672, q=3, g=128, mu=4 (issue 5): the heuristic's own schedule (staged words,
    groups looped: 44.1 us on the H200, tools/results/h200/bcq_sweep2.log) has 128-bit loads of
    the plane words, no spills, and registers for 6 blocks of 128 threads per SM in the lookup
    kernel."""
    spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=4)
    knobs = cuda_bcq.heuristic_knobs(spec, HW)
    assert knobs == {"threads": 128, "cols": 4, "groups_per_block": 2, "unroll": 16}
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = cuda_bcq.heuristic_schedule(_tvm.Schedule(mod), spec, HW)
    source = cuda_source(sch.mod)
    assert source == cuda_source(schedule(spec, knobs, stage_words=True).mod)
    assert len(_BODY.findall(source)) == 2
    assert len(re.findall(r"\*\(int4\*\)\(planes_local_ptr \+ \d+\) = \*\(int4\*\)\(planes_ptr",
                          source)) == 12          # a group: 3 planes x 4 words, LDG.128 each
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
    assert report["registers"] <= 80, report                  # 6 blocks of 128 threads / SM


def test_knob_candidates_respect_shared_memory_and_divisibility():
    spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=8)
    cands = cuda_bcq.knob_candidates(spec, HW)
    assert all(cuda_bcq.table_bytes(spec, g) <= 48 * 1024 for g in cands["groups_per_block"])
    assert cands["groups_per_block"] == [1, 2]            # 16 KiB of tables per group at mu 8
    assert all(spec.groups % g == 0 for g in cands["groups_per_block"])
    assert all(spec.n % t == 0 for t in cands["threads"])


def test_sampled_knobs_build_and_replay():
    """Seeded sampling of the space gives different knobs; each builds for CUDA, and its trace
    replays to the same kernel (what a tuning record stores)."""
    from schedules.knobs import categorical_decisions

    spec = BcqSpec(k=1024, n=1024, q=3, group_size=128, mu=4)
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    seen = set()
    for seed in (1, 2, 3):
        sch = cuda_bcq.design_space(_tvm.Schedule(mod, seed=seed), spec, HW)[seed + 1]
        seen.add(tuple(value for _, value in categorical_decisions(sch.trace)))
        source = cuda_source(sch.mod)
        assert len(_BODY.findall(source)) == 2
        replayed = _tvm.Schedule(mod)
        sch.trace.apply_to_schedule(replayed, remove_postproc=False)
        assert cuda_source(replayed.mod) == source
    assert len(seen) > 1


def test_export_without_gpu_embeds_cuda_and_the_loader_refuses(tmp_path):
    spec = BcqSpec(k=1024, n=512, q=3, group_size=128, mu=8)
    result = build_untuned(spec, PRESET, tmp_path)
    assert result.so_path.is_file()
    assert "table_shared" in (tmp_path / f"{spec.name()}.cu").read_text()
    supported, _ = PRESET.host_support()
    if supported:
        pytest.skip("this host has a GPU")
    import qcompile

    with pytest.raises(LoadError, match="cannot run"):
        qcompile.load(result.so_path)
    assert torch.cuda.is_available() is False


def test_tables_over_shared_memory_are_refused_with_the_numbers():
    # One group of 1024 rows at mu = 8 and M = 2: 128 tables of 256 floats per row, 262144
    # bytes, over any block's shared memory.
    spec = BcqSpec(k=1024, n=768, q=4, group_size=-1, mu=8, m=2)
    with pytest.raises(SpecError, match=r"needs 262144 bytes, over the 49152 bytes"):
        cuda_bcq.knob_candidates(spec, HW)
