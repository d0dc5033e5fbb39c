"""CUDA schedule of the uniform family's fp16/bf16 tensor-core kernel (compute_cuda_mma_f16.py).

One kernel: a block per 32 columns, its warps (``threadIdx.y``) over the K slices, lanes on
``threadIdx.x``, the slices' sums in shared memory, added and converted to x's dtype by all the
block's threads. The compute fixes the lane structure and the split
(compute_cuda_mma_f16.k_split), so the space is this one schedule: tuning measures it.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute_cuda_mma_f16 import check_spec
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import bind_per_thread
from targets.hardware import GpuHardware


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, fixed: dict | None = None,
           prior: dict | None = None) -> Schedule:
    """The GEMM's lanes bound to threads, the slices' sums added in the same thread block, each
    thread converting the sums it added."""
    check_spec(spec)
    bind_per_thread(sch, "warp_gemm", "k_sum")
    k_sum = sch.get_sblock("k_sum")
    *_, thread, _ = sch.get_loops(k_sum)
    sch.reverse_compute_at(sch.get_sblock("y_out"), thread, preserve_unit_loops=True)
    sch.set_scope(k_sum, 0, "local")
    return sch


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    return sketch(sch, spec, hw)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    return [sketch(sch, spec, hw)]
