"""CPU design space of the uniform family with int8 activations (compute_int8.py, AVX2).

The loop nest, per parallel task of ``n_blk`` column tiles of ``T = t_u * 8`` columns::

    for g in groups:                          # combine: y tile += scale * (dot - z * xq_sum)
      for c in chunks of the group:           # widen: dot (int32) += vpmaddwd(dot16, 1)
        for r in steps of 4 rows (m_u unrolled):
          for t in t_u (unrolled):            # group_dot16, tensorized:
            unpack 32 codes (shift, AND)      #   dot16[t] += vpmaddubsw(codes, x broadcast)

so ``t_u`` int16 accumulators, ``t_u`` int32 sums and the float32 output tile stay in registers,
and one task streams one contiguous range of each operand (the ``n_tiled`` layout, tile T).

Knobs and the TensorIR loops they size (N = n_par * n_blk * t_u * 8):

=========  =================================================================  ===============
knob       TensorIR loop                                                      QIGen
=========  =================================================================  ===============
t_u        N loop of 8-column vector tiles, unrolled; fixed per sketch (the   t_u, eq. 4
           layout's tile is t_u * 8)
m_u        4-row steps of ``group_dot16`` per unrolled body, a multiple of    m_u, eq. 4
           the field period (categorical)
n_blk      N tiles per parallel task (categorical)                            t_b / T
n_par      N tasks, ``parallel`` over the cores                               threads
=========  =================================================================  ===============

The widths ``t_u`` come from QIGen's register model (eq. 4, as the float32 space's); the seeds
of m_u and n_blk are the best points measured on an AVX2 Zen 3 (m_u 8, 4 tiles per task).
"""

from __future__ import annotations

from dataclasses import dataclass

from qcompile._tvm import Schedule
from qcompile.kernels.layouts import uniform as weight_layout
from qcompile.kernels.tir.planes import STEP
from qcompile.kernels.uniform.compute_int8 import chunk_rows
from qcompile.kernels.uniform.spec import UniformSpec
from schedules import qigen_model as model
from schedules.cpu import int8_dot
from schedules.cpu.uniform import Knob
from schedules.loops import loops_below
from targets.hardware import CpuHardware

#: Columns of one vector tile: 8 int32 lanes (a 256-bit register).
LANES = 8
#: t_u values the space keeps, widest first, and the most accumulator tiles: t_u int16
#: accumulators, t_u unpacked code vectors, the x broadcast and two masks fill AVX2's 16
#: registers at t_u = 4 (t_u = 7 spills and runs slower; docs/results/from-docstrings.md).
MAX_SKETCH_TU = 2
MAX_T_U = 4
#: The measured best unroll and tiles per task, the seeds of m_u and n_blk (fewer, larger tasks
#: pay the per-task set-up less often; docs/design/uniform-cpu.md, the numbers:
#: docs/results/from-docstrings.md).
SEED_M_U = 8
SEED_N_BLK = 4
#: Tasks per core the n_blk seed keeps at least, so that both cores stay busy to the end.
MIN_TASKS_PER_CORE = 8


@dataclass(frozen=True)
class Plan:
    """One sketch: t_u fixed (with the layout), m_u and n_blk knobs."""

    t_u: int
    m_u: Knob
    n_blk: Knob

    @property
    def tile_n(self) -> int:
        return self.t_u * LANES

    def knobs(self) -> tuple[Knob, ...]:
        return (self.m_u, self.n_blk)

    def seed_tiles(self) -> dict:
        """Every knob at its seed, as fixed ``tiles`` (keys: the knobs' names, and t_u)."""
        return {"t_u": self.t_u, **{knob.name: knob.seed for knob in self.knobs()}}


def field_period(bits: int) -> int:
    """4-row steps after which the unpacking's shift counts repeat: the fields of a byte (2
    at 4 bits, 4 at 2 bits), 8 at 3 bits (the high-bit plane holds 8 steps per byte)."""
    return {2: 4, 3: 8, 4: 2}[bits]


def tile_widths(n: int, hw: CpuHardware, multiple_of: int = LANES) -> list[int]:
    """The t_u values of the register model (eq. 4), widest first, at most
    :data:`MAX_SKETCH_TU`: 2..:data:`MAX_T_U` vector tiles whose ``t_u * 8`` columns divide
    ``n`` and are a multiple of ``multiple_of``; possibly none."""
    vectors = n // LANES
    widths = sorted({mk.t_u for mk in model.micro_kernels(hw.vector_registers)
                     if 2 <= mk.t_u <= MAX_T_U and vectors % mk.t_u == 0
                     and mk.t_u * LANES % multiple_of == 0}, reverse=True)
    return widths[:MAX_SKETCH_TU]


def m_u_knob(chunk: int, bits: int, name: str = "m_u") -> Knob:
    """4-row steps per unrolled body for chunks of ``chunk`` rows of ``bits``-bit codes: the
    divisors of the chunk's steps that are whole field periods (constant shift counts), up to
    twice the seed."""
    period = field_period(bits)
    m_us = tuple(d for d in model.divisors(chunk // STEP)
                 if d % period == 0 and d <= 2 * SEED_M_U)
    return Knob(name, m_us, max(d for d in m_us if d <= SEED_M_U))


def n_blk_knob(tiles: int, hw: CpuHardware) -> Knob:
    """Tiles per parallel task, every core a task; the seed keeps
    :data:`MIN_TASKS_PER_CORE` tasks per core."""
    n_blks = tuple(d for d in model.divisors(tiles) if tiles // d >= hw.cores)[:6] or (1,)
    seeds = [d for d in n_blks
             if d <= SEED_N_BLK and tiles // d >= MIN_TASKS_PER_CORE * hw.cores]
    return Knob("n_blk", n_blks, max(seeds, default=n_blks[0]))


def plans(spec: UniformSpec, hw: CpuHardware) -> list[Plan]:
    """The sketches for ``spec`` on ``hw``: t_u from the register model, knobs seeded."""
    m_u = m_u_knob(chunk_rows(spec), spec.bits)
    return [Plan(t_u=t_u, m_u=m_u, n_blk=n_blk_knob(spec.n // (t_u * LANES), hw))
            for t_u in tile_widths(spec.n, hw) or [1]]


@dataclass(frozen=True)
class GroupDot:
    """The blocks and loops :func:`finish_group_dot` needs from :func:`group_dot_nest`."""

    widen: object
    dot16: object
    w_chunk: object
    w_lanes: object
    d_outer: object
    d_lanes: object


def group_dot_nest(sch: Schedule, g, m_u, widen: str = "widen", dot: str = "group_dot16",
                   unpack: str = "unpack") -> GroupDot:
    """The group's integer dot product under group loop ``g``: blocks ``widen`` (per chunk),
    ``dot`` (m_u 4-row steps unrolled, 8-column tiles unrolled) and ``unpack`` (32 codes at a
    time, right before their multiply-add), in registers (local scope)."""
    # widen: per group, loops m g n c h under g (unit loops kept: the nest has one shape).
    widen_block = sch.get_sblock(widen)
    sch.compute_at(widen_block, g, preserve_unit_loops=True)
    sch.set_scope(widen_block, 0, "local")
    *_, w_n, w_chunk, w_pair = loops_below(sch, widen_block, g)
    w_reg, w_lanes = sch.split(w_n, factors=[None, LANES])
    sch.reorder(w_chunk, w_reg, w_lanes, w_pair)

    # group_dot16 per chunk: loops ... n h r e; r split into m_u unrolled steps.
    dot16 = sch.get_sblock(dot)
    sch.compute_at(dot16, w_chunk, preserve_unit_loops=True)
    sch.set_scope(dot16, 0, "local")
    d_n, d_pair, d_steps, d_e = sch.get_loops(dot16)[-4:]
    d_reg, d_lanes = sch.split(d_n, factors=[None, LANES])
    d_outer, d_step = sch.split(d_steps, factors=[None, m_u])
    sch.reorder(d_outer, d_step, d_reg, d_lanes, d_pair, d_e)

    # 32 codes per vector tile, unpacked right before their multiply-add.
    unpack_block = sch.get_sblock(unpack)
    sch.compute_at(unpack_block, d_reg)
    sch.set_scope(unpack_block, 0, "local")
    sch.vectorize(sch.fuse(*sch.get_loops(unpack_block)[-2:]))

    sch.unroll(d_step)
    sch.unroll(d_reg)
    sch.unroll(w_reg)
    return GroupDot(widen_block, dot16, w_chunk, w_lanes, d_outer, d_lanes)


def finish_group_dot(sch: Schedule, nest: GroupDot, combine, g) -> None:
    """Decompose the reductions (the dot's, the widening's, ``combine``'s at group loop ``g``)
    and tensorize the dot and the widening; after ``parallel``, which needs whole reduction
    blocks."""
    sch.decompose_reduction(nest.dot16, nest.d_outer)
    sch.decompose_reduction(nest.widen, nest.w_chunk)
    sch.decompose_reduction(combine, g)
    sch.tensorize(nest.d_lanes, int8_dot.DOT_U8S8_I16)
    sch.tensorize(nest.w_lanes, int8_dot.WIDEN_I16_I32)


def register_tile(sch: Schedule, spec: UniformSpec, hw: CpuHardware,
                  tiles: dict | None = None, plan: Plan | None = None) -> Schedule:
    """The loop nest of the module docstring; ``tiles`` fixes every knob (tests, tools):
    ``{"t_u", "m_u", "n_blk"}``."""
    t_u = tiles["t_u"] if tiles is not None else plan.t_u
    n_blk = tiles["n_blk"] if tiles is not None else plan.n_blk.sample(sch)
    m_u = tiles["m_u"] if tiles is not None else plan.m_u.sample(sch)

    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk_loop, n_reg, n_lanes = sch.split(n, factors=[None, n_blk, t_u, LANES])
    sch.reorder(n_par, n_blk_loop, g, m, n_reg, n_lanes)
    acc = sch.cache_write(combine, 0, "local")
    sch.reverse_compute_at(acc, n_blk_loop)

    nest = group_dot_nest(sch, g, m_u)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    finish_group_dot(sch, nest, combine, g)
    return sch


def with_layout(sch: Schedule, spec: UniformSpec, t_u: int) -> Schedule:
    """``sch`` with the weights rewritten into column tiles of ``t_u * 8`` (layout.py)."""
    weight_layout.apply(sch, spec.n, t_u * LANES)
    return sch


def design_space(sch: Schedule, spec: UniformSpec, hw: CpuHardware) -> list[Schedule]:
    """One ``register_tile`` sketch per t_u, in its tiled layout, m_u and n_blk sampled."""
    return [register_tile(with_layout(sch.copy(), spec, plan.t_u), spec, hw, plan=plan)
            for plan in plans(spec, hw)]


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: CpuHardware) -> Schedule:
    """The seeded point of the widest sketch, without tuning."""
    plan = plans(spec, hw)[0]
    return register_tile(with_layout(sch, spec, plan.t_u), spec, hw, tiles=plan.seed_tiles())
