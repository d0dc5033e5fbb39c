"""CUDA design space of the mixed family (qcompile/kernels/mixed/compute.py), one kernel:
both parts, the second-order scale dequantization and the CSR outliers in one launch.

Blocks run over N tiles (``blockIdx.x``); in a block, ``n_lanes`` threads over N, each owning
``vec`` adjacent columns (their packed words arrive in one 128-bit load per packed row), and
``k_lanes`` lanes over the groups of each part (2-bit groups; on CUDA the 4-bit part runs over
its g1-groups too, compute.py): lane t takes the ``load_groups`` adjacent groups of each step
(steps of ``k_lanes * load_groups`` groups; the words of a step's groups are requested together,
before the first decode), sums them in registers (an rfactor of ``combine2``/``combine4``), and
the lanes meet in a cross-thread reduction into shared memory; ``finish`` adds the parts and
walks the column's CSR outliers. A group's x (a run of g1 floats in storage order, read through
the group order) arrives in 128-bit loads into registers, where its group sum is formed too.

Two layouts of the lanes (sketch name suffix):

``""`` (K lanes in a warp)
    N threads on ``threadIdx.y``, K lanes on ``threadIdx.x``: the lanes of a column meet in a
    warp-shuffle reduction; a warp's 128-bit loads read ``32 / k_lanes`` short runs of
    ``k_lanes`` rows.
``+k_warps`` (K lanes across warps, as uniform's ``+k_warps``)
    N threads on ``threadIdx.x`` (a warp's 128-bit loads read ``min(32, n_lanes) * 16``
    contiguous bytes of each packed row, and every thread of a warp wants the same x: a
    broadcast), K lanes on ``threadIdx.y``, meeting through shared memory once per output.
    Blocks of ``n_lanes * k_lanes`` threads over ``N / (4 * n_lanes)`` tiles: small ``n_lanes``
    gives the grid enough blocks to fill every SM several times.

Section 5's dequantization order is the other structural choice (sketches ``sync``/``async``,
each in both layouts):

``sync``
    a 2-bit group's first-order scale is dequantized where it is used, after the group's dot
    product: its three loads (s1q, the second-order zero and scale) and the arithmetic wait
    behind the weights' decode (the synchronous dataflow the paper measures against).
``async``
    each lane's 2-bit step loop is software-pipelined (:func:`pipeline_steps`) and fully unrolled
    (the double buffers stay in registers): the next step's packed words are requested
    (128-bit loads into a second register buffer) and its first-order scales dequantized from
    the second-order ones (``scale1``, registers) while the current step is decoded: the
    scale arithmetic and the decode overlap the weights' loads. The 4-bit part (no
    second-order scales) is the same in both orders.

Knobs (categorical decisions):

===========  ================================================  =========================
knob         TensorIR loop                                     candidates
===========  ================================================  =========================
k_lanes      ``combine2``/``combine4`` g -> (steps, lanes,     1, 2, 4, ... 32; lanes x
             load_groups), rfactor, cross-lane reduction       the largest load_groups
                                                               divide both group counts
n_lanes      ``finish`` n -> the N thread axis                 1, 2, 4, ... 256
load_groups  groups per step, their words loaded together      1, 2, 4 dividing both
                                                               group counts
unroll       ``pragma_auto_unroll_max_step`` on the group      0, 64, 512
             steps (``sync``; ``async`` unrolls fully)
===========  ================================================  =========================
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.mixed.spec import MixedSpec
from schedules.cuda.common import load_to_registers, read_index, unroll
from schedules.knobs import choose
from schedules.loops import loops_below
from targets.hardware import GpuHardware

K_LANES = (1, 2, 4, 8, 16, 32)
N_LANES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOAD_GROUPS = (1, 2, 4)
UNROLL = (0, 64, 512)
ORDERS = ("sync", "async")

#: Suffix of the sketches whose K lanes are warps (``threadIdx.y``) and whose warps' threads
#: run over N (``threadIdx.x``): as uniform's ``+k_warps``.
K_WARPS = "+k_warps"
SKETCHES = tuple(order + suffix for suffix in ("", K_WARPS) for order in ORDERS)

_KNOBS = ("k_lanes", "n_lanes", "load_groups", "unroll")
_FIELDS = {"2": 16, "4": 8}


def vector_width(spec: MixedSpec) -> int:
    """Columns per thread: 4 (one 128-bit load of int32 words per packed row) when N allows."""
    for width in (4, 2):
        if spec.n % width == 0:
            return width
    return 1


def knob_candidates(spec: MixedSpec) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``: each divides the loop it splits, every pair of
    ``k_lanes`` and ``load_groups`` both parts' group counts."""
    lay = spec.layout
    columns = spec.n // vector_width(spec)
    groups = (lay.groups2, lay.rows4 // lay.g1)  # 2-bit groups, 4-bit g1-groups
    load_groups = [v for v in LOAD_GROUPS if all(count % v == 0 for count in groups)]
    most = max(load_groups)
    return {
        "k_lanes": [v for v in K_LANES if all(count % (v * most) == 0 for count in groups)],
        "n_lanes": [v for v in N_LANES if columns % v == 0],
        "load_groups": load_groups,
        "unroll": list(UNROLL),
    }


def split_sketch(name: str) -> tuple[str, bool]:
    """(order, K lanes across warps) of sketch ``name`` ("async", "sync+k_warps", ...)."""
    order = name.removesuffix(K_WARPS)
    if order not in ORDERS:
        raise ValueError(f"sketch must be one of {SKETCHES}; got {name!r}")
    return order, name.endswith(K_WARPS)


def rfactor_groups(sch: Schedule, part: str, k_lanes, load_groups=1):
    """Split ``combine<part>``'s groups over ``k_lanes`` lanes and rfactor them out, at the
    root (rfactor wants the reduction first under its outermost loop): lane t takes the
    ``load_groups`` adjacent groups of each step, steps of ``k_lanes * load_groups`` groups.
    Returns (partial sums, cross-lane reduction)."""
    combine = sch.get_sblock(f"combine{part}")
    _, _, g = sch.get_loops(combine)
    _, g_t, _ = sch.split(g, factors=[None, k_lanes, load_groups])
    partial = sch.rfactor(g_t, factor_axis=0)
    return partial, combine


def lane_steps(sch: Schedule, thread_loop, reductions, rv: dict, k_axis: str):
    """Place one part's lane sums (``reductions``: rfactor_groups's pair) under
    ``thread_loop``: the cross-lane reduction into shared memory, each lane's partial sums in
    registers over its steps of ``load_groups`` groups. Returns (partial, step loop, group loop
    of a step)."""
    partial, combine = reductions
    sch.compute_at(combine, thread_loop, preserve_unit_loops=True)
    sch.set_scope(combine, 0, "shared")
    f_t, f_m, f_n = loops_below(sch, combine, thread_loop)  # rfactor put the lanes first
    sch.reorder(f_m, f_n, f_t)  # the reduced thread loop must be innermost
    sch.bind(f_t, k_axis)
    sch.compute_at(partial, thread_loop, preserve_unit_loops=True)
    sch.set_scope(partial, 0, "local")
    p_t, p_m, p_n, p_o, p_b = loops_below(sch, partial, thread_loop)
    sch.reorder(p_t, p_o, p_b, p_m, p_n)  # p_b: the step's groups, loaded together
    sch.bind(p_t, k_axis)
    unroll(sch, p_b, p_m, p_n)
    sch.annotate(p_o, "pragma_auto_unroll_max_step", rv["unroll"])
    sch.annotate(p_o, "pragma_unroll_explicit", 1)
    return partial, p_o, p_b


def place_scale1(sch: Schedule, spec: MixedSpec, order: str, partial, step_loop, group_loop):
    """Section 5's order for block ``scale1`` (the 2-bit part's first-order scales from the
    second-order ones): ``sync`` inlines it where the group's sum is scaled; ``async`` computes
    a step's scales into registers at the start of the step, from its meta bytes in one
    vector load."""
    scale = sch.get_sblock("scale1")
    if order == "sync":
        sch.compute_inline(scale)
        # a group's 4 meta bytes in one 32-bit load, not four byte loads
        load_to_registers(sch, partial, "meta2", group_loop, vector_width(spec))
        return
    sch.compute_at(scale, step_loop, preserve_unit_loops=True)
    sch.set_scope(scale, 0, "local")
    unroll(sch, *loops_below(sch, scale, step_loop))
    meta = sch.cache_read(scale, read_index(sch, scale, "meta2"), "local",
                          consumer_blocks=[scale, partial])
    sch.compute_at(meta, step_loop, preserve_unit_loops=True)
    *outer, inner = loops_below(sch, meta, step_loop)
    inner, lanes = sch.split(inner, factors=[None, vector_width(spec)])
    sch.vectorize(lanes)
    unroll(sch, *outer, inner)


def _part(sch: Schedule, spec: MixedSpec, part: str, thread_loop, reductions, rv: dict,
          order: str, k_axis: str):
    """One part's per-lane group loop and cross-lane reduction under ``thread_loop``; the K
    lanes are bound to ``k_axis``. The group loop steps ``load_groups`` groups at a time (their
    packed words loaded together, before the first decode)."""
    partial, p_o, group = lane_steps(sch, thread_loop, reductions, rv, k_axis)
    # the per-group work: under the step's group loop
    dot = sch.get_sblock(f"group_dot{part}")
    sch.compute_at(dot, group, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    d_m, d_g, d_n, d_r = loops_below(sch, dot, group)
    words, fields = sch.split(d_r, factors=[None, _FIELDS[part]])
    sch.reorder(d_g, words, fields, d_n, d_m)
    unroll(sch, d_g, words, fields, d_n, d_m)
    # a step's words come in together, before its first decode
    codes = load_to_registers(sch, dot, f"codes{part}", p_o, vector_width(spec))
    total = sch.get_sblock(f"group_sum{part}")
    sch.compute_at(total, group, preserve_unit_loops=True)
    sch.set_scope(total, 0, "local")
    unroll(sch, *loops_below(sch, total, group))
    # the group's x: one run of g1 floats, 128-bit loads into registers
    gather = sch.get_sblock(f"gather{part}")
    sch.compute_at(gather, group, preserve_unit_loops=True)
    sch.set_scope(gather, 0, "local")
    *outer, inner = loops_below(sch, gather, group)
    inner, lanes = sch.split(inner, factors=[None, 4])
    sch.vectorize(lanes)
    unroll(sch, *outer, inner)
    if part == "2":
        place_scale1(sch, spec, order, partial, p_o, group)
    sch.decompose_reduction(dot, words)
    sch.decompose_reduction(partial, p_o)
    if order == "async" and part == "2":
        pipeline_steps(sch, p_o, codes, ("scale1", "meta2_local"))
        sch.unroll(p_o)  # registers: the double buffers must be indexed by constants
    return codes


def pipeline_steps(sch: Schedule, loop, codes, scale_names: tuple[str, ...]):
    """Software-pipeline a lane's group loop in two stages: stage 0 requests the next step's
    packed words (128-bit loads into a second register buffer) and then dequantizes its
    first-order scales from the second-order ones; stage 1 decodes and accumulates this step.
    So the scale arithmetic and the current step's work run while the next words are in
    flight (section 5's overlap, with registers where the paper stages in shared memory)."""
    early = {sch.get(codes).name_hint, *scale_names}
    parent = sch.get(loop)
    stmts, stages = [], []  # the loop body's statements: the subtrees its blocks live in
    for block in sch.get_child_blocks(loop):
        loops = [sch.get(rv) for rv in sch.get_loops(block)]
        depth = next(i for i, node in enumerate(loops) if node.same_as(parent))
        top = loops[depth + 1] if depth + 1 < len(loops) else sch.get(block)
        stage = 0 if sch.get(block).name_hint in early else 1
        if stmts and stmts[-1].same_as(top):
            stages[-1] = min(stages[-1], stage)
        else:
            stmts.append(top)
            stages.append(stage)
    order = sorted(range(len(stmts)), key=lambda i: (stages[i], i))
    sch.annotate(loop, "software_pipeline_stage", stages)
    sch.annotate(loop, "software_pipeline_order", [order.index(i) for i in range(len(stmts))])


def sketch(sch: Schedule, spec: MixedSpec, hw: GpuHardware, order: str,
           fixed: dict | None = None, prior: dict | None = None) -> Schedule:
    """The layout above for sketch ``order`` (a name of :data:`SKETCHES`: the dequantization
    order, with :data:`K_WARPS` appended for K lanes across warps); ``fixed`` pins knobs,
    ``prior`` favours values (:func:`schedules.knobs.choose`)."""
    return gemv_layout(sch, spec, order, _part, fixed, prior)


def gemv_layout(sch: Schedule, spec: MixedSpec, name: str, place_part,
                fixed: dict | None = None, prior: dict | None = None) -> Schedule:
    """The thread layout of sketch ``name`` around ``finish`` (blocks and threads over N, the
    K lanes of both parts), with ``place_part(sch, spec, part, thread_loop, reductions, rv,
    order, k_axis)`` scheduling each part's groups under the N thread loop (this module's
    float parts, or schedules/cuda/mixed_int8.py's dp4a ones)."""
    order, k_warps = split_sketch(name)
    n_axis, k_axis = ("threadIdx.x", "threadIdx.y") if k_warps else ("threadIdx.y",
                                                                      "threadIdx.x")
    cands = knob_candidates(spec)
    rv = {knob: choose(sch, knob, cands[knob], fixed, prior) for knob in _KNOBS}
    vec = vector_width(spec)
    finish = sch.get_sblock("finish")
    m, n = sch.get_loops(finish)
    n_b, n_t, n_e = sch.split(n, factors=[None, rv["n_lanes"], vec])
    sch.reorder(n_b, n_t, m, n_e)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(n_t, n_axis)
    reductions = {part: rfactor_groups(sch, part, rv["k_lanes"], rv["load_groups"])
                  for part in ("2", "4")}
    for part in ("2", "4"):
        place_part(sch, spec, part, n_t, reductions[part], rv, order, k_axis)
    # finish: the thread's M x vec outputs shared among its k lanes (one writer per output)
    _, f_lane = sch.split(sch.fuse(m, n_e), factors=[None, rv["k_lanes"]])
    sch.bind(f_lane, k_axis)
    return sch


def design_space(sch: Schedule, spec: MixedSpec, hw: GpuHardware) -> list[Schedule]:
    """Every sketch (both orders, both K-lane layouts), knobs sampled, the heuristic's knobs
    as priors in its layout."""
    return every_sketch(sch, spec, hw, sketch, heuristic_knobs(spec, hw))


def every_sketch(sch: Schedule, spec: MixedSpec, hw: GpuHardware, sketch_fn,
                 heuristic: tuple[str, dict]) -> list[Schedule]:
    """``sketch_fn`` of every sketch on a copy of ``sch``, knobs sampled, with the knobs of
    ``heuristic`` (a sketch name and its knobs) as priors in the heuristic's K-lane layout."""
    name, knobs = heuristic
    _, k_warps = split_sketch(name)
    return [sketch_fn(sch.copy(), spec, hw, s, prior=knobs if split_sketch(s)[1] == k_warps
                      else None) for s in SKETCHES]


#: Most threads per block of the heuristic.
HEURISTIC_BLOCK_THREADS = 256
#: Threads of a warp over N in the heuristic: 8 x 16 bytes = 128 contiguous bytes per row.
HEURISTIC_N_LANES = 8
#: 2-bit groups whose words each thread has in flight (one 128-bit load each).
HEURISTIC_LOAD_GROUPS = 4
#: Registers per thread the heuristic plans with (ptxas at 8192 x 28672: 48 for ``sync``,
#: 62 for ``async``; ``tests/codegen/test_mixed_cuda_codegen.py`` checks the bound).
HEURISTIC_REGISTERS = 64
#: The untuned kernel's dequantization order.
HEURISTIC_ORDER = "sync"


def heuristic_knobs(spec: MixedSpec, hw: GpuHardware,
                    order: str = HEURISTIC_ORDER) -> tuple[str, dict[str, int]]:
    """A sketch and knob values that are valid and reasonable without tuning.

    K lanes across warps (``+k_warps``): :data:`HEURISTIC_N_LANES` threads of a warp over N
    (fewer when N is too small to give every SM a block), :data:`HEURISTIC_LOAD_GROUPS` groups'
    words requested together (divided by M: each group's x and dot products are M rows).
    ``sync``: the most K lanes (at most
    :data:`HEURISTIC_BLOCK_THREADS` threads a block) with which every block of the grid is
    resident at once at :data:`HEURISTIC_REGISTERS` registers a thread (one wave, no partial
    last wave; 8192 x 28672: 896 blocks of 16 x 8 threads, 7 an SM); ``async``: the most K
    lanes, so the fewest pipeline steps per lane (the fully unrolled double buffers' registers
    grow with them).
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    cands = knob_candidates(spec)
    columns = spec.n // vector_width(spec)
    fitting = [v for v in cands["n_lanes"] if v <= 32]
    n_lanes = min([v for v in fitting if v >= HEURISTIC_N_LANES] or fitting,
                  key=lambda v: abs(v - HEURISTIC_N_LANES))
    while n_lanes > 1 and columns // n_lanes < hw.sm_count and n_lanes // 2 in fitting:
        n_lanes //= 2
    per_sm = -(-columns // n_lanes // hw.sm_count)  # blocks each SM must hold for one wave
    sized = [v for v in cands["k_lanes"] if v * n_lanes <= HEURISTIC_BLOCK_THREADS] or [1]
    resident = [v for v in sized
                if per_sm * v * n_lanes * HEURISTIC_REGISTERS <= hw.registers_per_block]
    if order == "sync" and resident:
        k_lanes = max(resident)
    else:
        k_lanes = max(sized)
    # each group holds M x g1 floats of x and M x vec dot products in registers
    most = max(1, HEURISTIC_LOAD_GROUPS // spec.m)
    load_groups = max([v for v in cands["load_groups"] if v <= most] or [1])
    knobs = {"k_lanes": k_lanes, "n_lanes": n_lanes, "load_groups": load_groups,
             "unroll": 64}
    return order + K_WARPS, knobs


def heuristic_schedule(sch: Schedule, spec: MixedSpec, hw: GpuHardware,
                       order: str = HEURISTIC_ORDER) -> Schedule:
    """The schedule of :func:`heuristic_knobs` in dequantization ``order``."""
    name, knobs = heuristic_knobs(spec, hw, order)
    return sketch(sch, spec, hw, name, knobs)
