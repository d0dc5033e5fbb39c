"""CUDA design space of the BCQ family: LUT-GEMM's thread-block layout (its Figure 7) over
qcompile/kernels/bcq/compute.py.

A thread block owns a tile of ``t_h`` outputs (N) and a slice of K of ``l`` tables (``l * mu``
rows: ``groups_per_block`` whole groups, so each group's alpha and z stay in one block):

1. its threads build the slice's ``l`` tables (2**mu signed sums of mu activations each) in
   shared memory, once (the group sums of x that z needs come from a small kernel before);
2. each thread takes ``cols`` adjacent outputs (adjacent packed words), and per group, plane
   and chunk extracts the mu-bit key from the plane's word and adds the table entry; per group
   it scales the q plane sums by alpha, adds z * xsum,
   and accumulates in registers;
3. the blocks along K (blockIdx.y) write partial sums ``[K slices, M, N]`` to global memory and a
   second kernel adds them up: the paper's atomicAdd across blocks, made deterministic (the
   partial sums are 4 bytes per output and slice against q * l * mu / 8 bytes of weights).

Knobs (categorical decisions; candidates divide the loops they split):

===================  ==============================================  ===========================
knob                 TensorIR loop                                   paper
===================  ==============================================  ===========================
threads              ``combine`` n -> threadIdx.x                    (threads per TB)
cols                 outputs per thread (unrolled)                   t_h = threads * cols
groups_per_block     ``combine`` g -> (blockIdx.y, groups in block)  l = groups * group_size / mu
unroll               ``pragma_auto_unroll_max_step`` on the chunks   -
===================  ==============================================  ===========================

Sketches: packed words loaded where their chunks are looked up, or (``stage_words``, for groups
of at most 16 words per column over all planes, g <= 128 at q = 4, and mu dividing 32) a group's
words loaded into registers first, all loads in flight at once.

mu is the spec's (it shapes the tables: ``tools/tune_bcq_cuda.py`` tunes each mu as its own
workload). Combinations over the block's shared memory or thread limits are dropped by
``VerifyGPUCode`` before they are built.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.formats.bcq import WORD_BITS
from qcompile.kernels.bcq.spec import BcqSpec
from schedules.cuda.common import load_to_registers, unroll
from schedules.knobs import choose
from schedules.loops import loops_below
from targets.hardware import GpuHardware

THREADS = (32, 64, 128, 256, 512)
COLS = (1, 2, 4, 8)
GROUPS_PER_BLOCK = (1, 2, 4, 8, 16)
UNROLL = (0, 16, 64)
#: Static shared memory TVM may allocate per block.
SHARED_BYTES = 48 * 1024

#: Most packed words per column and group (all planes) that ``stage_words`` holds in registers.
MAX_STAGED_WORDS = 16

_KNOBS = ("threads", "cols", "groups_per_block", "unroll")


def table_bytes(spec: BcqSpec, groups_per_block: int) -> int:
    """Shared memory of one block's tables (all M rows)."""
    return spec.m * groups_per_block * spec.chunks_per_group * (1 << spec.mu) * 4


def knob_candidates(spec: BcqSpec, hw: GpuHardware | None = None) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``; each divides the loop it splits, and the tables of
    ``groups_per_block`` groups fit the block's shared memory."""
    limit = min(SHARED_BYTES, hw.shared_memory_per_block_bytes) if hw else SHARED_BYTES
    groups = [v for v in GROUPS_PER_BLOCK
              if spec.groups % v == 0 and table_bytes(spec, v) <= limit]
    if not groups:
        groups = [1]
    threads = [v for v in THREADS if spec.n % v == 0] or [spec.n]
    cols = [v for v in COLS if spec.n % (v * min(threads)) == 0]
    return {"threads": threads, "cols": cols, "groups_per_block": groups,
            "unroll": list(UNROLL)}


def chunks_per_word(spec: BcqSpec) -> int:
    """Chunks that share one packed word (unrolled together), or 1 when mu does not divide 32."""
    per_word = WORD_BITS // spec.mu if WORD_BITS % spec.mu == 0 else 1
    while spec.chunks_per_group % per_word:
        per_word //= 2
    return max(per_word, 1)


def can_stage_words(spec: BcqSpec) -> bool:
    """Whether a group's packed words (all planes) are few enough to hold in registers, and
    its chunks lie in whole words (mu divides 32: a straddling chunk's clamped next word gives
    the staged region no constant extent)."""
    return (WORD_BITS % spec.mu == 0
            and spec.q * spec.effective_group_size // WORD_BITS <= MAX_STAGED_WORDS)


def sketch(sch: Schedule, spec: BcqSpec, hw: GpuHardware, fixed: dict | None = None,
           stage_words: bool = False) -> Schedule:
    """The layout above; knobs sampled, or pinned by ``fixed`` ({knob: value}).

    ``stage_words`` loads a group's packed words of every plane into registers before its
    lookups (all loads in flight at once; the chunk loop fully unrolled), for groups of at most
    ``MAX_STAGED_WORDS`` words per column; otherwise each word is loaded where its chunks are
    looked up.
    """
    if stage_words and not can_stage_words(spec):
        raise ValueError(f"stage_words needs mu dividing 32 and q * group_size / 32 <= "
                         f"{MAX_STAGED_WORDS}; {spec.name()} has mu={spec.mu}, "
                         f"{spec.q * spec.effective_group_size // WORD_BITS} words")
    cands = knob_candidates(spec, hw)
    rv = {name: choose(sch, name, cands[name], fixed) for name in _KNOBS}

    combine = sch.get_sblock("combine")
    m, n, g = sch.get_loops(combine)
    n_b, n_t, n_c = sch.split(n, factors=[None, rv["threads"], rv["cols"]])
    g_b, g_in = sch.split(g, factors=[None, rv["groups_per_block"]])
    sch.reorder(n_b, g_b, n_t, g_in, m, n_c)
    partial = sch.rfactor(g_b, factor_axis=0)              # [K slices, M, N] partial sums
    n_b, g_b, n_t, g_in, m_p, n_c = sch.get_loops(partial)
    sch.bind(n_b, "blockIdx.x")
    sch.bind(g_b, "blockIdx.y")
    sch.bind(n_t, "threadIdx.x")
    acc = sch.cache_write(partial, 0, "local")             # a thread's sums in registers
    sch.reverse_compute_at(acc, n_t, preserve_unit_loops=True)
    unroll(sch, *loops_below(sch, acc, n_t))
    unroll(sch, m_p, n_c)

    # Per group: q plane sums of table lookups, in registers.
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, g_in, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_i, d_n, d_r = sch.get_loops(dot)
    r_out, r_in = sch.split(d_r, factors=[None, chunks_per_word(spec)])
    sch.reorder(r_out, r_in, d_g, d_i, d_m, d_n)
    unroll(sch, r_in, d_g, d_i, d_m, d_n)
    if stage_words:
        load_to_registers(sch, dot, "planes", g_in, 1)
        sch.unroll(r_out)
    else:
        sch.annotate(r_out, "pragma_auto_unroll_max_step", rv["unroll"])
        sch.annotate(r_out, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(dot, r_out)

    # The slice's tables: shared memory, every thread of the block taking a share.
    lut = sch.get_sblock("lut")
    sch.set_scope(lut, 0, "shared")
    sch.compute_at(lut, g_b, preserve_unit_loops=True)
    *spatial, reduce = loops_below(sch, lut, g_b)
    _, lane = sch.split(sch.fuse(*spatial), factors=[None, rv["threads"]])
    sch.bind(lane, "threadIdx.x")
    sch.unroll(reduce)

    # The group sums of x: a small first kernel, a thread per (row, group).
    x_sum = sch.get_sblock("x_sum")
    s_m, s_g, s_r = sch.get_loops(x_sum)
    s_b, s_t = sch.split(sch.fuse(s_m, s_g), factors=[None, 32])
    sch.bind(s_b, "blockIdx.x")
    sch.bind(s_t, "threadIdx.x")

    # Partial sums over the K slices: a second kernel, one thread per output.
    final = sch.get_sblock("combine")
    f_nb, f_gb, f_nt, f_m, f_nc = sch.get_loops(final)
    sch.reorder(f_nb, f_nt, f_m, f_nc, f_gb)
    fused = sch.fuse(f_nb, f_nt, f_m, f_nc)
    f_b, f_t = sch.split(fused, factors=[None, 128 if (spec.m * spec.n) % 128 == 0 else 32])
    sch.bind(f_b, "blockIdx.x")
    sch.bind(f_t, "threadIdx.x")
    return sch


def heuristic_knobs(spec: BcqSpec, hw: GpuHardware) -> dict[str, int]:
    """Valid, reasonable knobs without tuning.

    A block builds ``2**mu * mu`` additions per table and does ``t_h * q`` lookups in it, so
    ``t_h`` grows with the tables: about ``2**mu * mu`` outputs per block (2048 at mu = 8, the
    paper's practical t_h; at least 128), up to 256 threads of up to 8 outputs; the most groups
    per block whose tables fit in 16 KiB (several blocks per SM); unroll 16.
    """
    cands = knob_candidates(spec, hw)
    want = max(128, (1 << spec.mu) * spec.mu)
    threads = max([v for v in cands["threads"] if v <= min(256, want)] or [cands["threads"][0]])
    cols = max([v for v in cands["cols"] if spec.n % (v * threads) == 0 and v * threads <= want]
               or [1])
    groups = max([v for v in cands["groups_per_block"] if table_bytes(spec, v) <= 16 * 1024]
                 or [cands["groups_per_block"][0]])
    return {"threads": threads, "cols": cols, "groups_per_block": groups, "unroll": 16}


def heuristic_schedule(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs` (a valid kernel without tuning), with the words
    staged in registers where they fit."""
    return sketch(sch, spec, hw, heuristic_knobs(spec, hw), stage_words=can_stage_words(spec))


def design_space(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> list[Schedule]:
    """The sketch with words loaded in place, and with words staged in registers where they
    fit; knobs left as sampled decisions."""
    stages = (False, True) if can_stage_words(spec) else (False,)
    return [sketch(sch.copy(), spec, hw, stage_words=stage) for stage in stages]
