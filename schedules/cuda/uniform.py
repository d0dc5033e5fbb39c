"""CUDA design space of the uniform family, over the GPU compute (qcompile/kernels/uniform/
compute_cuda.py: blocks ``scale_x``, ``group_dot``, ``combine``, and ``store`` for 16-bit
dtypes).

One thread layout, :func:`schedules.cuda.common.warp_gemv`: blocks over N; in a block, threads
over N (``threadIdx.y``), over M (``threadIdx.z``) and lanes over K (``threadIdx.x``) whose
partial sums meet in a warp-shuffle reduction (the split-K). A thread owns ``n_vecs * 4``
columns (the output rows of W^T, "rows per thread"): each packed row of its columns arrives in
``n_vecs`` 128-bit loads (4 int32 words; ``ld.global.nc.v4``), ``load_words`` rows of a group
at a time so that several loads are in flight before the first decode; every code is decoded
once and used for the thread's M / m_lanes activation rows from registers.

Knobs (categorical decisions; the candidates are filtered to divide the loops they split):

============  ===========================================  =================================
knob          TensorIR loop                                candidates
============  ===========================================  =================================
k_lanes       ``combine`` g -> (groups per lane, lanes);   1, 2, 4, ... 32 dividing G
              lanes bound to threadIdx.x, rfactor +
              warp-shuffle reduction (split-K)
n_lanes       ``combine`` n -> threadIdx.y                  1, 2, 4, ... 256
n_vecs        columns per thread / 4 (unrolled)            1, 2
m_lanes       ``combine`` m -> threadIdx.z                  1, 2, 4 dividing M
load_words    ``group_dot`` words of a group loaded        1, 2, 4, 8 dividing the group's
              together (unrolled 128-bit loads)            packed words
unroll        ``pragma_auto_unroll_max_step`` on the       0, 64, 512
              words loop (unroll explicit)
============  ===========================================  =================================

Sketches (structural choices a trace cannot switch; one design space each):

``x_block``
    ``scale_x`` staged in shared memory once per block (M x K floats, all threads, 128-bit
    copies, one barrier). Only when it fits the block's shared memory.
``x_chunk``
    ``scale_x`` staged per step of the group loop: the ``k_lanes`` groups of that step (M x
    k_lanes x group_size floats; two barriers per step).
``x_registers``
    no shared memory: each thread loads the x of its ``load_words`` rows into registers
    (128-bit loads through L1) and scales them itself.

Invalid combinations (over 1024 threads, over the shared-memory limit, too many registers) are
rejected by MetaSchedule's ``VerifyGPUCode`` before they are built.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute import fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import (
    VECTOR_BYTES,
    WarpLanes,
    load_to_registers,
    stage_in_shared,
    unroll,
    warp_gemv,
)
from schedules.knobs import choose
from targets.hardware import GpuHardware

K_LANES = (1, 2, 4, 8, 16, 32)
N_LANES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
N_VECS = (1, 2)
M_LANES = (1, 2, 4)
LOAD_WORDS = (1, 2, 4, 8)
UNROLL = (0, 64, 512)

#: Packed rows of K per load unit: one int32 word of codes (32 for the 3-word 3-bit block).
_WORD_BYTES = 4


def vector_width(spec: UniformSpec) -> int:
    """Columns per vector load: 4 int32 words (128 bits) when N allows, else 2 or 1."""
    for width in (VECTOR_BYTES // _WORD_BYTES, 2):
        if spec.n % width == 0:
            return width
    return 1


def packed_units_per_group(spec: UniformSpec) -> int:
    """Load units (words; 3-word blocks for 3 bits) per group and column."""
    return spec.effective_group_size // fields_per_word(spec.bits)


def knob_candidates(spec: UniformSpec) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``: each divides the loop it splits."""
    vec = vector_width(spec)
    n_vectors = spec.n // vec
    n_vecs = [v for v in N_VECS if n_vectors % v == 0]
    units = packed_units_per_group(spec)
    return {
        "k_lanes": [v for v in K_LANES if spec.groups % v == 0],
        "n_lanes": [v for v in N_LANES if n_vectors % (v * max(n_vecs)) == 0],
        "n_vecs": n_vecs,
        "m_lanes": [v for v in M_LANES if spec.m % v == 0],
        "load_words": [v for v in LOAD_WORDS if units % v == 0],
        "unroll": list(UNROLL),
    }


def x_block_fits(spec: UniformSpec, hw: GpuHardware) -> bool:
    """Whether all of x (M x K float32) fits one block's shared memory."""
    return spec.m * spec.k * 4 <= hw.shared_memory_per_block_bytes


def _lanes(sch: Schedule, spec: UniformSpec, fixed: dict | None) -> tuple[WarpLanes, dict]:
    cands = knob_candidates(spec)
    rv = {name: choose(sch, name, cands[name], fixed)
          for name in ("k_lanes", "n_lanes", "n_vecs", "m_lanes", "load_words", "unroll")}
    lanes = WarpLanes(m_lanes=rv["m_lanes"], n_lanes=rv["n_lanes"], k_lanes=rv["k_lanes"],
                      n_vecs=rv["n_vecs"], vec=vector_width(spec))
    return lanes, rv


def _sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, x_stage: str,
            fixed: dict | None) -> Schedule:
    lanes, rv = _lanes(sch, spec, fixed)
    vec = lanes.vec
    combine = sch.get_sblock("combine")
    layout = warp_gemv(sch, combine, lanes)

    if spec.dtype != "float32":
        # combine accumulates in float32 registers; the cast to the output dtype happens as the
        # reduced value is written.
        sch.set_scope(combine, 0, "local")
        sch.reverse_compute_at(sch.get_sblock("store"), sch.get_loops(combine)[-2],
                               preserve_unit_loops=True)

    # One group of one lane: its packed words stream through registers, decoded once each.
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, layout.group_loop, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_n, d_r = sch.get_loops(dot)
    d_nv, d_ne = sch.split(d_n, factors=[lanes.n_vecs, vec])
    words, batch, fields = sch.split(d_r, factors=[None, rv["load_words"],
                                                   fields_per_word(spec.bits)])
    sch.reorder(words, batch, fields, d_nv, d_ne, d_m)
    unroll(sch, batch, fields, d_nv, d_ne, d_m)
    load_to_registers(sch, dot, "qweight", words, vec)
    load_to_registers(sch, dot, "zeros", layout.group_loop, vec)
    load_to_registers(sch, layout.partial, "scales", layout.group_loop, vec)
    sch.annotate(words, "pragma_auto_unroll_max_step", rv["unroll"])
    sch.annotate(words, "pragma_unroll_explicit", 1)

    scale_x = sch.get_sblock("scale_x")
    threads = [("threadIdx.z", lanes.m_lanes), ("threadIdx.y", lanes.n_lanes),
               ("threadIdx.x", lanes.k_lanes)]
    x_vec = 4 if spec.k % 4 == 0 else 1
    if x_stage == "x_block":
        stage_in_shared(sch, scale_x, layout.block_loop, threads, x_vec)
    elif x_stage == "x_chunk":
        stage_in_shared(sch, scale_x, layout.group_loop, threads, x_vec)
    elif x_stage == "x_registers":
        sch.set_scope(scale_x, 0, "local")
        sch.compute_at(scale_x, words, preserve_unit_loops=True)
        *_, x_m, x_k = sch.get_loops(scale_x)
        x_k, x_e = sch.split(x_k, factors=[None, x_vec])
        sch.vectorize(x_e)
        unroll(sch, x_m, x_k)
    else:
        raise ValueError(f"unknown x staging {x_stage!r}; known: {', '.join(SKETCHES)}")

    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(layout.partial, layout.group_loop)
    return sch


def x_block(sch: Schedule, spec: UniformSpec, hw: GpuHardware,
            fixed: dict | None = None) -> Schedule:
    """Sketch: x staged in shared memory once per block."""
    return _sketch(sch, spec, hw, "x_block", fixed)


def x_chunk(sch: Schedule, spec: UniformSpec, hw: GpuHardware,
            fixed: dict | None = None) -> Schedule:
    """Sketch: x staged in shared memory per step of the group loop."""
    return _sketch(sch, spec, hw, "x_chunk", fixed)


def x_registers(sch: Schedule, spec: UniformSpec, hw: GpuHardware,
                fixed: dict | None = None) -> Schedule:
    """Sketch: each thread loads and scales its own x into registers."""
    return _sketch(sch, spec, hw, "x_registers", fixed)


SKETCHES = {"x_block": x_block, "x_chunk": x_chunk, "x_registers": x_registers}


def sketches_for(spec: UniformSpec, hw: GpuHardware) -> list:
    """The sketches that can be valid for ``spec`` on ``hw`` (x_block only when x fits)."""
    return [fn for name, fn in SKETCHES.items() if name != "x_block" or x_block_fits(spec, hw)]


def heuristic_knobs(spec: UniformSpec, hw: GpuHardware) -> tuple[str, dict[str, int]]:
    """A sketch and knob values that are valid and reasonable without tuning (build_untuned).

    128-thread blocks; K lanes raised until the grid has 512 threads per SM (a quarter of what
    an SM holds: enough loads in flight with ``load_words`` 128-bit loads each), or the lanes
    run out; rows split over more thread groups past M = 4 to keep the accumulators in
    registers.
    """
    cands = knob_candidates(spec)
    n_vecs = 1
    columns = spec.n // (vector_width(spec) * n_vecs)
    for k_lanes in cands["k_lanes"]:
        if columns * k_lanes >= hw.sm_count * 512:
            break
    n_lanes = max([v for v in cands["n_lanes"] if v * k_lanes <= 128] or [cands["n_lanes"][0]])
    m_lanes = max(v for v in cands["m_lanes"] if v <= max(1, spec.m // 4))
    knobs = {"k_lanes": k_lanes, "n_lanes": n_lanes, "n_vecs": n_vecs, "m_lanes": m_lanes,
             "load_words": max(v for v in cands["load_words"] if v <= 8), "unroll": 64}
    if x_block_fits(spec, hw):
        return "x_block", knobs
    chunk = spec.m * k_lanes * spec.effective_group_size * 4
    return ("x_chunk" if chunk <= hw.shared_memory_per_block_bytes else "x_registers"), knobs


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs` (a valid kernel without tuning)."""
    sketch, knobs = heuristic_knobs(spec, hw)
    return SKETCHES[sketch](sch, spec, hw, knobs)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    """Every applicable sketch on a copy of ``sch``, its knobs left as sampled decisions."""
    return [sketch(sch.copy(), spec, hw) for sketch in sketches_for(spec, hw)]
