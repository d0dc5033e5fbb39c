"""CUDA design space of the uniform family, over the GPU compute (qcompile/kernels/uniform/
compute_cuda.py: blocks ``scale_x``, ``group_dot``, ``combine``, and ``store`` for 16-bit
dtypes).

Blocks run over N; in a block, threads over N (``threadIdx.y``), over M (``threadIdx.z``) and
``k_lanes`` lanes over K (``threadIdx.x``, within one warp) whose partial sums meet in a
warp-shuffle reduction: the split-K. A thread owns ``n_vecs * 4`` columns (output rows of W^T:
"rows per thread"); each packed row of its columns arrives in ``n_vecs`` 128-bit loads (4 int32
words, ``ld.global.nc.v4``), ``load_words`` rows at a time so that several loads are in flight
before the first decode; every code is decoded once and used for the thread's M / m_lanes
activation rows from registers.

Two layouts of the K lanes:

``group_lanes`` (:func:`schedules.cuda.common.warp_gemv`)
    lane t takes groups t, t + k_lanes, ...: each group's dot product and scale stay inside one
    thread, and the lanes meet once, at the end. Needs G >= k_lanes: the layout for g = 32..128.
``word_lanes``
    the lanes split each group's packed words and meet once per group (an rfactor of
    ``group_dot``); every lane then applies the scale and accumulates y. For few groups (G < 8:
    one group per column with g = -1), where ``group_lanes`` has no lanes to give.

Knobs (categorical decisions; candidates are filtered to divide the loops they split):

============  ===========================================  =================================
knob          TensorIR loop                                candidates
============  ===========================================  =================================
k_lanes       group_lanes: ``combine`` g -> (groups per    1, 2, 4, ... 32 dividing G
              lane, lanes), rfactor, shuffle reduction     (group_lanes), or the group's
              word_lanes: ``group_dot`` r -> (steps,       packed words (word_lanes)
              lanes, load_words, fields), rfactor
n_lanes       ``combine`` n -> threadIdx.y                  1, 2, 4, ... 256
n_vecs        columns per thread / 4 (unrolled)            1, 2
m_lanes       ``combine`` m -> threadIdx.z                  1, 2, 4 dividing M
load_words    ``group_dot`` packed rows loaded together    1, 2, 4, 8 dividing the group's
              (unrolled 128-bit loads)                     packed words (word_lanes: over
                                                           the largest k_lanes)
unroll        ``pragma_auto_unroll_max_step`` on the       0, 64, 512
              words loop (unroll explicit)
============  ===========================================  =================================

Sketches (structural choices a trace cannot switch; one design space each), a layout and where
``scale_x`` (x times the field factors) lives:

``x_block``
    shared memory, computed once per block (M x K floats, all threads, 128-bit copies, one
    barrier). Only when it fits the block's shared memory.
``x_chunk`` (group_lanes only)
    shared memory, per step of the group loop: the ``k_lanes`` groups of that step (M x k_lanes
    x group_size floats; two barriers per step).
``x_registers``
    registers: each thread loads the x of its ``load_words`` rows (128-bit loads through L1)
    and scales them itself.

Invalid combinations (over 1024 threads, over the shared-memory limit, too many registers) are
rejected by MetaSchedule's ``VerifyGPUCode`` before they are built.
"""

from __future__ import annotations

from functools import partial

from qcompile._tvm import Schedule
from qcompile.kernels.tir.codes import fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import (
    K_IN_LANES,
    K_IN_WARPS,
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

#: Fewer groups than this and the K lanes split each group's words instead.
WORD_LANES_BELOW_GROUPS = 8

_KNOBS = ("k_lanes", "n_lanes", "n_vecs", "m_lanes", "load_words", "unroll")
_WORD_BYTES = 4


def vector_width(spec: UniformSpec) -> int:
    """Columns per vector load: 4 int32 words (128 bits) when N allows, else 2 or 1."""
    for width in (VECTOR_BYTES // _WORD_BYTES, 2):
        if spec.n % width == 0:
            return width
    return 1


def packed_units_per_group(spec: UniformSpec) -> int:
    """Load units (int32 words; 3-word blocks for 3 bits) per group and column."""
    return spec.effective_group_size // fields_per_word(spec.bits)


def layout_for(spec: UniformSpec) -> str:
    """``group_lanes`` when there are groups enough for the K lanes, else ``word_lanes``."""
    return "group_lanes" if spec.groups >= WORD_LANES_BELOW_GROUPS else "word_lanes"


def knob_candidates(spec: UniformSpec) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec`` (in its layout): each divides the loop it splits."""
    vec = vector_width(spec)
    n_vectors = spec.n // vec
    n_vecs = [v for v in N_VECS if n_vectors % v == 0]
    units = packed_units_per_group(spec)
    if layout_for(spec) == "group_lanes":
        k_lanes = [v for v in K_LANES if spec.groups % v == 0]
        load_words = [v for v in LOAD_WORDS if units % v == 0]
    else:  # lanes and batches share a group's words: every pair must divide them
        k_lanes = [v for v in K_LANES if units % v == 0]
        load_words = [v for v in LOAD_WORDS if units % (v * max(k_lanes)) == 0]
    return {
        "k_lanes": k_lanes,
        "n_lanes": [v for v in N_LANES if n_vectors % (v * max(n_vecs)) == 0],
        "n_vecs": n_vecs,
        "m_lanes": [v for v in M_LANES if spec.m % v == 0],
        "load_words": load_words,
        "unroll": list(UNROLL),
    }


def x_block_fits(spec: UniformSpec, hw: GpuHardware) -> bool:
    """Whether all of x (M x K float32) fits one block's shared memory."""
    return spec.m * spec.k * 4 <= hw.shared_memory_per_block_bytes


def _sample(sch: Schedule, spec: UniformSpec, fixed: dict | None,
            prior: dict | None = None) -> tuple[WarpLanes, dict]:
    cands = knob_candidates(spec)
    rv = {name: choose(sch, name, cands[name], fixed, prior) for name in _KNOBS}
    lanes = WarpLanes(m_lanes=rv["m_lanes"], n_lanes=rv["n_lanes"], k_lanes=rv["k_lanes"],
                      n_vecs=rv["n_vecs"], vec=vector_width(spec))
    return lanes, rv


def stream_words(sch: Schedule, block, loops, lanes: WarpLanes, rv: dict) -> None:
    """One lane's words loop: inside it the load batch, fields, columns and rows, unrolled;
    the packed words come in with 128-bit loads, ``load_words`` rows at a time.

    ``loops`` are the block's (words, batch, fields, columns, rows) loops (the int8 space's
    dp4a steps are its fields).
    """
    words, batch, fields, cols, m_loop = loops
    nv, ne = sch.split(cols, factors=[lanes.n_vecs, lanes.vec])
    sch.reorder(words, batch, fields, nv, ne, m_loop)
    unroll(sch, batch, fields, nv, ne, m_loop)
    load_to_registers(sch, block, "qweight", words, lanes.vec)
    sch.annotate(words, "pragma_auto_unroll_max_step", rv["unroll"])
    sch.annotate(words, "pragma_unroll_explicit", 1)


def _group_lanes(sch: Schedule, spec: UniformSpec, lanes: WarpLanes, rv: dict,
                 axes=K_IN_LANES):
    """Layout ``group_lanes`` (K lanes on the thread axes ``axes``); returns (block loop,
    group loop, the block reading x, words loop)."""
    combine = sch.get_sblock("combine")
    layout = warp_gemv(sch, combine, lanes, axes)
    if spec.dtype != "float32":
        # combine accumulates in float32 registers; the cast happens as the sum is written.
        sch.set_scope(combine, 0, "local")
        sch.reverse_compute_at(sch.get_sblock("store"), sch.get_loops(combine)[-2],
                               preserve_unit_loops=True)
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, layout.group_loop, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_n, d_r = sch.get_loops(dot)
    sch.reorder(d_g, d_m)                # the group (one iteration here) outside the rows
    words, batch, fields = sch.split(d_r, factors=[None, rv["load_words"],
                                                   fields_per_word(spec.bits)])
    stream_words(sch, dot, (words, batch, fields, d_n, d_m), lanes, rv)
    load_to_registers(sch, dot, "zeros", layout.group_loop, lanes.vec)
    load_to_registers(sch, layout.partial, "scales", layout.group_loop, lanes.vec)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(layout.partial, layout.group_loop)
    return layout.block_loop, layout.group_loop, dot, words


def _word_lanes(sch: Schedule, spec: UniformSpec, lanes: WarpLanes, rv: dict):
    """Layout ``word_lanes``; returns (block loop, group loop, the block reading x, words loop)."""
    dot = sch.get_sblock("group_dot")
    _, _, _, d_r = sch.get_loops(dot)
    steps, k_lane, _, _ = sch.split(d_r, factors=[None, lanes.k_lanes, rv["load_words"],
                                                  fields_per_word(spec.bits)])
    partial_dot = sch.rfactor(k_lane, factor_axis=0)      # per-lane sums of a group's words

    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    m_t, m_in = sch.split(m, factors=[lanes.m_lanes, None])
    n_b, n_t, n_v, n_e = sch.split(n, factors=[None, lanes.n_lanes, lanes.n_vecs, lanes.vec])
    sch.reorder(n_b, m_t, n_t, g, m_in, n_v, n_e)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(m_t, "threadIdx.z")
    sch.bind(n_t, "threadIdx.y")
    unroll(sch, m_in, n_v, n_e)
    if spec.dtype == "float32":
        written = sch.cache_write(combine, 0, "local")      # y accumulates in registers
    else:
        sch.set_scope(combine, 0, "local")
        written = sch.get_sblock("store")
    sch.reverse_compute_at(written, n_t, preserve_unit_loops=True)
    unroll(sch, *sch.get_loops(written)[4:])

    # The group's lanes meet in a shuffle tree (lanes innermost); every lane gets the sum.
    sch.compute_at(dot, g, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    f_lane, f_m, f_g, f_n = sch.get_loops(dot)[-4:]
    sch.reorder(f_m, f_g, f_n, f_lane)
    sch.bind(f_lane, "threadIdx.x")

    sch.compute_at(partial_dot, g, preserve_unit_loops=True)
    sch.set_scope(partial_dot, 0, "local")
    p_lane, p_m, p_g, p_n, p_steps, p_batch, p_fields = sch.get_loops(partial_dot)[-7:]
    sch.reorder(p_lane, p_g, p_steps, p_batch, p_fields, p_n, p_m)
    sch.bind(p_lane, "threadIdx.x")
    stream_words(sch, partial_dot, (p_steps, p_batch, p_fields, p_n, p_m), lanes, rv)
    load_to_registers(sch, partial_dot, "zeros", g, lanes.vec)
    load_to_registers(sch, combine, "scales", g, lanes.vec)
    sch.decompose_reduction(partial_dot, p_steps)
    sch.decompose_reduction(combine, g)
    return n_b, g, partial_dot, p_steps


def _stage_x(sch: Schedule, spec: UniformSpec, x_stage: str, lanes: WarpLanes, block_loop,
             group_loop, words, axes=K_IN_LANES) -> None:
    """Place ``scale_x`` (x times the field factors) per the sketch's staging."""
    scale_x = sch.get_sblock("scale_x")
    extents = dict(zip(axes, (lanes.m_lanes, lanes.n_lanes, lanes.k_lanes), strict=True))
    threads = [(tag, extents[tag]) for tag in ("threadIdx.z", "threadIdx.y", "threadIdx.x")]
    x_vec = 4 if spec.k % 4 == 0 else 1
    if x_stage == "x_block":
        stage_in_shared(sch, scale_x, block_loop, threads, x_vec)
    elif x_stage == "x_chunk":
        stage_in_shared(sch, scale_x, group_loop, threads, x_vec)
    elif x_stage == "x_registers":
        sch.set_scope(scale_x, 0, "local")
        sch.compute_at(scale_x, words, preserve_unit_loops=True)
        *_, x_m, x_k = sch.get_loops(scale_x)
        x_k, x_e = sch.split(x_k, factors=[None, x_vec])
        sch.vectorize(x_e)
        unroll(sch, x_m, x_k)
    else:
        raise ValueError(f"unknown x staging {x_stage!r}; known: x_block, x_chunk, x_registers")


#: Suffix of the sketches whose K lanes are warps (``group_lanes`` only): a warp's threads run
#: over N (``threadIdx.x``), so each 128-bit load instruction of a warp reads whole rows and
#: every thread of a warp needs the same x (a broadcast, no shared-memory bank conflicts);
#: the K lanes (``threadIdx.y``) meet through shared memory once per output.
K_WARPS = "+k_warps"


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, x_stage: str,
           fixed: dict | None = None, prior: dict | None = None) -> Schedule:
    """One sketch: ``spec``'s layout (:func:`layout_for`) with x staged per ``x_stage`` (a
    name of :data:`X_STAGES`, with :data:`K_WARPS` appended for K lanes across warps); knobs
    sampled (``prior``: {knob: value} sampled more often), or pinned by ``fixed``."""
    k_warps = x_stage.endswith(K_WARPS)
    x_stage = x_stage.removesuffix(K_WARPS)
    axes = K_IN_WARPS if k_warps else K_IN_LANES
    lanes, rv = _sample(sch, spec, fixed, prior)
    layout = layout_for(spec)
    if layout == "word_lanes" and x_stage == "x_chunk":
        raise ValueError("x_chunk stages x per step of the group loop: group_lanes only")
    if layout == "word_lanes" and k_warps:
        raise ValueError(f"{K_WARPS}: K lanes across warps need group_lanes (G >= "
                         f"{WORD_LANES_BELOW_GROUPS}); {spec.name()} has {spec.groups} groups")
    if layout == "group_lanes":
        block_loop, group_loop, _, words = _group_lanes(sch, spec, lanes, rv, axes)
    else:
        block_loop, group_loop, _, words = _word_lanes(sch, spec, lanes, rv)
    _stage_x(sch, spec, x_stage, lanes, block_loop, group_loop, words, axes)
    return sch


X_STAGES = ("x_block", "x_chunk", "x_registers")
SKETCHES = {name + suffix: partial(sketch, x_stage=name + suffix)
            for suffix in ("", K_WARPS) for name in X_STAGES}


def sketches_for(spec: UniformSpec, hw: GpuHardware) -> list[str]:
    """Names of the sketches that can be valid for ``spec`` on ``hw``."""
    names = []
    if x_block_fits(spec, hw):
        names.append("x_block")
    if layout_for(spec) == "group_lanes":
        names.append("x_chunk")
    names.append("x_registers")
    if layout_for(spec) == "group_lanes":
        names += [name + K_WARPS for name in names]
    return names


#: Threads per block of the heuristic ``+k_warps`` layout (8 warps: several blocks per SM, so
#: the grid's tail and the SMs' shares stay even).
HEURISTIC_BLOCK_THREADS = 256
#: Blocks per SM the heuristic wants before it widens a warp's share of N.
HEURISTIC_BLOCKS_PER_SM = 4
#: Packed rows each thread has in flight (x 16 bytes) with x in shared memory or one row of it.
HEURISTIC_LOAD_WORDS = 8
#: Shared memory for x per block past M = 1 (``x_chunk``): M x k_lanes groups of float32, at
#: most this, so that several blocks share an SM.
HEURISTIC_CHUNK_BYTES = 32 * 1024


def heuristic_knobs(spec: UniformSpec, hw: GpuHardware) -> tuple[str, dict[str, int]]:
    """A sketch and knob values that are valid and reasonable without tuning (build_untuned).

    With groups enough (``group_lanes``), K lanes across warps (``+k_warps``). At M = 1, x in
    registers (one load shared by the warp's threads over N); past M = 1, x staged in shared
    memory per group step (``x_chunk``: nvcc reads it back with 128-bit loads, already scaled,
    where registers would cost a multiply per value and row) in at most
    :data:`HEURISTIC_CHUNK_BYTES`, up to 8 rows of M per thread (more over ``threadIdx.z``).
    ``n_lanes`` threads of a warp share a packed row (32 while the grid keeps
    :data:`HEURISTIC_BLOCKS_PER_SM` blocks per SM, else 16 or 8: 128 contiguous bytes; fewer
    only to give every SM a block); K lanes fill a block of :data:`HEURISTIC_BLOCK_THREADS`;
    :data:`HEURISTIC_LOAD_WORDS` 128-bit loads in flight per thread (fewer where x sits in
    registers, to keep everything in registers). Where the chunk cannot fit (M x 128 x 4 bytes
    over the limit), x in registers with at most 4 rows and 8 columns per thread.
    """
    if layout_for(spec) == "word_lanes":
        return _heuristic_word_lanes(spec, hw)
    cands = knob_candidates(spec)

    def chunk_bytes(k_lanes: int) -> int:
        return spec.m * k_lanes * spec.effective_group_size * 4

    staged = spec.m > 1 and chunk_bytes(1) <= HEURISTIC_CHUNK_BYTES
    most_rows = 8 if staged else 4
    if spec.bits == 3 and staged:
        # 3-bit codes straddle words (more live registers per code): 2 rows per thread where
        # M allows; ptxas spills at 4 (128-thread blocks, 8192x28672, M = 4)
        most_rows = 2
    m_lanes = min([v for v in cands["m_lanes"] if spec.m // v <= most_rows]
                  or [max(cands["m_lanes"])])
    rows = spec.m // m_lanes
    # x in registers past M = 4: 8 columns per thread halve the x work per weight.
    n_vecs = 2 if not staged and spec.m > 4 and 2 in cands["n_vecs"] else 1
    columns = spec.n // (vector_width(spec) * n_vecs)
    fitting = [v for v in cands["n_lanes"] if v <= 32 and columns % v == 0]
    wide = [v for v in fitting if v >= 4] or fitting       # 64 contiguous bytes at least
    n_lanes = wide[0]
    for v in sorted(wide, reverse=True):
        n_lanes = v
        blocks = columns // v
        if blocks >= HEURISTIC_BLOCKS_PER_SM * hw.sm_count or (v <= 8 and blocks >= hw.sm_count):
            break
    k_lanes = max([v for v in cands["k_lanes"]
                   if v * n_lanes * m_lanes <= HEURISTIC_BLOCK_THREADS
                   and (not staged or chunk_bytes(v) <= HEURISTIC_CHUNK_BYTES)] or [1])
    # At most 32 registers of packed words and 64 of x in flight (3-bit units are 3 words).
    unit_registers = (3 if spec.bits == 3 else 1) * vector_width(spec) * n_vecs
    x_registers = 0 if staged else fields_per_word(spec.bits) * rows
    most = HEURISTIC_LOAD_WORDS if staged else max(1, HEURISTIC_LOAD_WORDS // rows)
    if not staged and spec.groups > k_lanes:
        # x in registers and several groups per lane: half the batch leaves registers for more
        # warps per SM (with one group per lane the whole batch stays ahead; measurements:
        # docs/results/from-docstrings.md)
        most = max(1, most // 2)
    if spec.bits == 3:  # codes straddle words: two 3-word units in flight spill (ptxas)
        most = 1
    load_words = max([v for v in cands["load_words"] if v <= most and v * unit_registers <= 32
                      and v * x_registers <= 64] or [1])
    knobs = {"k_lanes": k_lanes, "n_lanes": n_lanes, "n_vecs": n_vecs, "m_lanes": m_lanes,
             "load_words": load_words, "unroll": 64}
    return ("x_chunk" if staged else "x_registers") + K_WARPS, knobs


def _heuristic_word_lanes(spec: UniformSpec, hw: GpuHardware) -> tuple[str, dict[str, int]]:
    """The heuristic of the ``word_lanes`` layout (K lanes within a warp).

    128-thread blocks; K lanes raised until the grid has 512 threads per SM (a quarter of what
    an SM holds: enough loads in flight with ``load_words`` 128-bit loads each), or the lanes
    run out; rows split over more thread groups past M = 4 and at most 32 registers of packed
    words in flight, to keep everything in registers.
    """
    cands = knob_candidates(spec)
    n_vecs = 1
    columns = spec.n // (vector_width(spec) * n_vecs)
    for k_lanes in cands["k_lanes"]:
        if columns * k_lanes >= hw.sm_count * 512:
            break
    n_lanes = max([v for v in cands["n_lanes"] if v * k_lanes <= 128] or [cands["n_lanes"][0]])
    m_lanes = max(v for v in cands["m_lanes"] if v <= max(1, spec.m // 4))
    # At most 32 registers of packed words in flight (3-bit units are 3 words each).
    unit_registers = (3 if spec.bits == 3 else 1) * vector_width(spec) * n_vecs
    load_words = max([v for v in cands["load_words"] if v * unit_registers <= 32] or [1])
    knobs = {"k_lanes": k_lanes, "n_lanes": n_lanes, "n_vecs": n_vecs, "m_lanes": m_lanes,
             "load_words": load_words, "unroll": 64}
    if x_block_fits(spec, hw):
        return "x_block", knobs
    chunk = spec.m * k_lanes * spec.effective_group_size * 4
    if layout_for(spec) == "group_lanes" and chunk <= hw.shared_memory_per_block_bytes:
        return "x_chunk", knobs
    return "x_registers", knobs


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs` (a valid kernel without tuning)."""
    name, knobs = heuristic_knobs(spec, hw)
    return sketch(sch, spec, hw, name, knobs)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    """Every applicable sketch on a copy of ``sch``, its knobs left as sampled decisions, then
    the heuristic's sketch again with its knobs as priors (:func:`schedules.knobs.choose`), so
    the search starts from the untuned kernel and its neighbours as often as from anywhere."""
    spaces = [sketch(sch.copy(), spec, hw, name) for name in sketches_for(spec, hw)]
    name, knobs = heuristic_knobs(spec, hw)
    spaces.append(sketch(sch.copy(), spec, hw, name, prior=knobs))
    return spaces
