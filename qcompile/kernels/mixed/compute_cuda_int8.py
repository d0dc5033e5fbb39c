"""TensorIR of the mixed family with int8 activations on CUDA GPUs: ``dp4a`` for both parts.

The float CUDA kernel (compute.py, ``target_kind="cuda"``) decodes each code with about one
LOP3, one FADD and one FFMA, whatever its width, so its 2-bit groups cost as much issue as
4-bit ones and the kernel stays well short of the uniform 4-bit kernel's effective bandwidth
(docs/design/mixed.md, "GPU: int8 activations (dp4a)"; the numbers:
docs/results/from-docstrings.md). Here, as in the uniform
family's dp4a kernel (uniform/compute_cuda_int8.py, whose code words, dp4a and rounding this
module reuses), x is rounded to int8 once per call, per row and g1-group, and a word of packed
codes feeds ``dp4a`` after one shift and one AND per four codes, at either width:

    xq[m, k]   = rint(x[m, k] * (127 / amax[m, s]))      (s: k's g1-group, in storage order)
    y2[m, n]   = sum_{s < G2} scale2[s, n/g2] * step[m, s]
                               * (c1[s, n] * (dot2[m, s, n] - z1[s, n] * xqs[m, s]))
    y4[m, n]   = sum_{s < G4} scales4[h, n] * step[m, G2 + s]
                               * (dot4[m, s, n] - zeros4[h, n] * xqs[m, G2 + s])
    y[m, n]    = y2 + y4 + sum_{j in row_ptr[n]..row_ptr[n+1]} values[j] * x[m, cols[j]]

with step = amax / 127, h = s // (g4 / g1), ``dot2``/``dot4`` exact int32 sums of dp4a over a
g1-group, and c1 = s1q + zero2 the first-order scale's integer code (s1 = c1 * scale2, the
second-order dequantization of compute.py): the 2-bit product stays integer up to one convert
(|c1 * (dot2 - z1 * xqs)| <= 78 * 2 * 3 * 127 * g1, exact in int32 for g1 < 1700), and its float
factor scale2 * step is one per g2 columns, which a thread's 4 columns share. This is the CPU
int8 kernel's value (compute_int8.py: the same rounding of x per row and g1-group, outliers in
float32 with the float x) up to float32 rounding, so ``MixedFamily.kernel_reference`` describes
both.

x is stored as int32 words of 4 int8 in storage order: the g1-groups in the format's group
order (2-bit groups first, then 4-bit ones), inside a group the rows permuted as the codes'
bytes are (uniform/compute_int8.storage_to_row at the part's width), so word ``s * g1/4 + r``
of a row pairs with dp4a step r of group s.

Blocks (schedules/cuda/mixed_int8.py schedules them by these names):

``x_amax``     amax[m, s]      = max_j |x[m, order[s]*g1 + j]|          reduce [M, G | g1]
``x_inverse``  inv[m, s]       = 127 / amax[m, s] (IEEE division)       spatial [M, G]
``x_pack``     xq_words[m, s*g1/4 + w] = 4 rounded int8 of group s      spatial [M, G, g1/4]
``x_qsum``     xq_sum[m, s]    = sum_j rint(x[m, order[s]*g1 + j] * inv) reduce [M, G | g1]
``x_step``     x_step[m, s]    = amax[m, s] / 127                        spatial [M, G]
``group_dot2`` dot2[m, s, n]  += dp4a(2-bit code word, x word)          reduce [M, G2, N | g1/4]
``group_dot4`` dot4[m, s, n]  += dp4a(4-bit code word, x word)          reduce [M, G4, N | g1/4]
``scale1``     c1[s, n]        = s1q + zero2 (first-order scale code)   spatial [G2, N]
``combine2``   y2[m, n]       += scale2 * x_step * (c1 * (dot2 - z1 * xq_sum)) reduce [M, N | G2]
``combine4``   y4[m, n]       += scale4 * x_step * (dot4 - zero4 * xq_sum) reduce [M, N | G4]
``finish``     y = y2 + y4 + the column's CSR outliers times x           spatial [M, N]

Operands: x float32 [M, K], then formats/mixed.py's operands in their order, with ``codes2``
int32 [K2/16, 1, N] and ``codes4`` int32 [K4/8, 1, N]: the format's words (uniform's byte
planes at P = 1, read as words: layout ``plane_words``), then y float32 [M, N].
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.mixed.compute import finish_block, mixed_function
from qcompile.kernels.mixed.spec import MixedSpec
from qcompile.kernels.tir.activations import quantize_x_blocks, quantized
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.int8_dot import code_word, dp4a, steps_per_unit
from qcompile.kernels.tir.planes import STEP, storage_to_row, unit_rows

COMPUTE_NAME = "mixed.cuda_int8.v1"


def x_word(x, order, m, s, w, inverse, groups2: int, g1: int):
    """int32 of the 4 int8 activations of word ``w`` of g1-group ``s`` of row m (storage
    order: the group's rows permuted as its part's codes are, byte j holding position
    ``4w + j``)."""
    word = T.uint32(0)
    for j in range(STEP):
        position = w * STEP + j
        row = T.Select(s < groups2, storage_to_row(position, 2), storage_to_row(position, 4))
        value = quantized(x[m, order[s] * g1 + row], inverse)
        byte = T.bitwise_and(T.Cast("uint32", value), T.uint32(0xFF))
        word = T.bitwise_or(word, T.shift_left(byte, T.uint32(8 * j)))
    return T.Cast("int32", word)


def dp4a_group_dot(M: int, N: int, words: int, portable: bool):
    """A TIR macro ``(name, dot, codes, xq_words, first, groups, bits)``: block ``name``, the
    exact int32 sums of dp4a over each of a part's ``groups`` g1-groups (``words`` steps each),
    its codes' words against x's words from word ``first`` on (a new macro per call site)."""

    @T.macro
    def group_dot(name, dot, codes, xq_words, first, groups, bits):
        for m, s, n, r in T.grid(M, groups, N, words):
            with T.sblock(name):
                vm, vs, vn, vr = T.axis.remap("SSSR", [m, s, n, r])
                with T.init():
                    dot[vm, vs, vn] = 0
                dot[vm, vs, vn] = dot[vm, vs, vn] + dp4a(
                    code_word(codes, (vs * words + vr) // steps_per_unit(bits),
                              (vs * words + vr) % steps_per_unit(bits), vn, bits),
                    xq_words[vm, first + vs * words + vr], portable)

    return group_dot


def mixed_compute_cuda_int8(spec: MixedSpec, portable: bool = False):
    """The CUDA PrimFunc for an ``int8_activations`` spec (symbol ``spec.name()``);
    ``portable`` spells dp4a and the IEEE division in plain TIR so the unscheduled function
    also builds and runs on a CPU, for tests."""
    lay = spec.layout
    M, K, N = spec.m, spec.k, spec.n
    G, G2, G4 = lay.groups, lay.groups2, lay.groups4
    K2, K4, C = lay.rows2, lay.rows4, lay.capacity
    g1, g2 = lay.g1, lay.g2
    per4 = lay.g4 // g1
    words = g1 // STEP                      # x words (and dp4a steps) per g1-group
    first4 = G2 * words                     # the 4-bit part's first word of x
    U2, U4 = K2 // unit_rows(2), K4 // unit_rows(4)
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}
    finish = finish_block()

    def column(order, m, s, j):
        return order[s] * g1 + j

    def word(x, order, m, s, w, inverse):
        return x_word(x, order, m, s, w, inverse, G2, g1)

    quantize = quantize_x_blocks(M, G, g1, column, word, portable)
    group_dot2, group_dot4 = dp4a_group_dot(M, N, words, portable), dp4a_group_dot(
        M, N, words, portable)

    @T.macro
    def body(x, order, codes2, meta2, scale2, zero2, codes4, scales4, zeros4, row_ptr, cols,
             values, y):
        x_amax = T.sblock_alloc_buffer((M, G), "float32")
        x_inverse = T.sblock_alloc_buffer((M, G), "float32")
        xq_words = T.sblock_alloc_buffer((M, G * words), "int32")
        xq_sum = T.sblock_alloc_buffer((M, G), "int32")
        x_step = T.sblock_alloc_buffer((M, G), "float32")
        dot2 = T.sblock_alloc_buffer((M, G2, N), "int32")
        dot4 = T.sblock_alloc_buffer((M, G4, N), "int32")
        c1 = T.sblock_alloc_buffer((G2, N), "int32")
        y2 = T.sblock_alloc_buffer((M, N), "float32")
        y4 = T.sblock_alloc_buffer((M, N), "float32")
        quantize(x, order, x_amax, x_inverse, xq_words, xq_sum, x_step)
        group_dot2("group_dot2", dot2, codes2, xq_words, 0, G2, 2)
        group_dot4("group_dot4", dot4, codes4, xq_words, first4, G4, 4)
        for s, n in T.grid(G2, N):
            with T.sblock("scale1"):  # the name of compute.py's block: the spaces place it
                vs, vn = T.axis.remap("SS", [s, n])
                c1[vs, vn] = T.Cast("int32", T.shift_right(meta2[vs, vn], T.uint8(2))) + T.Cast(
                    "int32", zero2[vs, vn // g2])
        for m, n, s in T.grid(M, N, G2):
            with T.sblock("combine2"):
                vm, vn, vs = T.axis.remap("SSR", [m, n, s])
                with T.init():
                    y2[vm, vn] = T.float32(0)
                y2[vm, vn] = y2[vm, vn] + T.Cast("float32", scale2[vs, vn // g2]) * x_step[
                    vm, vs] * T.Cast("float32", c1[vs, vn] * (dot2[vm, vs, vn] - T.Cast(
                        "int32", T.bitwise_and(meta2[vs, vn], T.uint8(3))) * xq_sum[vm, vs]))
        for m, n, s in T.grid(M, N, G4):
            with T.sblock("combine4"):
                vm, vn, vs = T.axis.remap("SSR", [m, n, s])
                with T.init():
                    y4[vm, vn] = T.float32(0)
                y4[vm, vn] = y4[vm, vn] + T.Cast("float32", scales4[vs // per4, vn]) * x_step[
                    vm, G2 + vs] * T.Cast("float32", dot4[vm, vs, vn] - T.Cast(
                        "int32", zeros4[vs // per4, vn]) * xq_sum[vm, G2 + vs])
        finish(y, y2, y4, x, row_ptr, cols, values, M, N, K, C)

    return mixed_function(spec, ((U2, 1, N), "int32"), ((U4, 1, N), "int32"), attrs, body)
