"""CUDA design space of the BCQ family's rotated-chunk GEMV (mu = 8, one row:
qcompile/kernels/bcq/compute_cuda_rotated.py).

The thread layout is the compute's: thread t of a block owns the 4 adjacent columns
``(block * threads + t) * 4 ...`` (so its warp lane fixes its table copy and chunk rotation), and
a block runs ``groups_per_block`` groups of K one after another:

1. its threads build the group's tables (256 entries x 32 slots, 32 KiB) in shared memory:
   thread (e_hi, chunk) computes the 16 entries that share e's high four bits once, in
   registers, and stores each to every copy;
2. each thread loads the group's packed words of its 4 columns, a 128-bit load per plane and word
   of the group, all before the first lookup, adds up the group's sum of x from its chunks' last
   entries (broadcast loads), then runs the group's steps unrolled: per step, plane and column a
   byte of a word (the key), OR-ed with the lane's slot, a shared load and an add; alpha and z
   are applied per group and the sums stay in registers;
3. the blocks along K (blockIdx.y) write partial sums ``[K slices, 1, N]`` that a second kernel
   adds up, as in the other BCQ space (schedules/cuda/bcq.py).

Knobs (categorical): ``threads`` (per block, a multiple of the 32 lanes) and
``groups_per_block`` (fewer partial sums against fewer blocks).
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.kernels.bcq.compute_cuda_rotated import RUN, SLOTS, check_spec
from qcompile.kernels.bcq.spec import BcqSpec
from qcompile.kernels.layouts.bcq import COLS
from schedules.cuda.bcq import sum_slices
from schedules.cuda.common import read_index, unroll
from schedules.knobs import choose
from schedules.loops import loops_below
from targets.hardware import GpuHardware

THREADS = (32, 64, 128, 256, 512, 1024)
GROUPS_PER_BLOCK = (1, 2, 4)

_KNOBS = ("threads", "groups_per_block")


def knob_candidates(spec: BcqSpec, hw: GpuHardware | None = None) -> dict[str, list[int]]:
    """Each knob's candidates for ``spec``: threads dividing N / 4 (within the GPU's block
    limit), groups per block dividing G."""
    limit = hw.max_threads_per_block if hw else max(THREADS)
    threads = [v for v in THREADS if (spec.n // COLS) % v == 0 and v <= limit] or [SLOTS]
    groups = [v for v in GROUPS_PER_BLOCK if spec.groups % v == 0]
    return {"threads": threads, "groups_per_block": groups}


def sketch(sch: Schedule, spec: BcqSpec, hw: GpuHardware, fixed: dict | None = None
           ) -> Schedule:
    """The layout above; knobs sampled, or pinned by ``fixed`` ({knob: value}).

    Alternatives measured and left out, none faster: the group's sum of x by a cross-thread
    reduction of the block (two barriers per group), each copy's entries computed by threads of
    their own (conflict-free stores, the sums done twice), and the words requested before the
    tables are built (docs/design/bcq.md, "CUDA"; the numbers: docs/results/from-docstrings.md)."""
    check_spec(spec)
    cands = knob_candidates(spec, hw)
    rv = {name: choose(sch, name, cands[name], fixed) for name in _KNOBS}

    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_b, n_t, n_c = sch.split(n, factors=[None, rv["threads"], COLS])
    g_b, g_in = sch.split(g, factors=[None, rv["groups_per_block"]])
    sch.reorder(n_b, g_b, g_in, n_t, m, n_c)
    partial = sch.rfactor(g_b, factor_axis=0)              # [K slices, 1, N] partial sums
    n_b, g_b, g_in, n_t, m_p, n_c = sch.get_loops(partial)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(g_b, "blockIdx.y")
    sch.bind(n_t, "threadIdx.x")
    unroll(sch, m_p, n_c)

    # Per group: the q plane sums of a thread's 4 columns, in registers, from its staged words.
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, n_t, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_i, d_n, d_s = sch.get_loops(dot)
    sch.reorder(d_s, d_g, d_i, d_m, d_n)
    unroll(sch, d_s, d_g, d_i, d_m, d_n)
    words = sch.cache_read(dot, read_index(sch, dot, "planes"), "local")
    sch.compute_at(words, n_t, preserve_unit_loops=True)
    *outer, columns = loops_below(sch, words, n_t)
    sch.vectorize(columns)                                 # 4 words: one 128-bit load
    unroll(sch, *outer)
    sch.decompose_reduction(dot, d_s)

    # The group's sum of x (cross-thread, from the tables' last entries) and its tables, in
    # shared memory, rebuilt for each of the block's groups.
    x_sum = sch.get_sblock("x_sum")
    sch.set_scope(x_sum, 0, "local")
    sch.compute_at(x_sum, n_t, preserve_unit_loops=True)
    unroll(sch, *loops_below(sch, x_sum, n_t))
    lut = sch.get_sblock("lut")
    sch.set_scope(lut, 0, "shared")
    sch.compute_at(lut, g_in, preserve_unit_loops=True)
    l_m, l_g, l_e, l_p, l_r = loops_below(sch, lut, g_in)
    e_hi, e_lo = sch.split(l_e, factors=[None, RUN])
    sch.reorder(e_hi, l_r, l_m, l_g, e_lo, l_p)
    _, lane = sch.split(sch.fuse(e_hi, l_r), factors=[None, rv["threads"]])
    sch.bind(lane, "threadIdx.x")
    unroll(sch, l_m, l_g, e_lo, l_p)

    sum_slices(sch, spec)                                  # the second kernel
    return sch


def heuristic_knobs(spec: BcqSpec, hw: GpuHardware) -> dict[str, int]:
    """256 threads (or the most up to that which divide N / 4), one group per block.

    The fastest point of the sweeps: more groups per block run one after another, each behind a
    barrier; 512 threads take more registers (fewer blocks per SM); 128 threads spread the
    tables' build over fewer lookups (the numbers: docs/results/from-docstrings.md)."""
    cands = knob_candidates(spec, hw)
    threads = max([v for v in cands["threads"] if v <= 256] or cands["threads"][:1])
    return {"threads": threads, "groups_per_block": 1}


def heuristic_schedule(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> Schedule:
    return sketch(sch, spec, hw, heuristic_knobs(spec, hw))


def design_space(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> list[Schedule]:
    return [sketch(sch, spec, hw)]

