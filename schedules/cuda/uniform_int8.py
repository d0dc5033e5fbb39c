"""CUDA design space of the uniform family with int8 activations, over compute_cuda_int8.py
(blocks ``x_amax``, ``x_inverse``, ``x_pack``, ``x_qsum``, ``x_step``, ``group_dot``,
``combine``).

Two kernels per call (one in the ``x_quant_block`` sketch):

1. **Quantize x** (:func:`quantize_x`): one thread block per row and group of x; its threads
   find the group's max |x| (a shuffle reduction), pack x into int8 words in storage order and
   sum them (another reduction). M x K floats: a few microseconds at most, mostly launch.
2. **The GEMV**: the float kernel's ``+k_warps`` layout (schedules/cuda/uniform.py): blocks over
   N, a warp's threads over N (``threadIdx.x``, each owning ``n_vecs`` vectors of 4 columns),
   the K lanes across warps (``threadIdx.y``, every ``k_lanes``-th group), rows of M over
   ``threadIdx.z``; packed words in 128-bit loads, ``load_words`` units at a time; per group a
   thread sums ``dp4a`` of its codes and x words in int32, then applies the zero-point, the
   scale and x's group scale once. The lanes meet through shared memory at the end.

Knobs are those of the float space (same candidates and meaning; ``load_words`` counts units of
K: a word at 2 and 4 bits, a 3-word block at 3 bits). Sketches say where the int8 words of x
live: ``x_block`` (all of x in shared memory, one copy per block: M*K bytes), ``x_chunk`` (the
groups of one step of the group loop in shared memory), ``x_registers`` (each thread loads the
words of its ``load_words`` units, 128 bits at a time, the same for the whole warp), and
``x_quant_block`` (no first kernel: every block quantizes all of x into its shared memory;
M*K <= :data:`IN_BLOCK_MAX_FLOATS`).

Group lanes need G >= 8 (group_size 32..128 at the usual K); a spec with fewer groups
(group_size = -1) is refused with the rule.
"""

from __future__ import annotations

from functools import partial

from qcompile._tvm import Schedule
from qcompile.errors import SpecError
from qcompile.kernels.tir.int8_dot import steps_per_unit
from qcompile.kernels.tir.planes import STEP, unit_rows
from qcompile.kernels.uniform.spec import UniformSpec
from schedules.cuda.common import (
    K_IN_WARPS,
    WarpLanes,
    load_to_registers,
    read_index,
    stage_in_shared,
    warp_gemv,
)
from schedules.cuda.uniform import (
    K_LANES,
    LOAD_WORDS,
    M_LANES,
    N_LANES,
    N_VECS,
    UNROLL,
    WORD_LANES_BELOW_GROUPS,
    stream_words,
    vector_width,
)
from schedules.knobs import choose
from schedules.loops import loops_below
from targets.hardware import GpuHardware

_KNOBS = ("k_lanes", "n_lanes", "n_vecs", "m_lanes", "load_words", "unroll")
#: Threads of the quantize-x kernel per (row, group) block, at most.
QUANTIZE_THREADS = 128
#: int32 words of x per 128-bit load.
_X_VEC = 4


def check_spec(spec: UniformSpec) -> None:
    """Raise SpecError unless the space can lay out ``spec`` (groups enough for the K lanes)."""
    if spec.groups < WORD_LANES_BELOW_GROUPS:
        raise SpecError(
            f"{spec.name()}: int8 activations on CUDA need at least {WORD_LANES_BELOW_GROUPS} "
            f"groups along K (the K lanes take whole groups); K={spec.k} with group_size="
            f"{spec.group_size} has {spec.groups}: use a group size of K/{WORD_LANES_BELOW_GROUPS}"
            " or less, or float activations")


def units_per_group(spec: UniformSpec) -> int:
    """Units of K (a word; a 3-word block at 3 bits) per group and column."""
    return spec.effective_group_size // unit_rows(spec.bits)


def knob_candidates(spec: UniformSpec) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``: each divides the loop it splits."""
    vec = vector_width(spec)
    n_vectors = spec.n // vec
    n_vecs = [v for v in N_VECS if n_vectors % v == 0]
    units = units_per_group(spec)
    return {
        "k_lanes": [v for v in K_LANES if spec.groups % v == 0],
        "n_lanes": [v for v in N_LANES if n_vectors % (v * max(n_vecs)) == 0],
        "n_vecs": n_vecs,
        "m_lanes": [v for v in M_LANES if spec.m % v == 0],
        "load_words": [v for v in LOAD_WORDS if units % v == 0],
        "unroll": list(UNROLL),
    }


def x_bytes(spec: UniformSpec) -> int:
    """Bytes of int8 x (M x K): what ``x_block`` keeps in shared memory."""
    return spec.m * spec.k


def quantize_x(sch: Schedule, spec: UniformSpec) -> None:
    """The first kernel: one block per (row, group); ``x_amax`` and ``x_qsum`` are shuffle
    reductions over the block's threads, ``x_pack`` one word per thread and step."""
    words = spec.effective_group_size // STEP
    threads = max(v for v in (1, 2, 4, 8, 16, 32, 64, QUANTIZE_THREADS) if words % v == 0)
    amax = sch.get_sblock("x_amax")
    m, g, r = sch.get_loops(amax)
    row_group = sch.fuse(m, g)
    sch.bind(row_group, "blockIdx.x")
    sch.bind(sch.split(r, factors=[None, threads])[1], "threadIdx.x")
    sch.set_scope(amax, 0, "shared")
    # The blocks that read amax follow it into the block: one kernel, amax never leaves it.
    inverse = sch.get_sblock("x_inverse")
    sch.set_scope(inverse, 0, "shared")
    sch.reverse_compute_at(inverse, row_group, preserve_unit_loops=True)
    for name in ("x_pack", "x_qsum"):
        block = sch.get_sblock(name)
        sch.reverse_compute_at(block, row_group, preserve_unit_loops=True)
        *_, inner = sch.get_loops(block)
        sch.bind(sch.split(inner, factors=[None, threads])[1], "threadIdx.x")
    sch.reverse_compute_at(sch.get_sblock("x_step"), row_group, preserve_unit_loops=True)


def _sample(sch: Schedule, spec: UniformSpec, fixed: dict | None, prior: dict | None):
    cands = knob_candidates(spec)
    rv = {name: choose(sch, name, cands[name], fixed, prior) for name in _KNOBS}
    lanes = WarpLanes(m_lanes=rv["m_lanes"], n_lanes=rv["n_lanes"], k_lanes=rv["k_lanes"],
                      n_vecs=rv["n_vecs"], vec=vector_width(spec))
    return lanes, rv


def _stage_x_shared(sch: Schedule, block, loop, lanes: WarpLanes) -> None:
    """Copy the x words ``block`` reads under ``loop`` into shared memory, every thread of the
    block taking a share (128-bit copies)."""
    cache = sch.cache_read(block, read_index(sch, block, "xq_words"), "shared")
    threads = [("threadIdx.z", lanes.m_lanes), ("threadIdx.y", lanes.k_lanes),
               ("threadIdx.x", lanes.n_lanes)]
    stage_in_shared(sch, cache, loop, threads, _X_VEC)


def sketch(sch: Schedule, spec: UniformSpec, hw: GpuHardware, x_stage: str,
           fixed: dict | None = None, prior: dict | None = None) -> Schedule:
    """One sketch (x words per ``x_stage``, a name of :data:`X_STAGES`); knobs sampled
    (``prior``: favoured values), or pinned by ``fixed``."""
    check_spec(spec)
    if x_stage not in X_STAGES:
        raise ValueError(f"unknown x staging {x_stage!r}; known: {', '.join(X_STAGES)}")
    if x_stage != IN_BLOCK:
        quantize_x(sch, spec)
    lanes, rv = _sample(sch, spec, fixed, prior)
    combine = sch.get_sblock("combine")
    layout = warp_gemv(sch, combine, lanes, K_IN_WARPS)
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, layout.group_loop, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_n, d_r = sch.get_loops(dot)
    sch.reorder(d_g, d_m)
    words, batch, steps = sch.split(d_r, factors=[None, rv["load_words"],
                                                  steps_per_unit(spec.bits)])
    stream_words(sch, dot, (words, batch, steps, d_n, d_m), lanes, rv)
    for name in ("scales", "zeros"):
        load_to_registers(sch, layout.partial, name, layout.group_loop, lanes.vec)
    if x_stage == "x_registers":
        # a unit's steps are contiguous words of x: 64-bit loads at 4 bits, 128-bit below
        load_to_registers(sch, dot, "xq_words", words, min(steps_per_unit(spec.bits), _X_VEC))
    elif x_stage == "x_chunk":
        _stage_x_shared(sch, dot, layout.group_loop, lanes)
    elif x_stage == "x_block":
        _stage_x_shared(sch, dot, layout.block_loop, lanes)
    else:
        _quantize_in_block(sch, layout.block_loop, lanes)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(layout.partial, layout.group_loop)
    return sch


def _quantize_in_block(sch: Schedule, block_loop, lanes: WarpLanes) -> None:
    """Sketch ``x_quant_block``: every block quantizes all of x into its shared memory (no
    first kernel: its launch and the round trip of x words through memory go, M*K floats of
    x are read from L2 by every block instead). Group maxima and sums are reductions over the
    ``n_lanes`` threads of a row (``threadIdx.x``), groups over the K lanes and M lanes."""
    threads = (("threadIdx.z", lanes.m_lanes), ("threadIdx.y", lanes.k_lanes),
               ("threadIdx.x", lanes.n_lanes))
    # Consumers before producers: compute_at wants every consumer of a block under the loop.
    for name in ("x_pack", "x_step", "x_qsum", "x_inverse", "x_amax"):
        block = sch.get_sblock(name)
        sch.set_scope(block, 0, "shared")
        sch.compute_at(block, block_loop, preserve_unit_loops=True)
        if name in ("x_qsum", "x_amax"):
            _reduce_over_row_threads(sch, block, block_loop, lanes)
            continue
        fused = sch.fuse(*loops_below(sch, block, block_loop))
        parts = sch.split(fused, factors=[None, *(extent for _, extent in threads)])
        for (tag, _), part in zip(threads, parts[1:], strict=True):
            sch.bind(part, tag)


def _reduce_over_row_threads(sch: Schedule, block, block_loop, lanes: WarpLanes) -> None:
    """Bind a per-(row, group) reduction of x placed under ``block_loop``: groups over the M
    and K lanes, the group's elements over the ``n_lanes`` threads of a row."""
    *rows, r = loops_below(sch, block, block_loop)
    parts = sch.split(sch.fuse(*rows), factors=[None, lanes.m_lanes, lanes.k_lanes])
    sch.bind(parts[1], "threadIdx.z")
    sch.bind(parts[2], "threadIdx.y")
    sch.bind(sch.split(r, factors=[None, lanes.n_lanes])[1], "threadIdx.x")


#: The sketch that quantizes x inside each block of the GEMV (one kernel).
IN_BLOCK = "x_quant_block"
#: Most floats of x (M x K) the ``x_quant_block`` sketch quantizes per block.
IN_BLOCK_MAX_FLOATS = 16384

X_STAGES = ("x_block", "x_chunk", "x_registers", IN_BLOCK)
SKETCHES = {name: partial(sketch, x_stage=name) for name in X_STAGES}


def sketches_for(spec: UniformSpec, hw: GpuHardware) -> list[str]:
    """Names of the sketches that can be valid for ``spec`` on ``hw``."""
    check_spec(spec)
    names = ["x_chunk", "x_registers"]
    if x_bytes(spec) <= hw.shared_memory_per_block_bytes:
        names.insert(0, "x_block")
        if spec.m * spec.k <= IN_BLOCK_MAX_FLOATS:
            names.append(IN_BLOCK)
    return names


#: (most rows of M per thread, most K lanes, threads per block) of the heuristic: the fastest
#: points of a sweep of the int8 space (tools/studies/sweep_cuda.py --activations int8). One
#: row, 16 K lanes x 16 columns-threads; 4 rows, 16 x 8 (the registers of 4 rows limit the
#: warps per SM); 8 rows, 8 K lanes x 16 x 2 rows-threads; at most 16 K lanes past 4 rows
#: (docs/design/uniform-cuda.md, "int8 activations on CUDA (dp4a)"; the numbers:
#: docs/results/from-docstrings.md).
HEURISTIC_SHAPES = ((1, 32, 256), (4, 32, 128), (8, 16, 256))
#: Blocks per SM the heuristic wants before it moves threads from N to K.
HEURISTIC_BLOCKS_PER_SM = 2
#: Fewest columns-threads a block keeps (64 contiguous bytes of a packed row per warp).
HEURISTIC_MIN_N_LANES = 4
#: At M = 1, x is quantized in every block (``x_quant_block``) when all blocks together read
#: at most this many floats of x (blocks x K): a short grid then saves the second kernel's
#: launch, a long one spends more on the copies than the launch costs (measurements:
#: docs/results/from-docstrings.md).
IN_BLOCK_MAX_X_READS = 1 << 21


def heuristic_knobs(spec: UniformSpec, hw: GpuHardware) -> tuple[str, dict[str, int]]:
    """A sketch and knobs that are valid and reasonable without tuning.

    Up to 8 rows of M per thread (more over ``threadIdx.z``); the block's threads from
    :data:`HEURISTIC_SHAPES`, first all over N but for the K lanes' base (16, 16 or 8), then,
    while the grid has fewer than :data:`HEURISTIC_BLOCKS_PER_SM` blocks per SM, moved from N
    to K (up to the shape's K lanes), then N narrowed (down to :data:`HEURISTIC_MIN_N_LANES`);
    4 units of packed words in flight (2 at 3 bits: 3 words each). x words in registers at
    M = 1 (each thread loads its own, the same for the whole warp: no barrier) or quantized in
    the block for short grids (:data:`IN_BLOCK_MAX_X_READS`), else in shared memory per group
    step (``x_chunk``).
    """
    check_spec(spec)
    cands = knob_candidates(spec)
    m_lanes = min([v for v in cands["m_lanes"] if spec.m // v <= 8] or [max(cands["m_lanes"])])
    rows = spec.m // m_lanes
    most_k, threads = next(((k, t) for r, k, t in HEURISTIC_SHAPES if rows <= r),
                           HEURISTIC_SHAPES[-1][1:])
    base_k = 16 if rows <= 4 else 8
    k_lanes = max([v for v in cands["k_lanes"] if v <= base_k] or [1])
    n_lanes = max([v for v in cands["n_lanes"] if v * k_lanes * m_lanes <= threads] or [1])
    columns = spec.n // vector_width(spec)

    def short(n: int) -> bool:
        return columns // n < HEURISTIC_BLOCKS_PER_SM * hw.sm_count

    while short(n_lanes) and n_lanes > 1 and 2 * k_lanes <= most_k \
            and 2 * k_lanes in cands["k_lanes"] and n_lanes // 2 in cands["n_lanes"]:
        k_lanes, n_lanes = 2 * k_lanes, n_lanes // 2
    while short(n_lanes) and n_lanes > HEURISTIC_MIN_N_LANES and n_lanes // 2 in cands["n_lanes"]:
        n_lanes //= 2
    most = 2 if spec.bits == 3 else 4
    load_words = max([v for v in cands["load_words"] if v <= most] or [1])
    knobs = {"k_lanes": k_lanes, "n_lanes": n_lanes, "n_vecs": 1, "m_lanes": m_lanes,
             "load_words": load_words, "unroll": 64 if spec.m > 1 else 512}
    if spec.m > 1:
        return "x_chunk", knobs
    blocks = columns // n_lanes
    if IN_BLOCK in sketches_for(spec, hw) and blocks * spec.k <= IN_BLOCK_MAX_X_READS:
        return IN_BLOCK, knobs
    return "x_registers", knobs


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs` (a valid kernel without tuning)."""
    name, knobs = heuristic_knobs(spec, hw)
    return sketch(sch, spec, hw, name, knobs)


def design_space(sch: Schedule, spec: UniformSpec, hw: GpuHardware) -> list[Schedule]:
    """Every applicable sketch on a copy of ``sch``, its knobs sampled, then the heuristic's
    sketch again with its knobs as priors."""
    spaces = [sketch(sch.copy(), spec, hw, name) for name in sketches_for(spec, hw)]
    name, knobs = heuristic_knobs(spec, hw)
    spaces.append(sketch(sch.copy(), spec, hw, name, prior=knobs))
    return spaces
