"""CUDA design space of the BCQ family: LUT-GEMM's thread-block layout (its Figure 7) over
qcompile/kernels/bcq/compute.py.

A thread block owns a tile of ``t_h`` outputs (N) and a slice of K of ``l`` tables (``l * mu``
rows: ``groups_per_block`` whole groups, so each group's alpha and z stay in one block):

1. its threads build the slice's ``l`` tables (2**mu signed sums of mu activations each) in
   shared memory, once, a thread per entry (mu terms summed in registers, one store), and the
   slice's group sums of x that z needs from the tables' last entries (all bits set: the
   plain sum of the chunk), a thread per group: no kernel before this one;
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
words loaded into registers first, ``cols`` words per vector load (LDG.128 at cols = 4), all
loads in flight at once; and that with the block's groups unrolled (``unroll_groups``): each
lookup is then a shift, an AND, a shared load at key + constant offset and an add (4 SASS
instructions at mu = 4, against 6 with the group offset computed per lookup), and the compiler
issues later groups' loads among earlier groups' lookups.

``words_inner`` (with ``stage_words``) orders a group's lookups chunk by chunk across its words
(for each of a word's 32 / mu chunks, every word of every plane) instead of word by word. What
it is for is the loads, not the lookups: ptxas schedules each staged load just before its first
use (the CUDA source loads a group's words at its start, but the SASS does not: at the word-by-
word order the staged, looped sketch keeps 3 LDG.128 of 12 in flight per thread, the unrolled
one 1 or 2), so where the first lookups read every word, all of them are in flight together
(8 to 12 of 12 at t_h = 512 in the SASS of both orders; docs/design/bcq.md, "CUDA"). An SM
needs tens of KB in flight to cover the memory latency at full bandwidth (the estimate:
docs/results/from-docstrings.md); at 1 or 2 loads per thread it has that only when every warp
waits at once.

One-row GEMVs at mu = 8 do not come here when they fit the rotated-chunk compute (its own
space, schedules/cuda/bcq_rotated.py, with every lookup conflict-free); tools pass this space's
compute (``bcq_compute(spec, gpu=True)``) to compare the two.

Cost model at M = 1 (why mu = 4 is this space's choice on GPUs): a warp's lookup is one LDS
wavefront (the 32 lanes read one table: at mu <= 5 its 2**mu words lie in distinct banks, so
any keys are conflict-free), and an SM serves one wavefront per clock, so
``q * K / mu * N / 32 / SMs`` clocks bound the kernel (docs/design/bcq.md, "CUDA"); at mu = 8
the 256-word tables give random keys ~3-4 way bank conflicts, more than the halved lookup count
saves.

mu is the spec's (it shapes the tables: ``tools/bench.py kernels --preset bcq-cuda
--tune-trials N`` and ``tools/studies/bcq_cuda_sweep.py`` tune each mu as its own workload).
Combinations over the block's shared memory or thread limits are dropped by ``VerifyGPUCode``
before they are built.
"""

from __future__ import annotations

from qcompile._tvm import Schedule
from qcompile.errors import SpecError
from qcompile.formats.bcq import WORD_BITS
from qcompile.kernels.bcq.spec import BcqSpec
from schedules.cuda.common import VECTOR_BYTES, read_index, unroll
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


def knob_candidates(spec: BcqSpec, hw: GpuHardware | None = None,
                    stage_words: bool = False) -> dict[str, list[int]]:
    """Every knob's candidates for ``spec``; each divides the loop it splits, and the tables of
    ``groups_per_block`` groups fit the block's shared memory. With ``stage_words`` a thread's
    ``cols`` words are one vector load, so cols is at most 4 (128 bits)."""
    limit = min(SHARED_BYTES, hw.shared_memory_per_block_bytes) if hw else SHARED_BYTES
    groups = [v for v in GROUPS_PER_BLOCK
              if spec.groups % v == 0 and table_bytes(spec, v) <= limit]
    if not groups:
        raise SpecError(
            f"{spec.name()}: a CUDA block keeps the tables of at least one whole group in shared "
            f"memory; one group of {spec.effective_group_size} rows at mu={spec.mu} and M="
            f"{spec.m} needs {table_bytes(spec, 1)} bytes, over the {limit} bytes a block has: "
            "use a smaller mu, a smaller group size or fewer rows per call")
    threads = [v for v in THREADS if spec.n % v == 0] or [spec.n]
    cols = [v for v in COLS if spec.n % (v * min(threads)) == 0
            and (not stage_words or v * 4 <= VECTOR_BYTES)]
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
           stage_words: bool = False, unroll_groups: bool = False,
           words_inner: bool = False, sums_first: bool = False) -> Schedule:
    """The layout above; knobs sampled, or pinned by ``fixed`` ({knob: value}).

    ``stage_words`` loads a group's packed words of every plane into registers before its
    lookups (all loads in flight at once, ``cols`` adjacent columns per vector load: LDG.128 at
    cols = 4; the chunk loop fully unrolled), for groups of at most ``MAX_STAGED_WORDS`` words
    per column; otherwise each word is loaded where its chunks are looked up.
    ``unroll_groups`` (with ``stage_words``) unrolls the block's loop over its groups: every
    table offset becomes a constant of the shared-memory address (key + immediate) and the
    compiler may issue the next group's loads before this group's lookups.
    ``words_inner`` (with ``stage_words``) runs the chunks of a word outside the words: the
    first lookups of a group read all its staged words, so all its loads issue together.
    ``sums_first`` reads the slice's group sums of x (shared, written by one thread after a
    cross-thread sum) into registers before the lookups: the barrier that read needs then comes
    before them, where TVM otherwise places it before the first group's ``combine``, between
    two groups' lookups when those are unrolled (7168x28672 heuristic: 72 registers against 64,
    7 blocks per SM against 8). Not in the design space: the sweep's grid measures it.
    """
    if stage_words and not can_stage_words(spec):
        raise ValueError(f"stage_words needs mu dividing 32 and q * group_size / 32 <= "
                         f"{MAX_STAGED_WORDS}; {spec.name()} has mu={spec.mu}, "
                         f"{spec.q * spec.effective_group_size // WORD_BITS} words")
    if unroll_groups and not stage_words:
        raise ValueError("unroll_groups needs stage_words (the chunk loop fully unrolled)")
    if words_inner and not stage_words:
        raise ValueError("words_inner needs stage_words (the words in registers)")
    cands = knob_candidates(spec, hw, stage_words=stage_words)
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
    if sums_first:
        sums = sch.cache_read(partial, read_index(sch, partial, "x_sum"), "local")
        sch.compute_at(sums, n_t, preserve_unit_loops=True)
        unroll(sch, *loops_below(sch, sums, n_t))

    # Per group: q plane sums of table lookups, in registers.
    dot = sch.get_sblock("group_dot")
    sch.compute_at(dot, g_in, preserve_unit_loops=True)
    sch.set_scope(dot, 0, "local")
    *_, d_m, d_g, d_i, d_n, d_r = sch.get_loops(dot)
    r_out, r_in = sch.split(d_r, factors=[None, chunks_per_word(spec)])
    if words_inner:
        sch.reorder(r_in, r_out, d_g, d_i, d_m, d_n)
    else:
        sch.reorder(r_out, r_in, d_g, d_i, d_m, d_n)
    unroll(sch, r_in, d_g, d_i, d_m, d_n)
    if stage_words:
        words = sch.cache_read(dot, read_index(sch, dot, "planes"), "local")
        sch.compute_at(words, g_in, preserve_unit_loops=True)
        *outer, columns = loops_below(sch, words, g_in)
        _, lanes = sch.split(columns, factors=[None, rv["cols"]])
        sch.vectorize(lanes)                               # cols words: one vector load
        unroll(sch, *outer)
        sch.unroll(r_out)
        if unroll_groups:
            sch.unroll(g_in)
    else:
        sch.annotate(r_out, "pragma_auto_unroll_max_step", rv["unroll"])
        sch.annotate(r_out, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(dot, r_in if words_inner else r_out)

    # The slice's group sums of x, from its tables' last entries: per (row, group) a sum over
    # the block's threads (a cross-thread reduction: shuffles; any number of groups, no guard
    # around a shared accumulator). The slice's tables: a thread per entry (its mu signed
    # terms summed in registers, one store), every thread of the block taking a share. Both in
    # shared memory, placed before either is split (the tables' region follows the consumers).
    x_sum = sch.get_sblock("x_sum")
    sch.set_scope(x_sum, 0, "shared")
    sch.compute_at(x_sum, g_b, preserve_unit_loops=True)
    lut = sch.get_sblock("lut")
    sch.set_scope(lut, 0, "shared")
    sch.compute_at(lut, g_b, preserve_unit_loops=True)
    _, lane = sch.split(sch.fuse(*loops_below(sch, lut, g_b)), factors=[None, rv["threads"]])
    sch.bind(lane, "threadIdx.x")
    *_, chunks = loops_below(sch, x_sum, g_b)
    _, lane = sch.split(chunks, factors=[None, rv["threads"]])
    sch.bind(lane, "threadIdx.x")

    sum_slices(sch, spec)
    return sch


def sum_slices(sch: Schedule, spec: BcqSpec) -> None:
    """The partial sums over the K slices (block ``combine`` after the rfactor, loops (column
    blocks, slices, threads, m, columns)): a second kernel, one thread per output."""
    final = sch.get_sblock("combine")
    f_nb, f_gb, f_nt, f_m, f_nc = sch.get_loops(final)
    sch.reorder(f_nb, f_nt, f_m, f_nc, f_gb)
    fused = sch.fuse(f_nb, f_nt, f_m, f_nc)
    f_b, f_t = sch.split(fused, factors=[None, 128 if (spec.m * spec.n) % 128 == 0 else 32])
    sch.bind(f_b, "blockIdx.x")
    sch.bind(f_t, "threadIdx.x")


#: Outputs per block the heuristic aims at (threads * cols): the block builds its tables once
#: for them, so a wider tile spends fewer instructions per lookup on building.
HEURISTIC_TILE = 512
#: Blocks per SM the heuristic wants at least (32 warps at 128 threads; K slices are added
#: until there are as many).
HEURISTIC_BLOCKS_PER_SM = 8


def heuristic_knobs(spec: BcqSpec, hw: GpuHardware) -> dict[str, int]:
    """Valid, reasonable knobs without tuning.

    128 threads of up to 4 outputs (``t_h`` up to :data:`HEURISTIC_TILE`: the tables, built by
    every block, then cost a few percent of the lookups), and the largest groups per block
    (fewer K slices: less partial-sum traffic) that still gives about
    :data:`HEURISTIC_BLOCKS_PER_SM` blocks per SM (all resident in one wave, loads of many
    blocks in flight), with tables of at most 16 KiB; unroll 16 where words are not staged.
    """
    stage = can_stage_words(spec)
    cands = knob_candidates(spec, hw, stage_words=stage)
    threads = max([v for v in cands["threads"] if v <= 128] or [cands["threads"][0]])
    cols = max([v for v in cands["cols"]
                if spec.n % (v * threads) == 0 and v * threads <= HEURISTIC_TILE] or [1])
    fitting = [v for v in cands["groups_per_block"] if table_bytes(spec, v) <= 16 * 1024]
    fitting = fitting or [cands["groups_per_block"][0]]
    tiles = spec.n // (threads * cols)
    wanted = HEURISTIC_BLOCKS_PER_SM * hw.sm_count
    enough = [v for v in fitting if tiles * (spec.groups // v) >= wanted]
    groups = max(enough) if enough else min(fitting)
    return {"threads": threads, "cols": cols, "groups_per_block": groups, "unroll": 16}


def heuristic_schedule(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> Schedule:
    """The schedule of :func:`heuristic_knobs` (a valid kernel without tuning), with the words
    staged in registers where they fit, the groups looped, words outer.

    Why that sketch: of the staged sketches it is the one that is both fast and free of spills
    (words inner was a little faster but ptxas spills it; unrolled groups were slower). By SASS
    unrolled groups take fewer instructions per lookup (the table offset folds into the LDS),
    but ptxas then issues a group's word loads nearly one at a time. Tuning searches all of
    them (docs/design/bcq.md; the numbers: docs/results/from-docstrings.md)."""
    stage = can_stage_words(spec)
    return sketch(sch, spec, hw, heuristic_knobs(spec, hw), stage_words=stage)


#: (stage_words, unroll_groups, words_inner) of the sketches where the words can be staged.
STAGED_SKETCHES = ((True, False, False), (True, True, False), (True, False, True),
                   (True, True, True))


def design_space(sch: Schedule, spec: BcqSpec, hw: GpuHardware) -> list[Schedule]:
    """Sketches: words loaded in place; where they fit, words staged in registers, with the
    block's groups looped or unrolled, and the words outer or inner. Knobs left as sampled
    decisions."""
    sketches = [(False, False, False)]
    if can_stage_words(spec):
        sketches += list(STAGED_SKETCHES)
    return [sketch(sch.copy(), spec, hw, stage_words=stage, unroll_groups=groups,
                   words_inner=inner)
            for stage, groups, inner in sketches]
