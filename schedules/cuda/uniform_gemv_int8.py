"""CUDA schedule of the uniform family's one-row int8 GEMV (compute_cuda_gemv_int8.py).

One kernel per call: the compute rounds x inside, and fixes its thread structure (16 threads
a lane of K, ``k_lanes`` lanes a block, ``cols`` columns a thread), so the space is this one
schedule: a block per ``16 * cols`` columns, lanes on ``threadIdx.y``, a lane's threads on
``threadIdx.x`` (two lanes a warp), the lanes' sums in shared memory, added by the block.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute_cuda_gemv_int8 import check_spec
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import bind_per_thread
from targets.hardware import GpuHardware


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, fixed: dict | None = None,
           prior: dict | None = None) -> Schedule:
    """Bind the compute's loops to the GPU's and add the lanes' sums in shared memory."""
    check_spec(spec)
    bind_per_thread(sch, "lane_gemv", "k_sum")
    return sch


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    return sketch(sch, spec, hw)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    return [sketch(sch, spec, hw)]
