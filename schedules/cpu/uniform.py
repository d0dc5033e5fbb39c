"""CPU design space of the uniform family (llvm: AVX2 / AVX-512).

The loop nest is QIGen's micro-kernel over the factorised compute (qcompile/kernels/uniform/
compute.py): a tile of ``n_reg`` vector accumulators along N stays in registers while the packed
words of one group stream through; each word yields ``fields`` codes, each folded into the tile
with AND, convert, FMA; once per group the tile is scaled into the output accumulators.

Knobs (sampled decisions, replayable from a trace) and the TensorIR loops they size:

==========  ==========================================================  ==========================
knob        TensorIR loop                                               QIGen
==========  ==========================================================  ==========================
lanes       innermost N loop of ``group_dot``/``combine``, vectorized   vector width (ISA, fixed)
n_reg       N loop of vector accumulators, unrolled                     t_u (y registers)
n_blk       N tiles per parallel task                                   t_b = n_blk * n_reg * lanes
n_par       N tasks, ``parallel`` over the cores                        threads
g_in        groups per K block (sketch ``k_blocked`` only)              m_b = g_in * group_size
fields      K loop inside one packed word, unrolled (fixed by bits)     m_u
==========  ==========================================================  ==========================

Sketches:

``register_tile``
    For one N tile, every group: the output tile accumulates in registers (a local cache of
    ``combine``), ``dot`` is a register tile recomputed per group.
``k_blocked``
    K blocks of ``g_in`` groups outside the N tiles, y updated in memory once per block: the
    block's x and its packed rows stay in L1 (QIGen's mini-GEMV), at the price of y traffic.
"""

from __future__ import annotations

import math

from qcompile._tvm import Schedule
from qcompile.kernels.uniform.compute import fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec
from targets.hardware import CpuHardware

#: Largest N tile of vector accumulators (the rest of the registers hold words, masks and x).
MAX_N_REG = 8


def vector_lanes(spec: UniformSpec, hw: CpuHardware) -> int:
    """fp32 lanes of the innermost loop: the ISA's width, or less when N is not a multiple."""
    return math.gcd(spec.n, hw.fp32_lanes)


def _tile_n(sch: Schedule, loop, spec: UniformSpec, hw: CpuHardware, tiles: dict | None):
    """Split N into (n_par, n_blk, n_reg, lanes); ``tiles`` fixes the decisions (tests, tools)."""
    lanes = vector_lanes(spec, hw)
    n_outer, n_lanes = sch.split(loop, factors=[None, lanes])
    if tiles is None:
        factors = sch.sample_perfect_tile(n_outer, n=3, max_innermost_factor=MAX_N_REG)
    else:
        factors = [None, tiles["n_blk"], tiles["n_reg"]]
    n_par, n_blk, n_reg = sch.split(n_outer, factors=factors)
    return n_par, n_blk, n_reg, n_lanes, lanes


def _micro_kernel(sch: Schedule, spec: UniformSpec, lanes: int, under):
    """``group_dot`` as a register tile at loop ``under``: words outer, fields unrolled.

    Returns the block and its words loop, where its reduction is decomposed once every loop is
    annotated (``parallel`` refuses a loop over an already decomposed reduction).
    """
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, under)
    sch.set_scope(dot, 0, "local")
    *_, n, r = sch.get_loops(dot)
    n_reg, n_lanes = sch.split(n, factors=[None, lanes])
    words, fields = sch.split(r, factors=[None, fields_per_word(spec.bits)])
    sch.reorder(words, n_reg, fields, n_lanes)
    sch.unroll(fields)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    return dot, words


def _has_output_cast(spec: UniformSpec) -> bool:
    """float16/bfloat16 and fused-gather kernels accumulate in float32 and end with ``cast_y``."""
    return spec.dtype != "float32" or spec.act_order


def register_tile(sch: Schedule, spec: UniformSpec, hw: CpuHardware,
                  tiles: dict | None = None) -> Schedule:
    """Sketch 1: output tile in registers across all groups of one N tile."""
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes, lanes = _tile_n(sch, n, spec, hw, tiles)
    sch.reorder(n_par, n_blk, g, m, n_reg, n_lanes)
    acc = sch.cache_write(combine, 0, "local")
    sch.reverse_compute_at(acc, n_blk)
    if _has_output_cast(spec):  # convert where the register tile is written back
        sch.reverse_compute_inline(sch.get_sblock("cast_y"))
    dot, words = _micro_kernel(sch, spec, lanes, g)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(combine, g)
    return sch


def k_blocked(sch: Schedule, spec: UniformSpec, hw: CpuHardware,
              tiles: dict | None = None) -> Schedule:
    """Sketch 2: blocks of ``g_in`` groups outside the N tiles; y accumulates in memory."""
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes, lanes = _tile_n(sch, n, spec, hw, tiles)
    if tiles is None:
        g_factors = sch.sample_perfect_tile(g, n=2)
    else:
        g_factors = [None, tiles["g_in"]]
    g_out, g_in = sch.split(g, factors=g_factors)
    sch.reorder(n_par, g_out, n_blk, g_in, m, n_reg, n_lanes)
    dot, words = _micro_kernel(sch, spec, lanes, g_in)
    if _has_output_cast(spec):  # convert each task's slice once its K blocks are done
        sch.reverse_compute_at(sch.get_sblock("cast_y"), n_par)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(combine, g_out)
    return sch


SKETCHES = (register_tile, k_blocked)


def design_space(sch: Schedule, spec: UniformSpec, hw: CpuHardware) -> list[Schedule]:
    """Every sketch on a copy of ``sch``, with its tile sizes left as sampled decisions."""
    return [sketch(sch.copy(), spec, hw) for sketch in SKETCHES]
