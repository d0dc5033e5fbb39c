"""CUDA schedule of the uniform family's tensor-core kernel (compute_cuda_mma.py).

Two kernels per call: the dp4a space's quantize-x kernel (schedules/cuda/uniform_int8.py), its
outputs stored in the layouts the GEMM reads (:func:`fragment_layouts`), then the GEMM, whose
lane structure the compute fixes: a block per 32 columns, its warps (``threadIdx.y``) over the
K slices, lanes on ``threadIdx.x``, the slices' sums in shared memory, added by the block. The
compute also fixes the split (compute_cuda_mma.k_split), so the space is this one schedule:
tuning measures it, nothing is sampled.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute_cuda_mma import check_spec
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import bind_per_thread
from schedules.cuda.uniform_int8 import quantize_x
from targets.hardware import GpuHardware


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, fixed: dict | None = None,
           prior: dict | None = None) -> Schedule:
    """The quantize-x kernel, then the GEMM: a block per 32 columns, its warps
    (``threadIdx.y``) over the K slices, their partial sums in shared memory, added by all of
    the block's threads."""
    check_spec(spec)
    sch.compute_inline(sch.get_sblock("x_rows"))
    fragment_layouts(sch)
    quantize_x(sch, spec)
    bind_per_thread(sch, "warp_gemm", "k_sum")
    return sch


def fragment_layouts(sch: Schedule) -> None:
    """Store the quantized x (16 rows) as the GEMM reads it: ``xq_words`` [16, K/4] in fragment
    order [K/32, 32 lanes, 4 registers] (a lane's 4 registers one 128-bit load, a warp's load
    512 contiguous bytes where rows of x are 8 wavefronts), and x's group steps and sums
    [16, G] as [G, 8, 2] (rows r and r + 8, which a lane reads, together)."""
    sch.transform_layout(sch.get_sblock("x_pack"), ("write", 0), lambda m, w: (
        w // 8, (m % 8) * 4 + w % 4, m // 8 + 2 * (w % 8 // 4)))
    for block in ("x_step", "x_qsum"):
        sch.transform_layout(sch.get_sblock(block), ("write", 0), lambda m, g: (g, m % 8, m // 8))


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    return sketch(sch, spec, hw)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    return [sketch(sch, spec, hw)]
