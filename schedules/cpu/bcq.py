"""CPU design space of the BCQ family (llvm: AVX2 / AVX-512), over qcompile/kernels/bcq/compute.py.

Once per call the tables are built (``lut``: chunks in parallel, the 2**mu entries as vector
lanes, one signed add of x per table bit) with the group sums of x (``x_sum``). The main loop is
the uniform family's register tile with a lookup in place of the decode: a tile of ``n_reg``
vectors of outputs (``lanes`` columns each) stays in registers; per chunk of mu rows and per
plane, the ``lanes`` packed words of the tile give ``lanes`` keys (shift, AND) and ``lanes``
table entries are added to the plane's accumulators; once per group the q plane sums are scaled
by alpha, z * xsum is added, and the tile goes into the output accumulators.

Knobs (sampled decisions) and the loops they size:

==========  ==========================================================
knob        TensorIR loop
==========  ==========================================================
lanes       innermost N loop of ``group_dot``/``combine`` (fixed: the ISA's fp32 lanes, or
            1 in sketch ``scalar_lookup``)
n_reg       N loop of accumulators, unrolled (q * n_reg accumulators in registers)
n_blk       N tiles per parallel task
n_par       N tasks, ``parallel`` over the cores
g_in        groups per K block (sketch ``k_blocked`` only)
per_word    chunks per packed word (32 / mu, unrolled: one load of a word serves them all;
            fixed by mu)
==========  ==========================================================

Sketches:

``vector_lookup``
    ``lanes`` columns per vector: the keys are computed with vector shifts and the lookups are
    ``lanes`` loads of one table row (a gather).
``scalar_lookup``
    one column per lane of work: scalar shift, AND, load, add per key (no gather; the
    out-of-order core overlaps the n_reg independent columns).
``k_blocked``
    as ``vector_lookup``, with blocks of ``g_in`` groups outside the N tiles: the block's
    tables stay in L1/L2 for every N tile (the whole K's tables, 4 * K / mu * 2**mu bytes,
    outgrow L2 at mu = 8), at the price of y traffic once per block.
"""

from __future__ import annotations

import math

from qcompile._tvm import Schedule
from qcompile.formats.bcq import WORD_BITS
from qcompile.kernels.bcq.spec import BcqSpec
from targets.hardware import CpuHardware

#: Largest N tile of accumulators per plane.
MAX_N_REG = 8


def chunks_per_word(spec: BcqSpec) -> int:
    """Chunks unrolled together: those of one packed word when mu divides 32, else 1."""
    per_word = WORD_BITS // spec.mu if WORD_BITS % spec.mu == 0 else 1
    return math.gcd(per_word, spec.chunks_per_group)


def schedule_tables(sch: Schedule, spec: BcqSpec, hw: CpuHardware) -> None:
    """``lut``: chunks in parallel, table bits outer, entries vectorized; ``x_sum`` serial."""
    lut = sch.get_sblock("lut")
    m, c, e, j = sch.get_loops(lut)
    lanes = math.gcd(1 << spec.mu, hw.fp32_lanes)
    e_out, e_in = sch.split(e, factors=[None, lanes])
    sch.reorder(m, c, j, e_out, e_in)
    fused = sch.fuse(m, c)
    sch.parallel(fused)
    sch.vectorize(e_in)
    sch.decompose_reduction(lut, j)


def _tile_n(sch: Schedule, loop, spec: BcqSpec, lanes: int, tiles: dict | None):
    n_outer, n_lanes = sch.split(loop, factors=[None, lanes])
    if tiles is None:
        factors = sch.sample_perfect_tile(n_outer, n=3, max_innermost_factor=MAX_N_REG)
    else:
        factors = [None, tiles["n_blk"], tiles["n_reg"]]
    n_par, n_blk, n_reg = sch.split(n_outer, factors=factors)
    return n_par, n_blk, n_reg, n_lanes


def _group_dot_tile(sch: Schedule, spec: BcqSpec, lanes: int, under) -> tuple:
    """``group_dot`` as q x n_reg accumulators at loop ``under``: chunks outer (those of one
    packed word unrolled), planes and columns unrolled, lanes vectorized."""
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, under, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_i, d_n, d_r = sch.get_loops(dot)
    d_reg, d_lanes = sch.split(d_n, factors=[None, lanes])
    r_out, r_in = sch.split(d_r, factors=[None, chunks_per_word(spec)])
    sch.reorder(r_out, r_in, d_g, d_i, d_m, d_reg, d_lanes)
    for loop in (r_in, d_i, d_m, d_reg):
        sch.unroll(loop)
    if lanes > 1:
        sch.vectorize(d_lanes)
    else:
        sch.unroll(d_lanes)
    return dot, r_out


def _register_tile(sch: Schedule, spec: BcqSpec, hw: CpuHardware, lanes: int,
                   tiles: dict | None) -> Schedule:
    """Per N tile, every group: the output tile in registers across the whole of K."""
    schedule_tables(sch, spec, hw)
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes = _tile_n(sch, n, spec, lanes, tiles)
    sch.reorder(n_par, n_blk, g, m, n_reg, n_lanes)
    acc = sch.cache_write(combine, 0, "local")
    sch.reverse_compute_at(acc, n_blk)
    dot, r_out = _group_dot_tile(sch, spec, lanes, g)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    if lanes > 1:
        sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, r_out)
    sch.decompose_reduction(combine, g)
    return sch


def vector_lookup(sch: Schedule, spec: BcqSpec, hw: CpuHardware,
                  tiles: dict | None = None) -> Schedule:
    """Sketch 1: ``lanes`` columns per vector; keys by vector shifts, lookups gathered."""
    return _register_tile(sch, spec, hw, math.gcd(spec.n, hw.fp32_lanes), tiles)


def scalar_lookup(sch: Schedule, spec: BcqSpec, hw: CpuHardware,
                  tiles: dict | None = None) -> Schedule:
    """Sketch 2: one column per lane of work; scalar key, load and add (no gathers)."""
    return _register_tile(sch, spec, hw, 1, tiles)


def k_blocked(sch: Schedule, spec: BcqSpec, hw: CpuHardware,
              tiles: dict | None = None) -> Schedule:
    """Sketch 3: blocks of ``g_in`` groups outside the N tiles (vector lookups); y accumulates
    in memory once per block, and the block's tables (g_in * group_size / mu * 2**mu floats)
    stay in L1/L2 while every N tile of the task reads them."""
    lanes = math.gcd(spec.n, hw.fp32_lanes)
    schedule_tables(sch, spec, hw)
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes = _tile_n(sch, n, spec, lanes, tiles)
    g_factors = sch.sample_perfect_tile(g, n=2) if tiles is None else [None, tiles["g_in"]]
    g_out, g_in = sch.split(g, factors=g_factors)
    sch.reorder(n_par, g_out, n_blk, g_in, m, n_reg, n_lanes)
    dot, r_out = _group_dot_tile(sch, spec, lanes, g_in)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, r_out)
    sch.decompose_reduction(combine, g_out)
    return sch


SKETCHES = (vector_lookup, scalar_lookup, k_blocked)


def design_space(sch: Schedule, spec: BcqSpec, hw: CpuHardware) -> list[Schedule]:
    """Every sketch on a copy of ``sch``, its tile sizes left as sampled decisions."""
    return [sketch(sch.copy(), spec, hw) for sketch in SKETCHES]
