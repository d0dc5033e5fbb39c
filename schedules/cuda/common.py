"""Schedule pieces every CUDA design space can reuse (uniform now; BCQ and mixed families next).

The central one is :func:`warp_gemv`, the thread layout of a GEMV/small-M GEMM whose output is a
sum over groups of K, ``y[m, n] = sum_g part(m, n, g)``:

- ``blockIdx.x`` runs over tiles of N;
- inside a block, ``threadIdx.y`` over N (``n_lanes`` threads, each owning ``n_vecs`` 128-bit
  vectors of columns), ``threadIdx.z`` over M (``m_lanes``), and ``threadIdx.x`` over K: the
  ``k_lanes`` lanes of a warp take every ``k_lanes``-th group;
- each thread sums its groups in registers (an ``rfactor`` block in local memory), then the
  ``k_lanes`` partial sums of a column meet in a warp-shuffle reduction (TVM lowers a reduction
  over a ``threadIdx.x`` loop to ``__shfl_down_sync`` when the lanes are a power of two within
  one warp).

Everything per group (decoding a group's weights, its scale) is placed under the returned
``group_loop``. The other helpers load a buffer into registers with 128-bit vector loads and
stage a buffer in shared memory with every thread of the block.
"""

from __future__ import annotations

from dataclasses import dataclass

from qcompile._tvm import Schedule
from schedules.loops import loops_below

#: Bytes of one vector load: the widest global load a CUDA thread can issue (LDG.128).
VECTOR_BYTES = 16


@dataclass(frozen=True)
class WarpLanes:
    """Sampled thread-layout decisions (ExprRVs, or ints for a fixed layout).

    Attributes
    ----------
    m_lanes : threads along M (``threadIdx.z``); each owns M / m_lanes rows.
    n_lanes : threads along N (``threadIdx.y``).
    k_lanes : lanes along K (``threadIdx.x``), reduced by warp shuffles.
    n_vecs : vectors of ``vec`` columns per thread.
    vec : columns per vector (4 int32 words = 128 bits; fixed, not sampled).
    """

    m_lanes: object
    n_lanes: object
    k_lanes: object
    n_vecs: object
    vec: int


@dataclass(frozen=True)
class WarpGemv:
    """Handles :func:`warp_gemv` returns.

    Attributes
    ----------
    block_loop : LoopRV bound to ``blockIdx.x``.
    group_loop : LoopRV, the serial loop over one lane's groups (per-group work goes here).
    partial : SBlockRV, the per-lane partial sums (local memory).
    final : SBlockRV, the cross-thread reduction that writes the output.
    """

    block_loop: object
    group_loop: object
    partial: object
    final: object


#: Thread axes of (M, N, K) lanes: K lanes within a warp (shuffle reduction), or K lanes
#: across warps with a warp's threads over N (coalesced rows, x the same for the whole warp;
#: the partial sums meet through shared memory).
K_IN_LANES = ("threadIdx.z", "threadIdx.y", "threadIdx.x")
K_IN_WARPS = ("threadIdx.z", "threadIdx.x", "threadIdx.y")


def warp_gemv(sch: Schedule, block, lanes: WarpLanes, axes=K_IN_LANES) -> WarpGemv:
    """Lay out reduction ``block`` (loops m, n, g; spatial m, n; reduction g) as a warp GEMV.

    Splits g into (groups per lane, ``k_lanes``) with the lanes innermost, so lane t sums
    groups t, t + k_lanes, ...; rfactors the lanes out into per-thread partial sums in
    registers, binds the threads (``axes``: the thread tags of the M, N and K lanes,
    :data:`K_IN_LANES` or :data:`K_IN_WARPS`), and reduces the partials across the lanes.
    """
    m_axis, n_axis, k_axis = axes
    m, n, g = sch.get_loops(block)
    m_t, m_in = sch.split(m, factors=[lanes.m_lanes, None])
    n_b, n_t, n_v, n_e = sch.split(n, factors=[None, lanes.n_lanes, lanes.n_vecs, lanes.vec])
    g_o, g_t = sch.split(g, factors=[None, lanes.k_lanes])
    sch.reorder(n_b, m_t, n_t, g_t, g_o, m_in, n_v, n_e)
    partial = sch.rfactor(g_t, factor_axis=0)
    sch.set_scope(partial, 0, "local")
    n_b, m_t, n_t, g_t, g_o, m_in, n_v, n_e = sch.get_loops(partial)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(m_t, m_axis)
    sch.bind(n_t, n_axis)
    sch.bind(g_t, k_axis)
    unroll(sch, m_in, n_v, n_e)

    # The cross-thread reduction: lanes innermost (TVM requires the reduced thread loop to be
    # the deepest), one shuffle tree per output element.
    sch.reverse_compute_at(block, n_b, preserve_unit_loops=True)
    _, f_g, f_m, f_n = sch.get_loops(block)
    f_mt, f_min = sch.split(f_m, factors=[lanes.m_lanes, None])
    f_nt, f_nin = sch.split(f_n, factors=[lanes.n_lanes, None])
    sch.reorder(f_mt, f_nt, f_min, f_nin, f_g)
    sch.bind(f_mt, m_axis)
    sch.bind(f_nt, n_axis)
    sch.bind(f_g, k_axis)
    return WarpGemv(block_loop=n_b, group_loop=g_o, partial=partial, final=block)


def read_index(sch: Schedule, block, buffer_name: str) -> int:
    """Position of ``buffer_name`` among the buffers ``block`` reads (for cache_read)."""
    reads = [region.source.name for region in sch.get(block).reads]
    try:
        return reads.index(buffer_name)
    except ValueError:
        raise ValueError(f"block {sch.get(block).name_hint!r} reads {reads}, "
                         f"not {buffer_name!r}") from None


def load_to_registers(sch: Schedule, block, buffer_name: str, loop, vec: int,
                      only_block: bool = False):
    """Read the part of ``buffer_name`` that ``block`` needs under ``loop`` into registers.

    The innermost (contiguous) axis is split by ``vec`` and vectorized: with ``vec`` elements of
    16 bytes together that is one 128-bit load per vector. Every other loop of the copy is
    unrolled, so the registers are addressed with constants. ``only_block``: only ``block``
    reads the copy (other readers of the buffer, elsewhere in the function, keep theirs).
    """
    consumers = [block] if only_block else None
    cache = sch.cache_read(block, read_index(sch, block, buffer_name), "local",
                           consumer_blocks=consumers)
    sch.compute_at(cache, loop, preserve_unit_loops=True)
    *outer, inner = loops_below(sch, cache, loop)
    if vec > 1:
        inner, lanes = sch.split(inner, factors=[None, vec])
        sch.vectorize(lanes)
    unroll(sch, *outer, inner)
    return cache


def stage_in_shared(sch: Schedule, block, loop, threads: list[tuple[str, object]], vec: int):
    """Compute ``block`` (a spatial producer) into shared memory under ``loop``, every thread
    of the block taking a share: the fused copy loop is split over ``threads`` (``(tag,
    extent)`` pairs, outermost first, matching the kernel's bindings) and ``vec`` lanes."""
    sch.set_scope(block, 0, "shared")
    sch.compute_at(block, loop, preserve_unit_loops=True)
    copy = loops_below(sch, block, loop)
    fused = sch.fuse(*copy)
    parts = sch.split(fused, factors=[None, *(extent for _, extent in threads), vec])
    for (tag, _), part in zip(threads, parts[1:-1], strict=True):
        sch.bind(part, tag)
    sch.vectorize(parts[-1])
    return block


def unroll(sch: Schedule, *loops) -> None:
    """Unroll every loop given (register arrays must be indexed by constants)."""
    for loop in loops:
        sch.unroll(loop)


def bind_per_thread(sch: Schedule, compute: str, total: str) -> None:
    """Bind a compute written per thread (block ``compute`` over loops (block, y, x): one thread
    of one thread block each) and the block that adds its sums (``total``, loops ..., then the
    reduction over y last): the compute's loops on blockIdx.x, threadIdx.y and threadIdx.x, its
    output in shared memory, and the sum in the same thread block, its spatial loops (fused)
    over all the block's threads."""
    block_rv = sch.get_sblock(compute)
    block, y, x = sch.get_loops(block_rv)
    sch.bind(block, "blockIdx.x")
    sch.bind(y, "threadIdx.y")
    sch.bind(x, "threadIdx.x")
    sch.set_scope(block_rv, 0, "shared")
    total_rv = sch.get_sblock(total)
    sch.reverse_compute_at(total_rv, block, preserve_unit_loops=True)
    spatial = loops_below(sch, total_rv, block)[:-1]
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    _, ty, tx = sch.split(fused, factors=[None, int(sch.get(y).extent), int(sch.get(x).extent)])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
