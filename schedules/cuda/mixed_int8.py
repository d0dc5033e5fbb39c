"""CUDA design space of the mixed family with int8 activations, over compute_cuda_int8.py
(blocks ``x_amax``, ``x_inverse``, ``x_pack``, ``x_qsum``, ``x_step``, ``group_dot2``,
``group_dot4``, ``scale1``, ``combine2``, ``combine4``, ``finish``).

Two kernels per call:

1. **Quantize x** (:func:`quantize_x`): 4 threads per row and g1-group (groups in the format's
   group order), which find the group's max |x| (shuffles), write its g1 activations as int8
   words in storage order and their sum. M x K floats, a few microseconds, mostly launch.
2. **The GEMV**: the float space's thread layout (schedules/cuda/mixed.py: blocks over N tiles,
   ``n_lanes`` threads over N each owning 4 columns, ``k_lanes`` lanes over each part's groups,
   ``load_groups`` groups per step, the lanes' partial sums meeting in shared memory or warp
   shuffles, ``finish`` adding the parts and the column's CSR outliers). Per g1-group a thread
   takes its x words in one 128-bit load (the same for every thread of a warp over N), its
   codes' words in 128-bit loads of 4 columns, sums ``dp4a`` in int32, and applies the zero,
   the (second-order dequantized) scale and x's group scale once.

Sketches and knobs are the float space's (:data:`schedules.cuda.mixed.SKETCHES`: section 5's
``sync``/``async`` dequantization orders, each with K lanes in a warp or across warps).
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.mixed.spec import MixedSpec
from schedules.cuda.common import load_to_registers, read_index, unroll
from schedules.cuda.mixed import (
    K_WARPS,
    SKETCHES,
    every_sketch,
    gemv_layout,
    knob_candidates,
    lane_steps,
    pipeline_steps,
    place_scale1,
    vector_width,
)
from schedules.cuda.mixed import heuristic_knobs as float_heuristic_knobs
from schedules.loops import loops_below
from targets.hardware import GpuHardware

__all__ = ["SKETCHES", "design_space", "heuristic_knobs", "heuristic_schedule", "quantize_x",
           "sketch"]

#: Threads of the quantize-x kernel per (row, g1-group): each reads g1/4 floats of x and
#: writes g1/16 int8 words.
QUANTIZE_LANES = 4
#: (row, g1-group)s per block of the quantize-x kernel, at most: one warp.
QUANTIZE_GROUPS = 8
#: int32 words of x per 128-bit load.
_X_VEC = 4


def quantize_x(sch: Schedule, spec: MixedSpec) -> None:
    """The first kernel: :data:`QUANTIZE_LANES` threads per (row, g1-group) and
    :data:`QUANTIZE_GROUPS` groups per block (``threadIdx.y``). The group's maximum and sum are
    shuffle reductions over its lanes (``threadIdx.x``); lane t writes words t, t + 4, ... of
    the group."""
    groups = spec.m * spec.layout.groups
    per_block = max(v for v in (1, 2, 4, QUANTIZE_GROUPS) if groups % v == 0)
    amax = sch.get_sblock("x_amax")
    m, s, j = sch.get_loops(amax)
    block, group = sch.split(sch.fuse(m, s), factors=[None, per_block])
    sch.bind(block, "blockIdx.x")
    sch.bind(group, "threadIdx.y")
    sch.set_scope(amax, 0, "local")
    sch.bind(sch.split(j, factors=[QUANTIZE_LANES, None])[0], "threadIdx.x")
    for name in ("x_inverse", "x_pack", "x_qsum", "x_step"):
        consumer = sch.get_sblock(name)
        sch.reverse_compute_at(consumer, group, preserve_unit_loops=True)
        if name in ("x_pack", "x_qsum"):
            *_, inner = loops_below(sch, consumer, group)
            lanes, rest = sch.split(inner, factors=[QUANTIZE_LANES, None])
            sch.bind(lanes, "threadIdx.x")
            unroll(sch, rest)
    sch.set_scope(sch.get_sblock("x_inverse"), 0, "local")


def _part(sch: Schedule, spec: MixedSpec, part: str, thread_loop, reductions, rv: dict,
          order: str, k_axis: str):
    """One part's per-lane group loop and cross-lane reduction under ``thread_loop`` (the K
    lanes bound to ``k_axis``); a step of ``load_groups`` groups has its code words requested
    together, before the first dp4a."""
    partial, p_o, group = lane_steps(sch, thread_loop, reductions, rv, k_axis)
    dot = sch.get_sblock(f"group_dot{part}")
    sch.compute_at(dot, group, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    d_m, d_g, d_n, d_r = loops_below(sch, dot, group)
    sch.reorder(d_g, d_r, d_n, d_m)
    unroll(sch, d_g, d_r, d_n, d_m)
    codes = load_to_registers(sch, dot, f"codes{part}", p_o, vector_width(spec))
    # the group's x words: g1/4 int32 per row (g1 is a multiple of 16: the format's rule),
    # 128-bit loads, the same for a whole warp
    load_to_registers(sch, dot, "xq_words", group, _X_VEC, only_block=True)
    if part == "2":
        place_scale1(sch, spec, order, partial, p_o, group)
    else:
        for name in ("scales4", "zeros4"):
            load_to_registers(sch, partial, name, group, vector_width(spec))
    # x's scales and sums of the step's groups: adjacent, one vector load each
    for name in ("x_step", "xq_sum"):
        cache = sch.cache_read(partial, read_index(sch, partial, name), "local",
                               consumer_blocks=[partial])
        sch.compute_at(cache, p_o, preserve_unit_loops=True)
        *rows, groups = loops_below(sch, cache, p_o)
        unroll(sch, *rows)
        sch.vectorize(groups)
    sch.decompose_reduction(dot, d_r)
    sch.decompose_reduction(partial, p_o)
    if order == "async" and part == "2":
        pipeline_steps(sch, p_o, codes, ("scale1", "meta2_local"))
        sch.unroll(p_o)  # registers: the double buffers must be indexed by constants
    return codes


def sketch(sch: Schedule, spec: MixedSpec, hw: GpuHardware, name: str,
           fixed: dict | None = None, prior: dict | None = None) -> Schedule:
    """Sketch ``name`` (a name of :data:`SKETCHES`): the quantize-x kernel, then the float
    space's GEMV layout with this module's dp4a parts; ``fixed`` pins knobs, ``prior`` favours
    values (:func:`schedules.knobs.choose`)."""
    quantize_x(sch, spec)
    return gemv_layout(sch, spec, name, _part, fixed, prior)


def design_space(sch: Schedule, spec: MixedSpec, hw: GpuHardware) -> list[Schedule]:
    """Every sketch, knobs sampled, the heuristic's knobs as priors in its layout."""
    return every_sketch(sch, spec, hw, sketch, heuristic_knobs(spec, hw))


#: The untuned kernel's order and block where it applies: ``async``, 8 K lanes x 16
#: columns-threads, 4 groups a step, the fastest point of a one-row sweep, ahead of the float
#: space's heuristic (measurements: docs/results/from-docstrings.md).
HEURISTIC_ORDER = "async"
HEURISTIC_K_LANES = 8
HEURISTIC_N_LANES = 16
#: Most 2-bit steps a lane's fully unrolled ``async`` loop may hold (12 at the point above:
#: 95 registers); past it the float space's ``sync`` heuristic is used.
HEURISTIC_MAX_STEPS = 12


def heuristic_knobs(spec: MixedSpec, hw: GpuHardware) -> tuple[str, dict[str, int]]:
    """A sketch and knobs that are valid and reasonable without tuning: ``async+k_warps`` with
    the fewest K lanes, from :data:`HEURISTIC_K_LANES`, whose lanes each unroll at most
    :data:`HEURISTIC_MAX_STEPS` steps of 2-bit groups, :data:`HEURISTIC_N_LANES` threads over N
    (fewer when the grid would not give every SM a block) and 4 groups a step, at M = 1; for
    M > 1, or where no K lanes fit, the float space's ``sync`` heuristic
    (schedules/cuda/mixed.py)."""
    cands = knob_candidates(spec)
    load_groups = max([v for v in cands["load_groups"] if v <= max(1, 4 // spec.m)] or [1])
    fitting = [v for v in cands["n_lanes"] if v <= HEURISTIC_N_LANES]
    n_lanes = max(fitting or [1])
    columns = spec.n // vector_width(spec)
    while n_lanes > 1 and columns // n_lanes < hw.sm_count and n_lanes // 2 in fitting:
        n_lanes //= 2
    steps_of = {k: spec.layout.groups2 // (k * load_groups) for k in cands["k_lanes"]
                if k >= HEURISTIC_K_LANES and spec.layout.groups2 % (k * load_groups) == 0
                and spec.layout.groups4 % (k * load_groups) == 0}
    short = [k for k, steps in steps_of.items() if steps <= HEURISTIC_MAX_STEPS]
    if spec.m > 1 or not short:  # each row's x words and sums double the unrolled registers
        return float_heuristic_knobs(spec, hw)
    knobs = {"k_lanes": min(short), "n_lanes": n_lanes, "load_groups": load_groups,
             "unroll": 64}
    return HEURISTIC_ORDER + K_WARPS, knobs


def heuristic_schedule(sch: Schedule, spec: MixedSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs`."""
    name, knobs = heuristic_knobs(spec, hw)
    return sketch(sch, spec, hw, name, knobs)
