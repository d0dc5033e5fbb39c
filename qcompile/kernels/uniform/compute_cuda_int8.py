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

The codes are the CPU int8 kernel's byte planes (tir.planes.byte_planes: GPTQ's own words at
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
from qcompile.kernels.tir.activations import packed_word, quantize_x_blocks, quantized
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.int8_dot import code_word, dp4a, steps_per_unit
from qcompile.kernels.tir.planes import STEP, planes, storage_to_row, unit_rows
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_int8.v1"


def packed_x_word(x, m, first, inverse, bits: int):
    """int32 of the 4 int8 activations at storage positions ``first .. first + 3`` of row m,
    byte j holding position ``first + j``."""
    return packed_word([quantized(x[m, storage_to_row(first + j, bits)], inverse)
                        for j in range(STEP)])


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
