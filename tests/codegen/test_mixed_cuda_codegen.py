"""CUDA kernels of the mixed family, built here without a GPU: the design space (both
dequantization orders), the generated CUDA C's structure (128-bit weight loads, warp-shuffle
reductions, one launch, the async order's double-buffered next-group words and scales), and the
numbers on the CPU emulator against the float64 reference, output poisoned first."""

import re

import numpy as np
import pytest

import targets
from qcompile import _tvm
from qcompile.kernels import MixedSpec, get_family
from qcompile.testing.cuda_emulator import aligned, emulate, ptxas_report
from schedules import get_design_space
from schedules.cuda import mixed as cuda_mixed
from schedules.variants import compute_for

FAMILY = get_family("mixed")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())
KNOBS = {"k_lanes": 4, "n_lanes": 8, "load_groups": 1, "unroll": 64}
WARPS = {"k_lanes": 4, "n_lanes": 8, "load_groups": 4, "unroll": 64}


def schedule(spec, order, knobs=KNOBS):
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    return cuda_mixed.sketch(_tvm.Schedule(mod), spec, HW, order, knobs)


def cuda_source(sch) -> str:
    lib = _tvm.tvm.compile(sch.mod, target=TARGET)
    devices = [m for m in lib.mod.imports if m.kind == "cuda"]
    assert len(devices) == 1
    return devices[0].inspect_source()


@pytest.mark.parametrize(("spec", "knobs", "order"), [
    (MixedSpec(k=1024, n=256, g4=64, outlier_share=0.01), KNOBS, "sync"),
    (MixedSpec(k=1024, n=256, g4=64, outlier_share=0.01), KNOBS, "async"),
    # M = 3 at K = 512: each lane's K loop is unrolled, and at K = 1024 the emulator's C++
    # (2.4 MB) took g++ about a minute per case; 512 halves it and still pipelines many groups.
    (MixedSpec(k=512, n=256, m=3, g4=64),
     {"k_lanes": 2, "n_lanes": 16, "load_groups": 2, "unroll": 0}, "async"),
    (MixedSpec(k=2048, n=128, g1=32, g2=8, g4=128, outlier_share=0.0),
     {"k_lanes": 4, "n_lanes": 4, "load_groups": 1, "unroll": 512}, "sync"),
    (MixedSpec(k=1024, n=256, outlier_share=0.01), WARPS, "sync+k_warps"),
    (MixedSpec(k=1024, n=256, outlier_share=0.01), WARPS, "async+k_warps"),
    (MixedSpec(k=512, n=256, m=3, g4=64),
     {"k_lanes": 2, "n_lanes": 16, "load_groups": 2, "unroll": 0}, "async+k_warps"),
    (MixedSpec(k=2048, n=128, g1=32, g2=8, g4=128, outlier_share=0.0),
     {"k_lanes": 4, "n_lanes": 8, "load_groups": 2, "unroll": 512}, "sync+k_warps"),
], ids=["gemv-1pct-sync", "gemv-1pct-async", "m3-async", "g32-no-outliers-sync",
        "warps-gemv-1pct-sync", "warps-gemv-1pct-async", "warps-m3-async",
        "warps-g32-no-outliers-sync"])
def test_emulated_kernel_matches_reference(spec, knobs, order):
    sch = schedule(spec, order, knobs)
    rng = np.random.default_rng(spec.k + spec.m)
    tensors = FAMILY.example_tensors(spec, rng)
    operands = [aligned(t.numpy()) for t in FAMILY.prepare(spec, **tensors).tensors]
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    y = aligned(np.full((spec.m, spec.n), np.nan, dtype=np.float32))
    kernel = emulate(sch.mod, TARGET)
    kernel(x=aligned(x), **dict(zip(spec.layout.shapes(), operands, strict=True)), y=y)
    assert not np.isnan(y).any(), "the kernel left outputs unwritten"
    reference = FAMILY.reference(spec, x, **tensors)
    assert np.abs(y - reference).max() / np.abs(reference).max() < 1e-5


def test_generated_code_has_the_promised_structure():
    spec = MixedSpec(k=1024, n=256, g4=64)
    sync, async_ = (cuda_source(schedule(spec, order)) for order in ("sync", "async"))
    for source in (sync, async_):
        kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(",
                                 source))
        assert len(kernels) == 1, f"one launch for both parts and outliers; got {kernels}"
        assert "*(int4*)(codes2_local_ptr" in source and "*(int4*)(codes4_local_ptr" in source
        assert source.count("__shfl_down_sync(mask") >= 4  # both parts' lane reductions
        assert "row_ptr_ptr" in source and "values_ptr" in source
    # async: next group's words and scales in a second register buffer; sync: none
    assert "int codes2_local_ptr[8]" in async_ and "float s1_local_ptr[8]" in async_
    assert "int codes2_local_ptr[4]" in sync and "s1_local_ptr" not in sync


def test_design_space_offers_both_orders_with_valid_knobs():
    spec = MixedSpec(k=8192, n=28672)
    cands = cuda_mixed.knob_candidates(spec)
    assert cands["k_lanes"] == [1, 2, 4, 8, 16, 32]  # 384 2-bit groups, 32 4-bit scale groups
    assert max(cands["n_lanes"]) == 256
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    spaces = get_design_space(spec, "cuda")(_tvm.Schedule(mod, seed=3), spec, HW)
    assert len(spaces) == len(cuda_mixed.SKETCHES) == 4  # 2 orders x 2 K-lane layouts
    for sch in spaces:
        names = [inst.kind.name for inst in sch.trace.insts]
        assert names.count("SampleCategorical") == 4


def test_k_warps_layout_reads_whole_rows_per_warp():
    """``+k_warps``: threadIdx.x over N (a warp's 128-bit loads cover adjacent columns of one
    packed row), the K lanes on threadIdx.y meet through shared memory, ``load_groups`` 2-bit
    groups' words requested before the first decode (async: double-buffered, in registers)."""
    spec = MixedSpec(k=1024, n=256, g4=64)
    for order in cuda_mixed.ORDERS:
        source = cuda_source(schedule(spec, order + cuda_mixed.K_WARPS, WARPS))
        loads = re.findall(r"\*\(int4\*\)\(codes2_ptr \+ ([^;]*)\);", source)
        assert loads and all("((int)threadIdx.x) * 4)" in load for load in loads)
        assert "red_buf" in source  # the cross-warp reduction in shared memory
        buffered = 2 if order == "async" else 1
        assert f"int codes2_local_ptr[{4 * 4 * buffered}]" in source
        assert "local_ptr[((" not in source  # no register array indexed by a variable


def test_heuristic_fills_the_sms_with_k_warps():
    """At the H200 shape: 128 contiguous bytes per warp and row, 4 groups' words in flight;
    sync: 896 blocks of 128 threads, all resident at once (one wave); async: 256 threads (3
    pipeline steps per lane). Both within the planned registers (ptxas, where nvcc is)."""
    spec = MixedSpec(k=8192, n=28672)
    expected = {"sync": 16, "async": 32}
    for order in cuda_mixed.ORDERS:
        name, knobs = cuda_mixed.heuristic_knobs(spec, HW, order)
        assert name == order + cuda_mixed.K_WARPS
        assert knobs == {"k_lanes": expected[order], "n_lanes": 8, "load_groups": 4,
                         "unroll": 64}
        blocks = spec.n // cuda_mixed.vector_width(spec) // knobs["n_lanes"]
        assert blocks == 896 >= 4 * HW.sm_count
    sync = cuda_mixed.heuristic_knobs(spec, HW)[1]
    threads = sync["k_lanes"] * sync["n_lanes"]
    per_sm = -(-896 // HW.sm_count)
    assert per_sm * threads * cuda_mixed.HEURISTIC_REGISTERS <= HW.registers_per_block


def test_heuristic_registers_leave_half_occupancy():
    report = ptxas_report(cuda_source(cuda_mixed.heuristic_schedule(
        _tvm.Schedule(_tvm.normalize_mod(compute_for(MixedSpec(k=8192, n=28672),
                                                            "cuda"))),
        MixedSpec(k=8192, n=28672), HW)))
    if report is None:
        pytest.skip("no nvcc")
    assert report["registers"] <= cuda_mixed.HEURISTIC_REGISTERS
    assert report["spill_stores"] == report["stack_bytes"] == 0


@pytest.mark.parametrize("order", cuda_mixed.ORDERS)
def test_h200_heuristic_knobs_emulated_at_full_k(order):
    """The untuned knobs of 8192 x 28672 (either order), at its K with a small N."""
    name, knobs = cuda_mixed.heuristic_knobs(MixedSpec(k=8192, n=28672), HW, order)
    spec = MixedSpec(k=8192, n=256)
    rng = np.random.default_rng(1)
    tensors = FAMILY.example_tensors(spec, rng)
    operands = [aligned(t.numpy()) for t in FAMILY.prepare(spec, **tensors).tensors]
    x = rng.standard_normal((1, spec.k)).astype(np.float32)
    y = aligned(np.full((1, spec.n), np.nan, dtype=np.float32))
    emulate(schedule(spec, name, knobs).mod, TARGET)(
        x=aligned(x), **dict(zip(spec.layout.shapes(), operands, strict=True)), y=y)
    reference = FAMILY.reference(spec, x, **tensors)
    assert np.abs(y - reference).max() / np.abs(reference).max() < 1e-5
