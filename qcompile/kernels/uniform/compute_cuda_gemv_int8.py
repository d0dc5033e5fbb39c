"""TensorIR of the uniform family's one-row GEMV with int8 activations on CUDA GPUs, x rounded
inside the kernel: one launch per call.

The dp4a kernel (compute_cuda_int8.py) rounds x in a kernel of its own before the GEMV. At one
row that first kernel and the gap before the second are a large share of a short call, and a
block that rounds all of x before it starts leaves the memory idle meanwhile. Here each lane
of K (16 threads) rounds the group it is about to multiply, in registers, while that group's
words are already on their way:

- thread t of the lane loads the 8 or 16 floats of unit t of the group (the rows of one word of
  codes: 8 at 4 bits, 16 at 2), two or four 128-bit loads;
- the group's max |x| and, once rounded, its sum are shuffle reductions over the lane's 16
  threads (``__shfl_xor_sync``, width 16);
- thread t packs its unit's rounded x into the words that unit's dp4a steps take (storage order,
  compute_int8.storage_to_row), and the lane's threads read unit u's words from thread u by
  ``__shfl_sync``: 32 shuffles per group at g = 128, where the words would otherwise be stored
  and loaded back.

The arithmetic is the dp4a kernel's, on the same words (layout ``plane_words``):

    xq[k]   = rint(x[k] * (127 / amax[g]))                  (int8; amax = max |x| in group g)
    y[n]    = sum_g s[g, n] * amax[g] / 127 * (dot[g, n] - z[g, n] * xqsum[g])
    dot[g,n] = sum_{k in g} xq[k] * q[k, n]                 (int32, exact: dp4a)

Block ``lane_gemv`` runs for one thread: loops ``block`` over N / (16 * cols), ``lane`` over
``k_lanes`` lanes of K (each every ``k_lanes``-th group; where the lanes do not divide the
groups, a lane past the last one skips the step) and ``thread`` over the lane's 16 threads, each
owning ``cols`` adjacent columns (a 64-bit load of words at 2 columns; :func:`thread_shape`
picks the shape); the schedule binds them to blockIdx.x, threadIdx.y and threadIdx.x (a warp
holds two lanes). The lanes' float sums meet in ``partial``, which block ``k_sum`` adds up.

At one row it beats both kernels that round x first, dp4a and tensor cores, at every shape
measured (docs/design/uniform-cuda.md, "int8 activations at one row: x rounded inside the
GEMV"; the numbers: docs/results/from-docstrings.md).

Operands:

=========  ==========  ==================  ==========================================
name       dtype       shape               content
=========  ==========  ==================  ==========================================
x          float32     [1, K]              activations
qweight    int32       [U, 1, N]           packed codes, a word per unit of K (plane_words)
scales     float16     [G, N]              s[g, n]
zeros      uint8       [G, N]              z[g, n]
y          float32     [1, N]              output
=========  ==========  ==================  ==========================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.tir.activations import inverse_of, packed_word, quantized, step_of
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.int8_dot import dp4a, step_codes, steps_per_unit
from qcompile.kernels.tir.planes import STEP, storage_to_row, unit_rows
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_gemv_int8.v1"
#: Threads of a lane of K: they round one group of x together (shuffles of this width).
LANE_THREADS = 16
#: Lanes of K per block, most first (a block is whole warps: 2 lanes or more).
K_LANES = (32, 16, 8, 4, 2)
#: Threads an H200 holds at once (132 SMs x 2048) at up to 64 registers a thread (2 columns a
#: thread take 64; 4 take 77, and only 3 blocks of 256 threads then fit an SM).
WAVE_THREADS = 132 * 2048
#: Below this fraction of :data:`WAVE_THREADS` at 2 columns a thread, a thread takes 1.
NARROW_BELOW_WAVE = 1 / 3
#: Group sizes the kernel takes (a unit of codes per thread: at most 16 units a group).
GROUP_SIZES = (32, 64, 128)
#: Units of packed words a thread holds in registers at a time (the dp4a kernel's
#: ``load_words`` that its heuristic takes: 4 at 4 and 2 bits).
LOAD_UNITS = 4
_FLOAT_VEC = 4                              # floats per 128-bit load


def problems_with(spec: UniformSpec) -> list[str]:
    """Why this kernel cannot take ``spec`` (empty when it can)."""
    problems = []
    if not spec.int8_activations:
        problems.append("int8_activations must be True")
    if spec.m != 1:
        problems.append(f"M={spec.m} must be 1 (one row of x)")
    if spec.bits not in (2, 4):
        problems.append(f"bits={spec.bits} must be 2 or 4 (one packed word per unit of K)")
    if spec.effective_group_size not in GROUP_SIZES:
        problems.append(f"the group size {spec.effective_group_size} must be one of "
                        f"{GROUP_SIZES} (a lane's 16 threads round one group)")
    if spec.n % LANE_THREADS:
        problems.append(f"N={spec.n} must be a multiple of {LANE_THREADS} (a lane's threads)")
    return problems


def check_spec(spec: UniformSpec) -> None:
    """Raise SpecError unless the kernel fits ``spec`` (:func:`problems_with`)."""
    problems = problems_with(spec)
    if problems:
        raise SpecError(f"{spec.name()}: the one-row int8 GEMV needs " + "; ".join(problems))


def fits(spec: UniformSpec) -> bool:
    """Whether the kernel takes ``spec``."""
    return not problems_with(spec)


def thread_shape(spec: UniformSpec) -> tuple[int, int]:
    """``(cols, k_lanes)``: columns per thread and lanes of K per block.

    The most lanes (of :data:`K_LANES`, at most the group count) whose grid fits one wave
    (:data:`WAVE_THREADS`) at 2 columns a thread (64-bit loads of words); 1 column where even
    that grid is under :data:`NARROW_BELOW_WAVE` of a wave (more, smaller threads then fill the
    GPU better than each rounding x for more columns). The rule was checked against every
    (cols, lanes) of {4, 2, 1} x {8, 16, 32}: its choice is the fastest or close to it at every
    shape measured (docs/design/uniform-cuda.md; the numbers: docs/results/from-docstrings.md).
    """
    lanes = [v for v in K_LANES if v <= spec.groups] or [min(K_LANES)]

    def threads(cols: int, k_lanes: int) -> int:
        return spec.n // cols * k_lanes

    cols = 2 if spec.n % (2 * LANE_THREADS) == 0 else 1
    k_lanes = next((v for v in lanes if threads(cols, v) <= WAVE_THREADS), lanes[-1])
    if threads(cols, k_lanes) < NARROW_BELOW_WAVE * WAVE_THREADS:
        cols = 1
    return cols, k_lanes


def uniform_compute_cuda_gemv_int8(spec: UniformSpec, cols: int | None = None,
                                   k_lanes: int | None = None):
    """The PrimFunc for a one-row int8-activation ``spec`` (symbol ``spec.name()``;
    :func:`check_spec`); ``cols`` and ``k_lanes`` default to :func:`thread_shape`'s."""
    check_spec(spec)
    default_cols, default_lanes = thread_shape(spec)
    cols, KL = cols or default_cols, k_lanes or default_lanes
    if spec.n % (LANE_THREADS * cols) or KL % 2:
        raise SpecError(f"{spec.name()}: {cols} columns per thread need N % {LANE_THREADS * cols}"
                        f" == 0 (N={spec.n}), and lanes of K come in pairs (a warp): got {KL}")
    K, N, G = spec.k, spec.n, spec.groups
    bits, gsize = spec.bits, spec.effective_group_size
    R = unit_rows(bits)                     # rows of x per unit (a word of codes)
    S = steps_per_unit(bits)                # dp4a steps (x words) per unit
    UG = gsize // R                         # units per group: the lane's threads 0 .. UG - 1
    GL = (G + KL - 1) // KL                 # groups per lane (the last step may have fewer)
    columns = LANE_THREADS * cols           # columns per block
    NB = N // columns
    LB = min(LOAD_UNITS, UG)                # units of words in registers at a time
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}

    def lane_mask(vk):
        # the threads that take part: the whole warp (two lanes) when every lane has a group
        # at every step, else the lane's own 16 (one lane may skip the last step)
        if G % KL == 0:
            return T.uint32(0xFFFFFFFF)
        return T.shift_left(T.uint32(0xFFFF), T.Cast("uint32", vk % 2 * LANE_THREADS))

    def shuffle_xor(dtype, vk, value, offset):
        return T.call_extern(dtype, "__shfl_xor_sync", lane_mask(vk), value, offset,
                             LANE_THREADS)

    def shuffle_from(vk, value, source):
        return T.call_extern("int32", "__shfl_sync", lane_mask(vk), value, source,
                             LANE_THREADS)

    @T.macro
    def round_group(x, group, vk, vt, xf, xq, xw, amax, inverse, qsum):
        # unit vt of the group (threads past the group's units load unit vt % UG again: their
        # values leave the max unchanged and are kept out of the sum)
        for v in T.unroll(R // _FLOAT_VEC):
            for e in T.vectorized(_FLOAT_VEC):
                xf[v * _FLOAT_VEC + e] = x[0, group * gsize + vt % UG * R + v * _FLOAT_VEC + e]
        amax[0] = T.float32(0)
        for r in T.unroll(R):
            amax[0] = T.max(amax[0], T.fabs(xf[r]))
        for i in T.unroll(4):  # offsets 8, 4, 2, 1: every thread ends with the lane's max
            amax[0] = T.max(amax[0], shuffle_xor("float32", vk, amax[0], T.shift_right(8, i)))
        inverse[0] = inverse_of(amax[0])
        qsum[0] = 0
        for r in T.unroll(R):
            xq[r] = quantized(xf[r], inverse[0])
            qsum[0] = qsum[0] + xq[r]
        qsum[0] = T.Select(vt < UG, qsum[0], 0)
        for i in T.unroll(4):
            qsum[0] = qsum[0] + shuffle_xor("int32", vk, qsum[0], T.shift_right(8, i))
        for p in T.unroll(S):  # word p: storage positions 4p .. 4p + 3 of the unit
            xw[p] = packed_word([xq[storage_to_row(p * STEP + j, bits)] for j in range(STEP)])

    @T.macro
    def load_units(qweight, words, group, first, column):
        # units first .. first + LB - 1 of the group, cols columns from ``column``: a vector each
        for u in T.unroll(LB):
            for c in T.vectorized(cols):
                words[u, c] = qweight[group * UG + first + u, 0, column + c]

    @T.prim_func(s_tir=True)
    def uniform_gemv_cuda_int8(
        x: T.Buffer((1, K), "float32"),
        qweight: T.Buffer((K // R, 1, N), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((1, N), "float32"),
    ):
        T.func_attr(attrs)
        partial = T.sblock_alloc_buffer((NB, KL, columns), "float32")
        for block, lane, thread in T.grid(NB, KL, LANE_THREADS):
            with T.sblock("lane_gemv"):
                vb, vk, vt = T.axis.remap("SSS", [block, lane, thread])
                T.reads(x[0, 0:K], qweight[0:K // R, 0, vb * columns:vb * columns + columns],
                        scales[0:G, vb * columns:vb * columns + columns],
                        zeros[0:G, vb * columns:vb * columns + columns])
                T.writes(partial[vb, vk, vt * cols:vt * cols + cols])
                xf = T.sblock_alloc_buffer((R,), "float32", scope="local")
                xq = T.sblock_alloc_buffer((R,), "int32", scope="local")
                xw = T.sblock_alloc_buffer((S,), "int32", scope="local")
                amax = T.sblock_alloc_buffer((1,), "float32", scope="local")
                inverse = T.sblock_alloc_buffer((1,), "float32", scope="local")
                xu = T.sblock_alloc_buffer((1,), "int32", scope="local")
                qsum = T.sblock_alloc_buffer((1,), "int32", scope="local")
                words = T.sblock_alloc_buffer((LB, cols), "int32", scope="local")
                sc = T.sblock_alloc_buffer((cols,), "float16", scope="local")
                zr = T.sblock_alloc_buffer((cols,), "uint8", scope="local")
                dot = T.sblock_alloc_buffer((cols,), "int32", scope="local")
                acc = T.sblock_alloc_buffer((cols,), "float32", scope="local")
                for c in T.unroll(cols):
                    acc[c] = T.float32(0)
                for step in T.serial(GL):
                    if step * KL + vk < G:  # a lane past the last group skips the step
                        # the group's first words and its factors before x: their loads do not
                        # wait for the rounding
                        load_units(qweight, words, step * KL + vk, 0, vb * columns + vt * cols)
                        for c in T.vectorized(cols):
                            sc[c] = scales[step * KL + vk, vb * columns + vt * cols + c]
                        for c in T.vectorized(cols):
                            zr[c] = zeros[step * KL + vk, vb * columns + vt * cols + c]
                        round_group(x, step * KL + vk, vk, vt, xf, xq, xw, amax, inverse, qsum)
                        for c in T.unroll(cols):
                            dot[c] = 0
                        for batch in T.unroll(UG // LB):
                            for u in T.unroll(LB):
                                for p in T.unroll(S):
                                    # unit u's word p of x, from the thread that rounded it
                                    xu[0] = shuffle_from(vk, xw[p], batch * LB + u)
                                    for c in T.unroll(cols):
                                        dot[c] = dot[c] + dp4a(
                                            step_codes(words[u, c], p, bits), xu[0])
                            if batch + 1 < UG // LB:
                                load_units(qweight, words, step * KL + vk, (batch + 1) * LB,
                                           vb * columns + vt * cols)
                        for c in T.unroll(cols):
                            acc[c] = acc[c] + T.Cast("float32", sc[c]) * step_of(amax[0]) * T.Cast(
                                "float32", dot[c] - T.Cast("int32", zr[c]) * qsum[0])
                for c in T.unroll(cols):
                    partial[vb, vk, vt * cols + c] = acc[c]
        for block, j, lane in T.grid(NB, columns, KL):
            with T.sblock("k_sum"):
                vb, vj, vk = T.axis.remap("SSR", [block, j, lane])
                with T.init():
                    y[0, vb * columns + vj] = T.float32(0)
                y[0, vb * columns + vj] = y[0, vb * columns + vj] + partial[vb, vk, vj]

    return uniform_gemv_cuda_int8
