"""CPU design space of the mixed family (llvm: AVX2 / AVX-512).

One N tile at a time (``parallel`` over tiles): the tile's 2-bit groups stream through a
register micro-kernel (uniform's: packed words outer, fields unrolled, AND, convert, FMA per
vector of weights), each group's dot scaled once into a register accumulator with the
second-order-dequantized scale; then the tile's 4-bit groups the same way into a second
accumulator; then ``finish`` adds the two and walks each column's few CSR outliers. The weights
are read once, in storage order; x (gathered into storage order once per call) stays in cache.

Every sketch first rewrites codes, first- and second-order scales and zeros of both parts into
column tiles of ``n_reg * lanes`` (the ``n_tiled`` layout, qcompile/kernels/layouts/mixed.py), so
a task streams one contiguous range per operand instead of one strided row per 2-bit group
(a new page every 16 rows at N = 28672; the untiled kernel took about 2x the time). The layout is
a ``transform_layout`` in the trace, so it replays from a record and the build writes it into
the manifest; ``prepare`` packs the arrays for it.

Knobs (sampled decisions, replayable from a trace):

==========  ==================================================================
knob        TensorIR loop
==========  ==================================================================
lanes       innermost N loop, vectorized (fixed: the ISA's fp32 width)
n_reg       N vectors of accumulators, unrolled (both parts); one sketch per value of
            :data:`N_REGS` whose tile fits (it is the layout's tile)
n_blk       N tiles per parallel task (sampled with n_par, at most :data:`MAX_N_BLK`)
n_par       N tasks, ``parallel`` over the cores
g_unroll    2-bit groups per step of the group loop, unrolled (1, 2, 4)
==========  ==================================================================
"""

from __future__ import annotations

import math

from qcompile._tvm import Schedule
from qcompile.kernels.layouts import mixed as weight_layout
from qcompile.kernels.mixed.spec import MixedSpec
from schedules.knobs import choose
from targets.hardware import CpuHardware

#: Largest N tile of vector accumulators (two parts' accumulators share the registers in turn).
MAX_N_REG = 8

#: Accumulator tiles (vectors) the space offers, one sketch each: the weight layout's tile is
#: ``n_reg * lanes`` columns, so n_reg is fixed per sketch, not sampled.
N_REGS = (2, 4, 8)

#: Largest number of N tiles per parallel task (sampled with the task count).
MAX_N_BLK = 16

_FIELDS = {"2": 16, "4": 8}

#: 2-bit groups per step of the group loop (unrolled).
G_UNROLL = (1, 2, 4)


def vector_lanes(spec: MixedSpec, hw: CpuHardware) -> int:
    """fp32 lanes of the innermost loop: the ISA's width, or less when N is not a multiple."""
    return math.gcd(spec.n, hw.fp32_lanes)


def _part(sch: Schedule, spec: MixedSpec, part: str, under, lanes: int, g_unroll=1):
    """Part ``part`` ("2" or "4") of the tile at loop ``under``: register accumulators, and the
    group dot as a register micro-kernel. Returns (combine, its group loop or None, dot, words
    loop).

    ``compute_at`` makes a loop per block iterator of extent > 1 only, so the M loop (M == 1)
    and the group loop (one 4-bit scale group) may be missing.
    """
    lay = spec.layout
    groups = lay.groups2 if part == "2" else lay.scale_groups4
    combine = sch.get_sblock(f"combine{part}")
    sch.compute_at(combine, under)
    sch.set_scope(combine, 0, "local")
    loops = sch.get_loops(combine)[2:]  # under (n_par, n_blk)
    rows = loops[:1] if spec.m > 1 else []
    n = loops[len(rows)]
    g = loops[len(rows) + 1] if groups > 1 else None
    n_reg, n_lanes = sch.split(n, factors=[None, lanes])
    inner = g
    if g is not None:
        sch.reorder(g, *rows, n_reg, n_lanes)
        if part == "2":  # several one-word groups per step: independent chains, less overhead
            g, inner = sch.split(g, factors=[None, g_unroll])
            sch.unroll(inner)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    dot = sch.get_sblock(f"group_dot{part}")
    sch.compute_at(dot, inner if inner is not None else under)
    sch.set_scope(dot, 0, "local")
    *_, dn, dr = sch.get_loops(dot)
    d_reg, d_lanes = sch.split(dn, factors=[None, lanes])
    words, fields = sch.split(dr, factors=[None, _FIELDS[part]])
    # Fields outside the accumulator vectors: one x broadcast and one field mask live at a
    # time, shared by the tile's vectors; with the vectors outside, LLVM keeps all 16 (8) of
    # each live across them and spills words and accumulators (generated assembly).
    sch.reorder(words, fields, d_reg, d_lanes)
    sch.unroll(fields)
    sch.unroll(d_reg)
    sch.vectorize(d_lanes)
    if part == "2":
        scales_in_registers(sch, spec, inner if inner is not None else under, lanes)
    return combine, g, dot, words


def scales_in_registers(sch: Schedule, spec: MixedSpec, loop, lanes: int) -> None:
    """The group's first-order scales of the tile, dequantized once into registers (block
    ``scale1``) with the second-order operands' column loop outside the vector lanes, so each
    vector reads one second-order zero and scale (a broadcast) instead of a gather of ``n //
    g2``. Inlined into ``combine2`` when the tile is not a whole number of g2 groups."""
    scale = sch.get_sblock("scale1")
    tile = spec.n  # the tile's columns: known after compute_at
    sch.compute_at(scale, loop, preserve_unit_loops=True)
    (n,) = sch.get_loops(scale)[-1:]
    tile = int(sch.get(n).extent)
    g2 = spec.g2
    if tile % g2 or g2 % lanes:
        sch.compute_inline(scale)
        return
    sch.set_scope(scale, 0, "local")
    _, within, vec = sch.split(n, factors=[None, g2 // lanes, lanes])
    sch.unroll(within)
    sch.vectorize(vec)


def register_tile(sch: Schedule, spec: MixedSpec, hw: CpuHardware,
                  tiles: dict | None = None, n_reg: int | None = None) -> Schedule:
    """The sketch: N tiles in parallel; per tile both parts in registers, then the outliers.

    ``n_reg`` fixes the accumulator tile (the layout's tile is ``n_reg * lanes`` columns) and
    leaves n_par x n_blk and g_unroll sampled; ``tiles`` (``{"n_blk": .., "n_reg": ..,
    "g_unroll": ..}``) fixes every decision instead (tests, tools), in whatever layout the
    caller applied.
    """
    finish = sch.get_sblock("finish")
    m, n = sch.get_loops(finish)
    lanes = vector_lanes(spec, hw)
    n_outer, n_lanes = sch.split(n, factors=[None, lanes])
    if tiles is None:
        n_tasks, n_reg_loop = sch.split(n_outer, factors=[None, n_reg])
        factors = sch.sample_perfect_tile(n_tasks, n=2, max_innermost_factor=MAX_N_BLK)
        n_par, n_blk = sch.split(n_tasks, factors=factors)
        n_reg = n_reg_loop
    else:
        n_par, n_blk, n_reg = sch.split(n_outer, factors=[None, tiles["n_blk"], tiles["n_reg"]])
    sch.reorder(n_par, n_blk, m, n_reg, n_lanes)
    if tiles is None:
        g_unroll = choose(sch, "g_unroll", [v for v in G_UNROLL if spec.layout.groups2 % v == 0])
    else:
        g_unroll = tiles.get("g_unroll", 1)
    reductions = [_part(sch, spec, part, n_blk, lanes, g_unroll) for part in ("2", "4")]
    sch.parallel(n_par)
    for combine, g, dot, words in reductions:
        sch.decompose_reduction(dot, words)
        if g is not None:
            sch.decompose_reduction(combine, g)
    return sch


SKETCHES = (register_tile,)


def tile_widths(spec: MixedSpec, hw: CpuHardware) -> list[int]:
    """The n_reg values of :data:`N_REGS` whose layout tile ``n_reg * lanes`` divides N and
    holds whole second-order groups (a multiple of g2)."""
    lanes = vector_lanes(spec, hw)
    return [r for r in N_REGS
            if r <= MAX_N_REG and spec.n % (r * lanes) == 0 and (r * lanes) % spec.g2 == 0]


def with_layout(sch: Schedule, spec: MixedSpec, tile_n: int) -> Schedule:
    """``sch`` with codes, first- and second-order scales and zeros of both parts rewritten
    into column tiles of ``tile_n`` (qcompile/kernels/layouts/mixed.py)."""
    weight_layout.apply(sch, spec.n, spec.g2, tile_n)
    return sch


def design_space(sch: Schedule, spec: MixedSpec, hw: CpuHardware) -> list[Schedule]:
    """For each accumulator tile of :func:`tile_widths`, every sketch on a copy of ``sch`` in
    its tiled layout, with n_par x n_blk and g_unroll left as sampled decisions (the format's
    default layout with a sampled n_reg when no tile fits)."""
    lanes = vector_lanes(spec, hw)
    widths = tile_widths(spec, hw)
    if not widths:
        return [sketch(sch.copy(), spec, hw, n_reg=1) for sketch in SKETCHES]
    return [sketch(with_layout(sch.copy(), spec, r * lanes), spec, hw, n_reg=r)
            for r in widths for sketch in SKETCHES]


#: The untuned point (measured on 8192x28672, AVX2, 2 threads: docs/design/mixed.md,
#: "CPU: bandwidth with float32 x").
HEURISTIC = {"n_reg": 4, "n_blk": 2, "g_unroll": 1}


def heuristic_schedule(sch: Schedule, spec: MixedSpec, hw: CpuHardware) -> Schedule:
    """:data:`HEURISTIC` in its tiled layout, or the nearest point the spec allows (n_blk
    lowered until it divides the tiles and leaves every core a task)."""
    lanes = vector_lanes(spec, hw)
    widths = tile_widths(spec, hw)
    tiles = dict(HEURISTIC)
    if tiles["g_unroll"] > 1 and spec.layout.groups2 % tiles["g_unroll"]:
        tiles["g_unroll"] = 1
    tiles["n_reg"] = min(widths, key=lambda r: abs(r - HEURISTIC["n_reg"])) if widths else 1
    count = spec.n // (tiles["n_reg"] * lanes)
    while tiles["n_blk"] > 1 and (count % tiles["n_blk"] or count // tiles["n_blk"] < hw.cores):
        tiles["n_blk"] //= 2
    if not widths:
        return register_tile(sch, spec, hw, tiles)
    return register_tile(with_layout(sch, spec, tiles["n_reg"] * lanes), spec, hw, tiles)
