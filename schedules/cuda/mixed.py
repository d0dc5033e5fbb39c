"""CUDA design space of the mixed family (qcompile/kernels/mixed/compute.py), one kernel:
both parts, the second-order scale dequantization and the CSR outliers in one launch.

Blocks run over N tiles (``blockIdx.x``); in a block, ``n_lanes`` threads over N
(``threadIdx.y``), each owning ``vec`` adjacent columns (their packed words arrive in one 128-bit
load per packed row), and ``k_lanes`` lanes of a warp over the groups (``threadIdx.x``): lane t
takes groups t, t + k_lanes, ... of each part, sums them in registers (an rfactor of
``combine2``/``combine4``), and the lanes meet in a warp-shuffle reduction into shared memory;
``finish`` adds the parts and walks the column's CSR outliers. x is read through the group order
from global memory (L1-resident); group sums are formed per group by the lane that uses them.

Section 5's dequantization order is the structural knob ``order`` (one design space each):

``sync``
    a 2-bit group's first-order scale is dequantized where it is used, after the group's dot
    product: its three loads (s1q, the second-order zero and scale) and the arithmetic wait
    behind the weights' decode (the synchronous dataflow the paper measures against).
``async``
    each lane's group loop is software-pipelined (:func:`_pipeline`): the next group's packed
    words are requested (128-bit loads into a second register buffer) and its first-order
    scales dequantized from the second-order ones (``scale1``, registers) while the current
    group is decoded: the scale arithmetic and the decode overlap the weights' loads.

Knobs (categorical decisions):

==========  ================================================  =========================
knob        TensorIR loop                                     candidates
==========  ================================================  =========================
k_lanes     ``combine2``/``combine4`` g -> (steps, lanes),    1, 2, 4, ... 32 dividing
            rfactor, shuffle reduction                        both parts' group counts
n_lanes     ``finish`` n -> threadIdx.y                       1, 2, 4, ... 256
unroll      ``pragma_auto_unroll_max_step`` on the group      0, 64, 512
            steps
==========  ================================================  =========================
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.mixed.spec import MixedSpec
from schedules.cuda.common import load_to_registers, unroll
from schedules.knobs import choose
from schedules.loops import loops_below
from targets.hardware import GpuHardware

K_LANES = (1, 2, 4, 8, 16, 32)
N_LANES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
UNROLL = (0, 64, 512)
ORDERS = ("sync", "async")

_FIELDS = {"2": 16, "4": 8}


def vector_width(spec: MixedSpec) -> int:
    """Columns per thread: 4 (one 128-bit load of int32 words per packed row) when N allows."""
    for width in (4, 2):
        if spec.n % width == 0:
            return width
    return 1


def knob_candidates(spec: MixedSpec) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``: each divides the loop it splits."""
    lay = spec.layout
    columns = spec.n // vector_width(spec)
    return {
        "k_lanes": [v for v in K_LANES if lay.groups2 % v == 0 and lay.scale_groups4 % v == 0],
        "n_lanes": [v for v in N_LANES if columns % v == 0],
        "unroll": list(UNROLL),
    }


def _rfactor(sch: Schedule, part: str, k_lanes):
    """Split ``combine<part>``'s groups over ``k_lanes`` lanes and rfactor them out, at the
    root (rfactor wants the reduction first under its outermost loop). Returns (partial sums,
    cross-lane reduction)."""
    combine = sch.get_sblock(f"combine{part}")
    _, _, g = sch.get_loops(combine)
    _, g_t = sch.split(g, factors=[None, k_lanes])
    partial = sch.rfactor(g_t, factor_axis=0)
    return partial, combine


def _part(sch: Schedule, spec: MixedSpec, part: str, thread_loop, reductions, unroll_step,
          order: str):
    """One part's per-lane group loop and cross-lane reduction under ``thread_loop``."""
    partial, combine = reductions
    sch.compute_at(combine, thread_loop, preserve_unit_loops=True)
    sch.set_scope(combine, 0, "shared")
    f_t, f_m, f_n = loops_below(sch, combine, thread_loop)  # rfactor put the lanes first
    sch.reorder(f_m, f_n, f_t)  # the reduced thread loop must be innermost
    sch.bind(f_t, "threadIdx.x")
    sch.compute_at(partial, thread_loop, preserve_unit_loops=True)
    sch.set_scope(partial, 0, "local")
    p_loops = loops_below(sch, partial, thread_loop)
    p_t, p_m, p_n, p_o = p_loops
    sch.reorder(p_t, p_o, p_m, p_n)
    sch.bind(p_t, "threadIdx.x")
    unroll(sch, p_m, p_n)
    sch.annotate(p_o, "pragma_auto_unroll_max_step", unroll_step)
    sch.annotate(p_o, "pragma_unroll_explicit", 1)

    sch.compute_inline(sch.get_sblock(f"gather{part}"))
    dot = sch.get_sblock(f"group_dot{part}")
    sch.compute_at(dot, p_o, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    d_m, d_g, d_n, d_r = loops_below(sch, dot, p_o)
    words, fields = sch.split(d_r, factors=[None, _FIELDS[part]])
    sch.reorder(d_g, words, fields, d_n, d_m)
    unroll(sch, d_g, words, fields, d_n, d_m)
    codes = load_to_registers(sch, dot, f"codes{part}", p_o, vector_width(spec))
    total = sch.get_sblock(f"group_sum{part}")
    sch.compute_at(total, p_o, preserve_unit_loops=True)
    sch.set_scope(total, 0, "local")
    unroll(sch, *loops_below(sch, total, p_o))
    if part == "2":
        scale = sch.get_sblock("scale1")
        if order == "sync":
            sch.compute_inline(scale)
        else:
            sch.compute_at(scale, p_o, preserve_unit_loops=True)
            sch.set_scope(scale, 0, "local")
            unroll(sch, *loops_below(sch, scale, p_o))
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(partial, p_o)
    if order == "async":
        _pipeline(sch, p_o, codes, "scale1" if part == "2" else None)
    return codes


def _pipeline(sch: Schedule, loop, codes, scale_name):
    """Software-pipeline a lane's group loop in two stages: stage 0 requests the next group's
    packed words (128-bit loads into a second register buffer) and then dequantizes its
    first-order scales from the second-order ones; stage 1 decodes and accumulates this group.
    So the scale arithmetic and the current group's work run while the next words are in
    flight (section 5's overlap, with registers where the paper stages in shared memory)."""
    names = [sch.get(block).name_hint for block in sch.get_child_blocks(loop)]
    names = [name for name in names if not name.endswith("_init")]  # merged by lowering
    early = [sch.get(codes).name_hint] + ([scale_name] if scale_name else [])
    stages = [0 if name in early else 1 for name in names]
    order = sorted(range(len(names)), key=lambda i: (stages[i], i))
    sch.annotate(loop, "software_pipeline_stage", stages)
    sch.annotate(loop, "software_pipeline_order", [order.index(i) for i in range(len(names))])


def sketch(sch: Schedule, spec: MixedSpec, hw: GpuHardware, order: str,
           fixed: dict | None = None) -> Schedule:
    """The layout above with dequantization ``order`` ("sync"/"async"); ``fixed`` pins knobs."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    cands = knob_candidates(spec)
    rv = {name: choose(sch, name, cands[name], fixed) for name in ("k_lanes", "n_lanes",
                                                                  "unroll")}
    vec = vector_width(spec)
    finish = sch.get_sblock("finish")
    m, n = sch.get_loops(finish)
    n_b, n_t, n_e = sch.split(n, factors=[None, rv["n_lanes"], vec])
    sch.reorder(n_b, n_t, m, n_e)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(n_t, "threadIdx.y")
    reductions = {part: _rfactor(sch, part, rv["k_lanes"]) for part in ("2", "4")}
    for part in ("2", "4"):
        _part(sch, spec, part, n_t, reductions[part], rv["unroll"], order)
    # finish: the thread's M x vec outputs shared among its k lanes (one writer per output)
    _, f_lane = sch.split(sch.fuse(m, n_e), factors=[None, rv["k_lanes"]])
    sch.bind(f_lane, "threadIdx.x")
    return sch


def design_space(sch: Schedule, spec: MixedSpec, hw: GpuHardware) -> list[Schedule]:
    """Both dequantization orders, knobs sampled."""
    return [sketch(sch.copy(), spec, hw, order) for order in ORDERS]


def heuristic_schedule(sch: Schedule, spec: MixedSpec, hw: GpuHardware,
                       order: str = "async") -> Schedule:
    """A valid schedule without tuning: 8 lanes over groups (or the most that divide), 32
    threads over N (or the most that divide)."""
    cands = knob_candidates(spec)
    fixed = {"k_lanes": max(v for v in cands["k_lanes"] if v <= 8),
             "n_lanes": max(v for v in cands["n_lanes"] if v <= 32), "unroll": 64}
    return sketch(sch, spec, hw, order, fixed)
