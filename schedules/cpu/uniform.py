"""CPU design space of the uniform family (llvm: AVX2 / AVX-512), constrained and seeded by
QIGen's performance model (schedules/qigen_model.py).

The loop nest is QIGen's micro-kernel over the factorised compute (qcompile/kernels/uniform/
compute.py): a tile of ``t_u`` vector accumulators along N stays in registers while the packed
words of one group stream through; each word yields ``fields`` codes, each folded into the tile
with AND, convert, FMA; once per group the tile is scaled into the output accumulators (eq. 2;
eq. 1 with group_size -1: one group, one scaling per column).

Knobs and the TensorIR loops they size (N = n_par * n_blk * t_u * lanes):

==========  ==========================================================  ==========================
knob        TensorIR loop                                               QIGen
==========  ==========================================================  ==========================
lanes       innermost N loop of ``group_dot``/``combine``, vectorized   vector width (ISA, fixed)
t_u         N loop of vector accumulators, unrolled; fixed per sketch   t_u, eq. 4 (y registers)
            (it is the weight layout's tile: T = t_u * lanes)
m_u         packed units (words; 3-word blocks for 3 bits) per micro    m_u, eq. 4 (m_u * t_u
            step: inner split of ``group_dot``'s word loop, unrolled    weight registers)
fields      K loop inside one packed unit, unrolled (fixed by bits)     codes per word
n_blk       N tiles per parallel task (categorical)                     t_b = n_blk * t_u * lanes
n_par       N tasks, ``parallel`` over the cores (N / the rest)         threads
g_in        groups per K block (sketch ``k_blocked``; categorical)      m_b = g_in * group_size
==========  ==========================================================  ==========================

How the model shapes the space (:func:`plans`):

* eq. 4 (exhaustive search, :func:`qigen_model.micro_kernels`): the maximal (m_u, t_u) pairs for
  eta registers; the widest ``t_u`` values that divide N / lanes (at most :data:`MAX_SKETCH_TU`,
  each at least 2) give one sketch pair each, and ``m_u`` is a knob over the divisors of the
  units per group up to the pair's m_u.
* eq. 5 (integer program, :func:`qigen_model.mini_gemv`): the (m_b, t_b) that best fills L1
  seeds ``g_in`` and ``n_blk``: each knob's candidates are the admissible values (divisors that
  leave every core a task), and the model's value gets half the sampling probability, so the
  initial population of the evolutionary search is centred on the model's point and the
  mutators explore around it.
* the weight layout: every sketch rewrites qweight, scales and zeros into column tiles of
  ``t_u * lanes`` (``transform_layout``; qcompile/kernels/layouts/uniform.py), so that one task
  streams one contiguous range. The layout is in the trace, hence in the record; ``build``
  writes it into the manifest and ``Kernel.prepare`` packs the weights for it.

Sketches:

``register_tile``
    For one N tile, every group: the output tile accumulates in registers (a local cache of
    ``combine``), ``dot`` is a register tile recomputed per group.
``k_blocked``
    K blocks of ``g_in`` groups outside the N tiles, y updated in memory once per block: the
    block's x and its packed rows stay in L1 (QIGen's mini-GEMV), at the price of y traffic.

``tiles`` (tests, tools) fixes every decision instead: ``{"n_blk", "n_reg", "g_in", "m_u"}``,
with GPTQ's layout unless the caller applied one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qcompile._tvm import Schedule
from qcompile.kernels.layouts import uniform as weight_layout
from qcompile.kernels.tir.codes import fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec
from schedules import qigen_model as model
from targets.hardware import CpuHardware

#: Largest N tile of vector accumulators (the rest of the registers hold words, masks and x).
MAX_N_REG = 8

#: Micro-kernel widths (t_u values) the space keeps, widest first; each gives two sketches.
MAX_SKETCH_TU = 2

#: Most candidates a categorical knob offers (the ones nearest the model's value).
MAX_CANDIDATES = 8

#: Probability mass of the model's value in each knob's prior.
SEED_WEIGHT = 0.5


def vector_lanes(spec: UniformSpec, hw: CpuHardware) -> int:
    """fp32 lanes of the innermost loop: the ISA's width, or less when N is not a multiple."""
    return math.gcd(spec.n, hw.fp32_lanes)


def units_per_group(spec: UniformSpec) -> int:
    """Packed units (words; 3-word blocks for 3 bits) along K in one group."""
    return spec.effective_group_size // fields_per_word(spec.bits)


@dataclass(frozen=True)
class Knob:
    """A categorical decision: its candidates and the model's value (the seed)."""

    name: str
    values: tuple[int, ...]
    seed: int

    def sample(self, sch: Schedule):
        probs = model.seeded_prior(list(self.values), self.seed, SEED_WEIGHT)
        return sch.sample_categorical(list(self.values), probs)


@dataclass(frozen=True)
class Plan:
    """One micro-kernel's share of the space: t_u fixed (with the layout), the rest knobs."""

    micro: model.MicroKernel
    lanes: int
    m_u: Knob
    n_blk: Knob
    g_in: Knob
    mini: model.MiniGemv

    @property
    def tile_n(self) -> int:
        """Columns of the layout tile and of the accumulator tile: t_u * lanes."""
        return self.micro.t_u * self.lanes

    def seed_tiles(self) -> dict:
        """The model's point as fixed ``tiles``."""
        return {"n_reg": self.micro.t_u, "n_blk": self.n_blk.seed, "g_in": self.g_in.seed,
                "m_u": self.m_u.seed}


def _nearest(values: list[int], seed: int, count: int) -> tuple[int, ...]:
    """The ``count`` values nearest ``seed`` on a log scale, ascending."""
    ranked = sorted(values, key=lambda v: (abs(math.log(v / seed)), v))
    return tuple(sorted(ranked[:count]))


def plans(spec: UniformSpec, hw: CpuHardware) -> list[Plan]:
    """The model's micro-kernels for ``spec`` on ``hw``, each with its seeded knobs."""
    lanes = vector_lanes(spec, hw)
    vectors = spec.n // lanes
    micro = [mk for mk in model.micro_kernels(hw.vector_registers)
             if mk.t_u >= 2 and vectors % mk.t_u == 0 and mk.t_u <= MAX_N_REG]
    if not micro:
        micro = [model.MicroKernel(1, 1)]
    units = units_per_group(spec)
    rows_per_unit = fields_per_word(spec.bits)
    gsize, groups = spec.effective_group_size, spec.groups
    out = []
    for mk in micro[:MAX_SKETCH_TU]:
        m_us = [d for d in model.divisors(units) if d <= mk.m_u]
        tile = mk.t_u * lanes
        tiles = spec.n // tile
        # Every core gets at least one task; a task holds n_blk tiles.
        n_blks = [d for d in model.divisors(tiles) if tiles // d >= hw.cores] or [1]
        g_ins = model.divisors(groups)
        mini = model.mini_gemv(hw.gamma_bits, spec.bits, [g * gsize for g in g_ins],
                               [b * tile for b in n_blks])
        assert mini.m_b % (m_us[-1] * rows_per_unit) == 0  # eq. 5's m_b mod m_u = 0
        n_blk_seed = mini.t_b // tile
        g_in_seed = mini.m_b // gsize
        out.append(Plan(
            micro=mk, lanes=lanes, mini=mini,
            m_u=Knob("m_u", tuple(m_us), m_us[-1]),
            n_blk=Knob("n_blk", _nearest(n_blks, n_blk_seed, MAX_CANDIDATES), n_blk_seed),
            g_in=Knob("g_in", _nearest(g_ins, g_in_seed, MAX_CANDIDATES), g_in_seed),
        ))
    return out


def _tile_n(sch: Schedule, loop, spec: UniformSpec, hw: CpuHardware, tiles: dict | None,
            plan: Plan | None):
    """Split N into (n_par, n_blk, n_reg, lanes): fixed by ``tiles``, else t_u from ``plan`` and
    n_blk its knob."""
    lanes = vector_lanes(spec, hw)
    n_outer, n_lanes = sch.split(loop, factors=[None, lanes])
    if tiles is not None:
        factors = [None, tiles["n_blk"], tiles["n_reg"]]
    else:
        factors = [None, plan.n_blk.sample(sch), plan.micro.t_u]
    n_par, n_blk, n_reg = sch.split(n_outer, factors=factors)
    return n_par, n_blk, n_reg, n_lanes, lanes


def _micro_kernel(sch: Schedule, spec: UniformSpec, lanes: int, under, m_u):
    """``group_dot`` as a register tile at loop ``under``: units outer, m_u units and their
    fields unrolled.

    Returns the block and its outer units loop, where its reduction is decomposed once every
    loop is annotated (``parallel`` refuses a loop over an already decomposed reduction).
    """
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, under)
    sch.set_scope(dot, 0, "local")
    *_, n, r = sch.get_loops(dot)
    n_reg, n_lanes = sch.split(n, factors=[None, lanes])
    words, fields = sch.split(r, factors=[None, fields_per_word(spec.bits)])
    if isinstance(m_u, int) and m_u == 1:
        sch.reorder(words, n_reg, fields, n_lanes)
    else:
        words, step = sch.split(words, factors=[None, m_u])
        sch.reorder(words, step, n_reg, fields, n_lanes)
        sch.unroll(step)
    sch.unroll(fields)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    return dot, words


def _m_u(tiles: dict | None, plan: Plan | None, sch: Schedule):
    if tiles is not None:
        return int(tiles.get("m_u", 1))
    return plan.m_u.sample(sch)


def _has_output_cast(spec: UniformSpec) -> bool:
    """float16/bfloat16 and fused-gather kernels accumulate in float32 and end with ``cast_y``."""
    return spec.dtype != "float32" or spec.act_order


def register_tile(sch: Schedule, spec: UniformSpec, hw: CpuHardware,
                  tiles: dict | None = None, plan: Plan | None = None) -> Schedule:
    """Sketch 1: output tile in registers across all groups of one N tile."""
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes, lanes = _tile_n(sch, n, spec, hw, tiles, plan)
    sch.reorder(n_par, n_blk, g, m, n_reg, n_lanes)
    acc = sch.cache_write(combine, 0, "local")
    sch.reverse_compute_at(acc, n_blk)
    if _has_output_cast(spec):  # convert where the register tile is written back
        sch.reverse_compute_inline(sch.get_sblock("cast_y"))
    dot, words = _micro_kernel(sch, spec, lanes, g, _m_u(tiles, plan, sch))
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(combine, g)
    return sch


def k_blocked(sch: Schedule, spec: UniformSpec, hw: CpuHardware,
              tiles: dict | None = None, plan: Plan | None = None) -> Schedule:
    """Sketch 2: blocks of ``g_in`` groups outside the N tiles; y accumulates in memory."""
    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_par, n_blk, n_reg, n_lanes, lanes = _tile_n(sch, n, spec, hw, tiles, plan)
    g_in_factor = tiles["g_in"] if tiles is not None else plan.g_in.sample(sch)
    g_out, g_in = sch.split(g, factors=[None, g_in_factor])
    sch.reorder(n_par, g_out, n_blk, g_in, m, n_reg, n_lanes)
    dot, words = _micro_kernel(sch, spec, lanes, g_in, _m_u(tiles, plan, sch))
    if _has_output_cast(spec):  # convert each task's slice once its K blocks are done
        sch.reverse_compute_at(sch.get_sblock("cast_y"), n_par)
    sch.parallel(n_par)
    sch.unroll(n_reg)
    sch.vectorize(n_lanes)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(combine, g_out)
    return sch


SKETCHES = (register_tile, k_blocked)


def with_layout(sch: Schedule, spec: UniformSpec, plan: Plan) -> Schedule:
    """``sch`` with the weights rewritten into ``plan``'s column tiles (layout.py)."""
    weight_layout.apply(sch, spec.n, plan.tile_n)
    return sch


def design_space(sch: Schedule, spec: UniformSpec, hw: CpuHardware) -> list[Schedule]:
    """For each model micro-kernel, every sketch on a copy of ``sch`` in its tiled layout, with
    n_blk, m_u and g_in left as seeded categorical decisions."""
    return [sketch(with_layout(sch.copy(), spec, plan), spec, hw, plan=plan)
            for plan in plans(spec, hw) for sketch in SKETCHES]


def heuristic_schedule(sch: Schedule, spec: UniformSpec, hw: CpuHardware) -> Schedule:
    """The model's point without tuning: the widest micro-kernel, register_tile, seeded knobs."""
    plan = plans(spec, hw)[0]
    return register_tile(with_layout(sch, spec, plan), spec, hw, tiles=plan.seed_tiles())
