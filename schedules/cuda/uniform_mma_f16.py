"""CUDA schedule of the uniform family's fp16/bf16 tensor-core kernel (compute_cuda_mma_f16.py).

One kernel: a block per 32 columns, its warps (``threadIdx.y``) over the K slices, lanes on
``threadIdx.x``, the slices' sums in shared memory, added and converted to x's dtype by all the
block's threads. The compute fixes the lane structure and the split
(compute_cuda_mma_f16.k_split), so the space is this one schedule: tuning measures it.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute_cuda_mma_f16 import check_spec, partial_scope
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.loops import loops_below
from targets.hardware import GpuHardware


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, fixed: dict | None = None,
           prior: dict | None = None) -> Schedule:
    """The GEMM's lanes bound to threads, the slices' partial sums in shared memory; each warp
    then adds up all the block's sums and converts them to x's dtype (the warps write the same
    values: with the block's M x 32 outputs over the lanes only, no thread is left without
    an output, so no predicate: spread over every thread of the block, a short batch leaves
    threads whose writes TVM maps into the next block's columns)."""
    check_spec(spec)
    gemm = sch.get_sblock("warp_gemm")
    block, warp, lane = sch.get_loops(gemm)
    sch.bind(block, "blockIdx.x")
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.set_scope(gemm, 0, partial_scope(spec))
    k_sum = sch.get_sblock("k_sum")
    sch.reverse_compute_at(k_sum, block, preserve_unit_loops=True)
    fused = sch.fuse(*loops_below(sch, k_sum, block)[:-1])
    _, tx = sch.split(fused, factors=[None, 32])
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(sch.get_sblock("y_out"), tx, preserve_unit_loops=True)
    sch.set_scope(k_sum, 0, "local")
    return sch


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    return sketch(sch, spec, hw)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    return [sketch(sch, spec, hw)]
