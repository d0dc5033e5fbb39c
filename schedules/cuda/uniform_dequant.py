"""CUDA design space of the uniform family's ``dequant`` form, for several activation rows
(qcompile/kernels/uniform/compute_cuda.py, :func:`~qcompile.kernels.uniform.compute_cuda.cuda_form`:
blocks ``scale_x``, ``dequant``, ``gemm``, ``store``).

The thread layout is the ``+k_warps`` one of schedules/cuda/uniform.py (:func:`warp_gemv` with
:data:`K_IN_WARPS`): a warp's threads over N with 128-bit loads of ``vec`` columns, ``k_lanes``
warps over whole groups, ``m_lanes`` thread groups over M, the K lanes meeting through shared
memory once per output. What differs is the arithmetic under a lane's group loop:

- the group's zero-points and scales come into registers once per group;
- per ``load_words`` packed rows (128-bit loads, all in flight before the first decode), each
  code is decoded and scaled once (``dequant``: one field of the thread's columns at a time,
  in registers) and then used by the thread's M / m_lanes rows;
- y accumulates directly (no per-group dot products), so a thread holds one accumulator per
  row and column instead of two.

x (already multiplied by the field factors) is staged in shared memory, per group step of
every lane (``x_chunk``) or for the whole K once per block (``x_block``), and read back with
broadcast loads: every thread of a warp reads the same x.

Knobs are uniform.py's (:func:`schedules.cuda.uniform.knob_candidates`): k_lanes, n_lanes,
n_vecs, m_lanes, load_words, unroll.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute import fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import (
    K_IN_WARPS,
    WarpLanes,
    load_to_registers,
    stage_in_shared,
    unroll,
    warp_gemv,
)
from schedules.loops import loops_below
from targets.hardware import GpuHardware

#: Sketches of this form: where x is staged (both with K lanes across warps).
X_STAGES = ("x_chunk+k_warps", "x_block+k_warps")


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, x_stage: str, lanes: WarpLanes,
           rv: dict) -> Schedule:
    """The ``dequant`` form's schedule with x staged per ``x_stage`` (:data:`X_STAGES`) and
    the thread layout ``lanes`` (``rv``: the sampled knobs, for load_words and unroll)."""
    if x_stage not in X_STAGES:
        raise ValueError(f"the dequant form stages x in shared memory: {X_STAGES}; "
                         f"got {x_stage!r}")
    gemm = sch.get_sblock("gemm")
    _, _, k = sch.get_loops(gemm)
    _, r = sch.split(k, factors=[None, spec.effective_group_size])
    sch.split(r, factors=[None, rv["load_words"], fields_per_word(spec.bits)])
    layout = warp_gemv(sch, gemm, lanes, K_IN_WARPS)
    words, batch, fields = layout.inner
    unroll(sch, batch, fields)
    sch.annotate(words, "pragma_auto_unroll_max_step", rv["unroll"])
    sch.annotate(words, "pragma_unroll_explicit", 1)

    # The sums meet in float32 registers; the cast (a copy for float32) as they are written.
    sch.set_scope(layout.final, 0, "local")
    sch.reverse_compute_at(sch.get_sblock("store"), sch.get_loops(layout.final)[-2],
                           preserve_unit_loops=True)

    # One packed row's codes decoded and scaled at a time, from registers loaded per batch.
    dequant = sch.get_sblock("dequant")
    sch.compute_at(dequant, fields, preserve_unit_loops=True)
    sch.set_scope(dequant, 0, "local")
    unroll(sch, *loops_below(sch, dequant, fields))
    load_to_registers(sch, dequant, "qweight", words, lanes.vec)
    load_to_registers(sch, dequant, "zeros", layout.group_loop, lanes.vec)
    load_to_registers(sch, dequant, "scales", layout.group_loop, lanes.vec)
    sch.decompose_reduction(layout.partial, layout.group_loop)

    axes = dict(zip(K_IN_WARPS, (lanes.m_lanes, lanes.n_lanes, lanes.k_lanes), strict=True))
    threads = [(tag, axes[tag]) for tag in ("threadIdx.z", "threadIdx.y", "threadIdx.x")]
    x_vec = 4 if spec.k % 4 == 0 else 1
    where = layout.group_loop if x_stage == "x_chunk+k_warps" else layout.block_loop
    stage_in_shared(sch, sch.get_sblock("scale_x"), where, threads, x_vec)
    return sch


def sketches_for(spec: UniformSpec, hw: GpuHardware) -> list[str]:
    """The sketches that can be valid for ``spec`` on ``hw`` (x_block only where all of x fits
    a block's shared memory)."""
    names = ["x_chunk+k_warps"]
    if spec.m * spec.k * 4 <= hw.shared_memory_per_block_bytes:
        names.append("x_block+k_warps")
    return names


#: Most threads per block of the heuristic (8 warps).
HEURISTIC_BLOCK_THREADS = 256
#: Activation rows per thread, at most: 8 rows x 4 columns of accumulators leave registers for
#: the weights in flight and the decoded field.
HEURISTIC_ROWS = 8
#: Threads of a warp over N: 4 up to 4 rows per thread, else 16 (H200 sweep, 2026-11-23, best
#: of 24 points per shape: M = 4 at k_lanes 16 x n_lanes 4 on three of the four shapes of
#: tools/bench_cuda.py, M = 16 at 4 x 16 with 8 rows per thread on three of four).
HEURISTIC_N_LANES = {4: 4, 8: 16}
#: Shared memory for x per group step (M x k_lanes groups of float32), so that several blocks
#: share an SM.
HEURISTIC_CHUNK_BYTES = 32 * 1024
#: Packed rows in flight per thread (128-bit loads) at 4 and 8 bits.
HEURISTIC_LOAD_WORDS = 4


def heuristic_knobs(spec: UniformSpec, hw: GpuHardware,
                    cands: dict[str, list[int]]) -> tuple[str, dict[str, int]]:
    """A valid, reasonable point of this form without tuning: the fewest thread groups over M
    that leave at most :data:`HEURISTIC_ROWS` rows per thread; :data:`HEURISTIC_N_LANES`
    threads over N; as many K lanes as a block of :data:`HEURISTIC_BLOCK_THREADS` and
    :data:`HEURISTIC_CHUNK_BYTES` of staged x allow; :data:`HEURISTIC_LOAD_WORDS` loads in
    flight (as many codes at 2 bits; one 3-word unit at 3)."""
    m_lanes = min([v for v in cands["m_lanes"] if spec.m // v <= HEURISTIC_ROWS]
                  or [max(cands["m_lanes"])])
    rows = spec.m // m_lanes
    wanted = HEURISTIC_N_LANES[4] if rows <= 4 else HEURISTIC_N_LANES[8]
    n_lanes = max([v for v in cands["n_lanes"] if v <= wanted] or [cands["n_lanes"][0]])
    chunk = spec.m * spec.effective_group_size * 4
    k_lanes = max([v for v in cands["k_lanes"]
                   if v * n_lanes * m_lanes <= HEURISTIC_BLOCK_THREADS
                   and v * chunk <= HEURISTIC_CHUNK_BYTES] or [1])
    most = {2: HEURISTIC_LOAD_WORDS // 2, 3: 1}.get(spec.bits, HEURISTIC_LOAD_WORDS)
    load_words = max([v for v in cands["load_words"] if v <= most] or [1])
    return "x_chunk+k_warps", {"k_lanes": k_lanes, "n_lanes": n_lanes, "n_vecs": 1,
                               "m_lanes": m_lanes, "load_words": load_words, "unroll": 64}
