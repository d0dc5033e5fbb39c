"""CPU design space of the mixed family with int8 activations (kernels/mixed/compute_int8.py).

The float32 mixed space's tiling (schedules/cpu/mixed.py: N tiles in parallel, per tile the
2-bit part, then the 4-bit part, then the CSR outliers, weights in the ``n_tiled`` layout of
the accumulator tile) around the uniform int8 space's micro-kernel (schedules/cpu/
uniform_int8.py), once per part. Per parallel task of ``n_blk`` tiles of ``T = t_u * 8``
columns::

    for part in (2-bit, 4-bit):
      for s in the part's g1-groups:        # combine: y tile += s * amax/127 * (dot - z * xq_sum)
        (2-bit: the group's scales, second-order dequantized into registers, block scale1)
        for c in chunks of the group:       # widen: dot (int32) += vpmaddwd(dot16, 1)
          for r in steps of 4 rows (m_u unrolled):
            for t in t_u (unrolled):        # group_dot, tensorized:
              unpack 32 codes (shift, AND)  #   dot16[t] += vpmaddubsw(codes, x broadcast)
    finish: y = y2 + y4 + the columns' outliers (float x)

x is rounded to int8 (blocks ``x_amax``, ``x_quant2/4``, ``x_qsum2/4``) once per call before
the parallel loop, as in the uniform int8 kernel.

Knobs (categorical, :class:`schedules.cpu.uniform.Knob`; candidates from uniform_int8's plan
helpers):

=========  ===================================================================
knob       TensorIR loop
=========  ===================================================================
t_u        8-column vector tiles per tile, unrolled; fixed per sketch (the layout's tile
           is t_u * 8, a multiple of g2)
m_u2       4-row steps of the 2-bit ``group_dot2`` per unrolled body (whole field periods)
m_u4       the same for the 4-bit ``group_dot4``
n_blk      N tiles per parallel task
n_par      N tasks, ``parallel`` over the cores
=========  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from qcompile._tvm import Schedule
from qcompile.kernels.layouts import mixed as weight_layout
from qcompile.kernels.mixed.spec import MixedSpec
from qcompile.kernels.tir.int8_dot import chunk_rows_for
from schedules.cpu import uniform_int8
from schedules.cpu.mixed import scales_in_registers
from schedules.cpu.uniform import Knob
from schedules.cpu.uniform_int8 import LANES, m_u_knob, n_blk_knob, tile_widths
from schedules.loops import loops_below
from targets.hardware import CpuHardware


@dataclass(frozen=True)
class Plan(uniform_int8.Plan):
    """One sketch: uniform_int8's plan, whose ``m_u`` is the 2-bit part's knob (named m_u2),
    with the 4-bit part's ``m_u4``; ``tiled``: whether t_u * 8 columns hold whole g2 groups
    (the layout applies)."""

    m_u4: Knob | None = None
    tiled: bool = True

    def knobs(self) -> tuple[Knob, ...]:
        return (self.m_u, self.m_u4, self.n_blk)


def plans(spec: MixedSpec, hw: CpuHardware) -> list[Plan]:
    """The sketches for ``spec`` on ``hw``: the uniform int8 space's t_u widths whose tile holds
    whole second-order groups, else one sketch of t_u = 1 (in the format's layout when 8
    columns are not whole g2 groups), knobs seeded."""
    m_u2 = m_u_knob(chunk_rows_for(spec.g1, 2), 2, "m_u2")
    m_u4 = m_u_knob(chunk_rows_for(spec.g1, 4), 4, "m_u4")
    widths = tile_widths(spec.n, hw, multiple_of=spec.g2) or [1]
    return [Plan(t_u=t_u, m_u=m_u2, m_u4=m_u4, n_blk=n_blk_knob(spec.n // (t_u * LANES), hw),
                 tiled=t_u * LANES % spec.g2 == 0)
            for t_u in widths]


def _part(sch: Schedule, spec: MixedSpec, part: str, under, m_u):
    """Part ``part`` ("2" or "4") of the tile at loop ``under``: its combine in registers per
    g1-group, uniform_int8's group-dot nest with the part's blocks under the group loop.
    Returns the function that decomposes its reductions and tensorizes (after ``parallel``,
    which needs whole reduction blocks)."""
    combine = sch.get_sblock(f"combine{part}")
    sch.compute_at(combine, under, preserve_unit_loops=True)
    sch.set_scope(combine, 0, "local")
    c_m, c_n, g = loops_below(sch, combine, under)
    c_reg, c_lanes = sch.split(c_n, factors=[None, LANES])
    sch.reorder(g, c_m, c_reg, c_lanes)

    nest = uniform_int8.group_dot_nest(sch, g, m_u, widen=f"widen{part}",
                                       dot=f"group_dot{part}", unpack=f"unpack{part}")
    if part == "2":
        scales_in_registers(sch, spec, g, LANES)
    sch.unroll(c_reg)
    sch.vectorize(c_lanes)
    return lambda: uniform_int8.finish_group_dot(sch, nest, combine, g)


def register_tile(sch: Schedule, spec: MixedSpec, hw: CpuHardware,
                  tiles: dict | None = None, plan: Plan | None = None) -> Schedule:
    """The loop nest of the module docstring; ``tiles`` fixes every knob (tests, tools):
    ``{"t_u", "m_u2", "m_u4", "n_blk"}``, in whatever layout the caller applied."""
    t_u = tiles["t_u"] if tiles is not None else plan.t_u
    n_blk = tiles["n_blk"] if tiles is not None else plan.n_blk.sample(sch)
    m_u2 = tiles["m_u2"] if tiles is not None else plan.m_u.sample(sch)
    m_u4 = tiles["m_u4"] if tiles is not None else plan.m_u4.sample(sch)

    finish = sch.get_sblock("finish")
    m, n = sch.get_loops(finish)
    n_par, n_blk_loop, n_tile = sch.split(n, factors=[None, n_blk, t_u * LANES])
    sch.reorder(n_par, n_blk_loop, m, n_tile)
    finishes = [_part(sch, spec, "2", n_blk_loop, m_u2), _part(sch, spec, "4", n_blk_loop, m_u4)]
    sch.parallel(n_par)
    for finish_part in finishes:
        finish_part()
    return sch


def with_layout(sch: Schedule, spec: MixedSpec, t_u: int) -> Schedule:
    """``sch`` with both parts' codes (byte planes), scales and zeros rewritten into column
    tiles of ``t_u * 8`` (kernels/layouts/mixed.py)."""
    weight_layout.apply(sch, spec.n, spec.g2, t_u * LANES)
    return sch


def _laid_out(sch: Schedule, spec: MixedSpec, plan: Plan) -> Schedule:
    return with_layout(sch, spec, plan.t_u) if plan.tiled else sch


def design_space(sch: Schedule, spec: MixedSpec, hw: CpuHardware) -> list[Schedule]:
    """One ``register_tile`` sketch per t_u, in its tiled layout, the other knobs sampled."""
    return [register_tile(_laid_out(sch.copy(), spec, plan), spec, hw, plan=plan)
            for plan in plans(spec, hw)]


def heuristic_schedule(sch: Schedule, spec: MixedSpec, hw: CpuHardware) -> Schedule:
    """The seeded point of the widest sketch, without tuning."""
    plan = plans(spec, hw)[0]
    return register_tile(_laid_out(sch, spec, plan), spec, hw, tiles=plan.seed_tiles())
