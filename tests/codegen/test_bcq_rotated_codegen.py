"""The BCQ family's rotated-chunk GEMV on CUDA (mu = 8, one row), built on this machine without
a GPU: the weight layout, the family's choice of compute, and the two generated kernels run on
the CPU emulator against the float64 reference, every output poisoned first."""

import re

import numpy as np
import pytest
import torch

import targets
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import FormatError, SpecError
from qcompile.formats.bcq import table_keys
from qcompile.kernels import BcqSpec, get_family
from qcompile.kernels.bcq import compute_cuda_rotated as rotated
from qcompile.kernels.layouts import bcq as bcq_layout
from qcompile.kernels.tir.attrs import compute_name
from qcompile.manifest import read_manifest
from qcompile.testing.cuda_emulator import aligned, emulate_all, ptxas_report
from schedules.cuda import bcq_rotated
from schedules.variants import compute_for

FAMILY = get_family("bcq")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def scheduled(spec, knobs):
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    return bcq_rotated.sketch(_tvm.Schedule(mod), spec, HW, knobs)


def cuda_source(mod) -> str:
    lib = _tvm.tvm.compile(mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_rotation_moves_each_chunk_to_its_step(group_size):
    """Byte s of column n's group holds chunk (s + r(n)) % cpg; numpy and torch agree."""
    rng = np.random.default_rng(group_size)
    k, n, cpg = 512, 256, group_size // 8
    planes = rng.integers(0, 1 << 32, size=(2, k // 32, n), dtype=np.uint64)
    planes = planes.astype(np.uint32).view(np.int32)
    moved = bcq_layout.rotate_planes(planes, group_size)
    assert np.array_equal(moved, bcq_layout.rotate_planes(torch.from_numpy(planes),
                                                      group_size).numpy())
    before, after = table_keys(planes, 8), table_keys(moved, 8)        # [q, K / 8, N]
    columns = np.arange(n)
    for g in range(k // group_size):
        for s in range(cpg):
            source = g * cpg + (s + bcq_layout.rotation(columns, cpg)) % cpg
            assert np.array_equal(after[:, g * cpg + s, :], before[:, source, columns])


def test_family_picks_the_rotated_compute_where_it_fits():
    fits = BcqSpec(k=1024, n=512, q=3, group_size=128, mu=8)
    assert compute_name(compute_for(fits, "cuda")) == rotated.COMPUTE_NAME
    for other in (BcqSpec(k=1024, n=512, q=3, group_size=128, mu=4),    # mu
                  BcqSpec(k=1024, n=512, q=3, group_size=128, mu=8, m=2),  # rows
                  BcqSpec(k=1024, n=320, q=3, group_size=128, mu=8),    # N % 128
                  BcqSpec(k=1536, n=512, q=3, group_size=512, mu=8)):   # 64 chunks > 32 slots
        assert rotated.unfit_reason(other) is not None
        assert compute_name(compute_for(other, "cuda")) != rotated.COMPUTE_NAME
    with pytest.raises(SpecError, match="N=320 must be a multiple of 128"):
        rotated.check_spec(BcqSpec(k=1024, n=320, q=3, group_size=128, mu=8))


CASES = [  # (q, group_size, k, n, knobs)
    (3, 128, 512, 256, dict(threads=64, groups_per_block=2)),
    (3, 128, 512, 512, dict(threads=128, groups_per_block=1)),
    (2, 64, 512, 128, dict(threads=32, groups_per_block=4)),
    (4, 256, 512, 256, dict(threads=64, groups_per_block=1)),
    (1, 32, 256, 128, dict(threads=32, groups_per_block=2)),
]


@pytest.mark.parametrize("case", CASES)
def test_emulated_kernels_match_reference(case):
    q, group_size, k, n, knobs = case
    spec = BcqSpec(k=k, n=n, q=q, group_size=group_size, mu=8)
    rng = np.random.default_rng(q * 100 + group_size)
    tensors = FAMILY.example_tensors(spec, rng)
    prepared = FAMILY.prepare(spec, layout=bcq_layout.layout(group_size), **tensors)
    planes, alpha, z = (t.numpy() for t in prepared.tensors)
    x = rng.standard_normal((1, k)).astype(np.float32)
    y = aligned(np.full((1, n), np.nan, dtype=np.float32))
    slices = spec.groups // knobs["groups_per_block"]
    buffers = {"x": aligned(x), "planes": aligned(planes), "alpha": aligned(alpha),
               "z": aligned(z), "y": y,
               "y_rf": aligned(np.full((slices, 1, n), np.nan, np.float32))}
    emulate_all(scheduled(spec, knobs).mod, TARGET, buffers)
    assert not np.isnan(y).any(), "the kernels left outputs unwritten"
    ref = FAMILY.reference(spec, x, **tensors)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-5


def test_heuristic_kernel_at_the_issue_shape():
    """7168x28672, q = 3, g = 128 (issue 5): 128-bit loads of a group's 12 words, 32 KiB of
    tables, lookups at the key's row OR the lane's slot, no spills."""
    spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=8)
    knobs = bcq_rotated.heuristic_knobs(spec, HW)
    assert knobs == {"threads": 256, "groups_per_block": 1}
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    source = cuda_source(bcq_rotated.heuristic_schedule(_tvm.Schedule(mod), spec, HW).mod)
    assert source == cuda_source(scheduled(spec, knobs).mod)
    assert len(re.findall(r'extern "C" __global__ [^;{]*\{', source)) == 2
    assert re.search(r"__shared__ (?:alignas\(\d+\) )?float table_shared_ptr\[8192\]", source)
    assert len(re.findall(r"\*\(int4\*\)\(planes_local_ptr \+ \d+\) = \*\(int4\*\)\(planes_ptr",
                          source)) == 12
    assert re.search(r"<< \(uint\)5\) \| ", source)              # key row | slot
    assert "__syncthreads()" in source
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_untuned_build_records_the_layout_and_prepare_packs_it(tmp_path):
    spec = BcqSpec(k=1024, n=512, q=3, group_size=128, mu=8)
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = read_manifest(result.so_path)
    assert manifest.data["layout"] == bcq_layout.layout(128)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    plain = FAMILY.prepare(spec, **tensors)
    packed = FAMILY.prepare(spec, layout=manifest.data["layout"], **tensors)
    assert packed.extras["layout"] == bcq_layout.layout(128)
    assert np.array_equal(packed.tensors[0].numpy(),
                          bcq_layout.rotate_planes(plain.tensors[0].numpy(), 128))
    relaid = FAMILY.relayout(spec, plain, manifest.data["layout"])
    assert torch.equal(relaid.tensors[0], packed.tensors[0])
    with pytest.raises(FormatError, match="unknown bcq weight layout"):
        FAMILY.prepare(spec, layout={"kind": "rotated_chunks", "chunks": 8, "cols": 4},
                       **tensors)
