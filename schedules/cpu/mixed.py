"""CPU design space of the mixed family (llvm: AVX2 / AVX-512).

One N tile at a time (``parallel`` over tiles): the tile's 2-bit groups stream through a
register micro-kernel (uniform's: packed words outer, fields unrolled, AND, convert, FMA per
vector of weights), each group's dot scaled once into a register accumulator with the
second-order-dequantized scale; then the tile's 4-bit groups the same way into a second
accumulator; then ``finish`` adds the two and walks each column's few CSR outliers. The weights
are read once, in storage order; x (gathered into storage order once per call) stays in cache.

Knobs (sampled decisions, replayable from a trace):

==========  ==================================================================
knob        TensorIR loop
==========  ==================================================================
lanes       innermost N loop, vectorized (fixed: the ISA's fp32 width)
n_reg       N vectors of accumulators, unrolled (both parts)
n_blk       N tiles per parallel task
n_par       N tasks, ``parallel`` over the cores
g_unroll    2-bit groups per step of the group loop, unrolled (1, 2, 4)
==========  ==================================================================
"""

from __future__ import annotations

import math

from qcompile._tvm import Schedule
from qcompile.kernels.mixed.spec import MixedSpec
from schedules.knobs import choose
from targets.hardware import CpuHardware

#: Largest N tile of vector accumulators (two parts' accumulators share the registers in turn).
MAX_N_REG = 8

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
    sch.reorder(words, d_reg, fields, d_lanes)
    sch.unroll(fields)
    sch.unroll(d_reg)
    sch.vectorize(d_lanes)
    if part == "2":
        _scales(sch, spec, inner if inner is not None else under, lanes)
    return combine, g, dot, words


def _scales(sch: Schedule, spec: MixedSpec, loop, lanes: int) -> None:
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
                  tiles: dict | None = None) -> Schedule:
    """The sketch: N tiles in parallel; per tile both parts in registers, then the outliers.

    ``tiles`` (``{"n_blk": .., "n_reg": ..}``) fixes the decisions (tests, tools).
    """
    finish = sch.get_sblock("finish")
    m, n = sch.get_loops(finish)
    lanes = vector_lanes(spec, hw)
    n_outer, n_lanes = sch.split(n, factors=[None, lanes])
    if tiles is None:
        factors = sch.sample_perfect_tile(n_outer, n=3, max_innermost_factor=MAX_N_REG)
    else:
        factors = [None, tiles["n_blk"], tiles["n_reg"]]
    n_par, n_blk, n_reg = sch.split(n_outer, factors=factors)
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


def design_space(sch: Schedule, spec: MixedSpec, hw: CpuHardware) -> list[Schedule]:
    """Every sketch on a copy of ``sch``, with its tile sizes left as sampled decisions."""
    return [sketch(sch.copy(), spec, hw) for sketch in SKETCHES]
