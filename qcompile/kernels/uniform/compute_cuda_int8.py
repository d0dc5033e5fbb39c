"""TensorIR of the uniform family with int8 activations on CUDA GPUs: ``dp4a`` integer dot
products (four int8 products and their sum in one instruction, sm_61 and later).

The float CUDA kernel (compute_cuda.py) spends a LOP3, an FADD and an FFMA on every code, plus a
shift per half word: at M = 1 it is bound by instruction issue as much as by memory (profile:
docs/results/from-docstrings.md). Here x is
quantized once per call, per row and group, to int8 (as compute_int8.py does for CPUs), and a
word of packed codes feeds ``dp4a`` after one shift and one AND per four codes:

    xq[m, k]   = rint(x[m, k] * (127 / amax[m, g]))         (int8; amax = max |x| in group g)
    y[m, n]    = sum_g s[g, n] * amax[m, g] / 127 * (dot[m, g, n] - z[g, n] * xqsum[m, g])
    dot[m,g,n] = sum_{k in g} xq[m, k] * q[k, n]            (int32, exact)

At 4 bits: ``(w >> 4p) & 0x0F0F0F0F`` (p = 0, 1) puts codes 2j + p of word w in byte j, so a
word is two dp4a: about 0.6 instructions per code against 3 for the float kernel.

The codes are the CPU int8 kernel's byte planes (compute_int8.byte_planes: GPTQ's own words at
2 and 4 bits; 3-bit blocks split into two 2-bit planes and a 1-bit plane) read as int32 words,
and x is stored in the same "storage order" (compute_int8.storage_to_row), packed four int8 to
an int32 word so that word ``u * S + t`` of x pairs with step t of code unit u.

Blocks (schedules/cuda/uniform_int8.py schedules them by these names):

``x_amax``     amax[m, g]   = max_r |x[m, g*gs + r]|                     reduce [M, G | gs]
``x_inverse``  inv[m, g]    = 127 / amax[m, g] (one IEEE division a group)  spatial [M, G]
``x_pack``     xq_words[m, w] = 4 rounded int8 of x, storage order      spatial [M, K/4]
``x_qsum``     xq_sum[m, g] = sum_r rint(x[m, g*gs + r] * inv[m, g])     reduce [M, G | gs]
``x_step``     x_step[m, g] = amax[m, g] / 127 (the one value of amax the GEMV reads, so
               x_amax itself can live in the quantizing block's shared memory)
``group_dot``  dot[m, g, n] += dp4a(codes(u, t, n), xq_words[m, u*S+t])  reduce [M, G, N | gs/4]
``combine``    y[m, n]      += s * x_step * (dot - z * xq_sum)           reduce [M, N | G]

Operands:

=========  ==========  ==================  ==========================================
name       dtype       shape               content
=========  ==========  ==================  ==========================================
x          float32     [M, K]              activations
qweight    int32       [U, P, N]           byte planes as words (U units of K, P planes)
scales     float16     [G, N]              s[g, n]
zeros      uint8       [G, N]              z[g, n]
y          float32     [M, N]              output
=========  ==========  ==================  ==========================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.uniform.compute_cuda import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_int8 import (
    STEP,
    X_LEVELS,
    planes,
    storage_to_row,
    unit_rows,
)
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_int8.v1"


def steps_per_unit(bits: int) -> int:
    """dp4a steps (4 codes each) per unit of K: 2 at 4 bits, 4 at 2 bits, 8 at 3 bits."""
    return unit_rows(bits) // STEP


def code_word(qweight, unit, step, n, bits: int):
    """int32 with the 4 codes of ``step`` of ``unit`` (column n), one per byte."""
    if bits == 3:
        plane, field = step // 4, step % 4
        low = T.bitwise_and(T.shift_right(qweight[unit, plane, n], T.Cast("int32", field * 2)),
                            T.int32(0x03030303))
        # The high bit of the same 4 codes sits at bit 4*plane + field of each byte of plane 2.
        high = T.bitwise_and(T.shift_right(qweight[unit, 2, n], T.Cast("int32", plane * 4 + field)),
                             T.int32(0x01010101))
        return T.bitwise_or(low, T.shift_left(high, T.int32(2)))
    return step_codes(qweight[unit, 0, n], step, bits)


def step_codes(word, step, bits: int):
    """int32 with the 4 codes of dp4a step ``step`` of a packed 2- or 4-bit ``word``, one per
    byte: ``(word >> step * bits) & 0x0F0F0F0F`` at 4 bits (codes 2j + step in byte j),
    ``& 0x03030303`` at 2 bits."""
    mask = {2: 0x03030303, 4: 0x0F0F0F0F}[bits]
    return T.bitwise_and(T.shift_right(word, T.Cast("int32", step * bits)), T.int32(mask))


def dp4a(a, b, portable: bool = False):
    """``sum_j int8(a, byte j) * int8(b, byte j)`` as int32 (CUDA ``__dp4a``, signed bytes).

    Codes (at most 15) are non-negative as signed bytes too. The accumulator input is zero and
    the sum is added outside, so the block stays a ``+`` reduction TVM can split across threads.
    ``portable``: the same sum in plain TIR arithmetic (any target; for checking the compute on
    a CPU, where ``__dp4a`` does not exist).
    """
    if not portable:
        return T.call_pure_extern("int32", "__dp4a", a, b, T.int32(0))

    def byte(word, j):  # sign-extended byte j: shift it to the top, then arithmetic shift down
        return T.shift_right(T.shift_left(word, T.int32(24 - 8 * j)), T.int32(24))

    total = byte(a, 0) * byte(b, 0)
    for j in range(1, STEP):
        total = total + byte(a, j) * byte(b, j)
    return total


def quantized(value, inverse):
    """int32 ``rint(value * inverse)``, in [-127, 127] (``inverse`` = 127 / amax, or 0)."""
    return T.Cast("int32", T.nearbyint(value * inverse))


def inverse_of(amax, portable: bool = False):
    """float32 ``127 / amax``, or 0 for an all-zero group (its codes are then all 0).

    Rounded as IEEE division (``__fdiv_rn``): TVM compiles CUDA with ``--use_fast_math``, whose
    approximate division would round some activations differently from the host's
    (compute_int8.quantized_activations), and the kernel would not compute what it documents.
    """
    if portable:
        quotient = T.float32(X_LEVELS) / amax
    else:
        quotient = T.call_pure_extern("float32", "__fdiv_rn", T.float32(X_LEVELS), amax)
    return T.Select(amax > T.float32(0), quotient, T.float32(0))


def step_of(amax):
    """float32 ``amax / 127``: the value of one step of x's int8 grid (what the sums of
    rounded x are scaled back by)."""
    return amax * T.float32(1.0 / X_LEVELS)


def packed_word(values):
    """int32 of :data:`STEP` int32 values in [-128, 127], byte j holding value j (two's
    complement bytes, little-endian): the x word a dp4a takes."""
    word = T.uint32(0)
    for j, value in enumerate(values):
        byte = T.bitwise_and(T.Cast("uint32", value), T.uint32(0xFF))
        word = T.bitwise_or(word, T.shift_left(byte, T.uint32(8 * j)))
    return T.Cast("int32", word)


def packed_x_word(x, m, first, inverse, bits: int):
    """int32 of the 4 int8 activations at storage positions ``first .. first + 3`` of row m,
    byte j holding position ``first + j``."""
    return packed_word([quantized(x[m, storage_to_row(first + j, bits)], inverse)
                        for j in range(STEP)])


def quantize_x_blocks(M: int, G: int, gsize: int, column, word, portable: bool = False):
    """A TIR macro ``(x, order, x_amax, x_inverse, xq_words, xq_sum, x_step)``: the blocks that
    round x [M, K] to int8 per row and group of ``gsize`` (``x_amax``, ``x_inverse``,
    ``x_pack``, ``x_qsum``, ``x_step``; see the module docstring), shared by the dp4a and
    tensor-core computes and the mixed family's dp4a compute (a new macro per function: TVM
    suffixes the block names of a macro's later expansions).

    ``column(order, m, g, r)``: the column of x holding element r of group g (``order``: the
    macro's argument, the mixed family's group order; the uniform family passes x and ignores
    it). ``word(x, order, m, g, w, inverse)``: int32 word w of group g's rounded x, in the
    storage order of the codes it multiplies."""
    group_words = gsize // STEP            # int32 words of x per group

    @T.macro
    def quantize(x, order, x_amax, x_inverse, xq_words, xq_sum, x_step):
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_amax"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():  # the identity of max, so TVM matches a reducer across threads
                    x_amax[vm, vg] = T.min_value("float32")
                x_amax[vm, vg] = T.max(x_amax[vm, vg], T.fabs(x[vm, column(order, vm, vg, vr)]))
        for m, g in T.grid(M, G):
            with T.sblock("x_inverse"):
                vm, vg = T.axis.remap("SS", [m, g])
                x_inverse[vm, vg] = inverse_of(x_amax[vm, vg], portable)
        for m, g, w in T.grid(M, G, group_words):
            with T.sblock("x_pack"):
                vm, vg, vw = T.axis.remap("SSS", [m, g, w])
                xq_words[vm, vg * group_words + vw] = word(x, order, vm, vg, vw,
                                                           x_inverse[vm, vg])
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_qsum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    xq_sum[vm, vg] = 0
                xq_sum[vm, vg] = xq_sum[vm, vg] + quantized(
                    x[vm, column(order, vm, vg, vr)], x_inverse[vm, vg])
        for m, g in T.grid(M, G):
            with T.sblock("x_step"):
                vm, vg = T.axis.remap("SS", [m, g])
                x_step[vm, vg] = step_of(x_amax[vm, vg])

    return quantize


def uniform_quantize_x_blocks(M: int, G: int, gsize: int, bits: int, portable: bool = False):
    """:func:`quantize_x_blocks` for the uniform family: groups of consecutive rows of K, x in
    the byte planes' storage order (call it with x in place of ``order``)."""

    def column(order, m, g, r):
        return g * gsize + r

    def word(x, order, m, g, w, inverse):
        return packed_x_word(x, m, g * gsize + w * STEP, inverse, bits)

    return quantize_x_blocks(M, G, gsize, column, word, portable)


def uniform_compute_cuda_int8(spec: UniformSpec, portable: bool = False):
    """The CUDA PrimFunc for an ``int8_activations`` spec (symbol ``spec.name()``);
    ``portable`` spells dp4a and the IEEE division in plain TIR (:func:`dp4a`,
    :func:`inverse_of`) so the unscheduled function also builds and runs on a CPU, for tests."""
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, gsize = spec.bits, spec.effective_group_size
    U, P = K // unit_rows(bits), planes(bits)
    S = steps_per_unit(bits)
    group_steps = gsize // STEP            # dp4a steps per group and column
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}
    quantize = uniform_quantize_x_blocks(M, G, gsize, bits, portable)

    @T.prim_func(s_tir=True)
    def uniform_gemm_cuda_int8(
        x: T.Buffer((M, K), "float32"),
        qweight: T.Buffer((U, P, N), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        x_amax = T.sblock_alloc_buffer((M, G), "float32")
        xq_words = T.sblock_alloc_buffer((M, K // STEP), "int32")
        xq_sum = T.sblock_alloc_buffer((M, G), "int32")
        x_step = T.sblock_alloc_buffer((M, G), "float32")
        x_inverse = T.sblock_alloc_buffer((M, G), "float32")
        dot = T.sblock_alloc_buffer((M, G, N), "int32")
        quantize(x, x, x_amax, x_inverse, xq_words, xq_sum, x_step)
        for m, g, n, r in T.grid(M, G, N, group_steps):
            with T.sblock("group_dot"):
                vm, vg, vn, vr = T.axis.remap("SSSR", [m, g, n, r])
                with T.init():
                    dot[vm, vg, vn] = 0
                dot[vm, vg, vn] = dot[vm, vg, vn] + dp4a(
                    code_word(qweight, (vg * group_steps + vr) // S, vr % S, vn, bits),
                    xq_words[vm, vg * group_steps + vr], portable)
        for m, n, g in T.grid(M, N, G):
            with T.sblock("combine"):
                vm, vn, vg = T.axis.remap("SSR", [m, n, g])
                with T.init():
                    y[vm, vn] = T.float32(0)
                y[vm, vn] = y[vm, vn] + T.Cast("float32", scales[vg, vn]) * x_step[vm, vg] * T.Cast(
                    "float32", dot[vm, vg, vn] - T.Cast("int32", zeros[vg, vn]) * xq_sum[vm, vg])

    return uniform_gemm_cuda_int8
