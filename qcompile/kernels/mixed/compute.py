"""TensorIR of the mixed family: both parts and the outliers in one PrimFunc.

Each part is in the uniform family's factorised form (QIGen eq. 2: integer codes times the
activations, scale and zero-point applied once per group with per-group sums of x), with the
activations gathered through ``order`` (the storage order of the g1-groups) once per call:

    y[m, n] = y2[m, n] + y4[m, n] + sum_{j in row_ptr[n]..row_ptr[n+1]} values[j] * x[m, cols[j]]
    y2[m, n] = sum_g s1[g, n] * (dot2[m, g, n] - z1[g, n] * xs2[m, g])
    s1[g, n] = (s1q[g, n] + zero2[g, n / g2]) * scale2[g, n / g2]        (second-order dequant)
    y4[m, n] = sum_h scales4[h, n] * (dot4[m, h, n] - zeros4[h, n] * xs4[m, h])

Blocks: ``gather2``/``gather4`` (x in storage order, times the field scale of
uniform/compute.py), ``group_sum2``/``group_sum4``, ``group_dot2``/``group_dot4`` (codes never
dequantized), ``scale1`` (the second-order dequantization of the 2-bit part's scales, placed
by the design spaces: section 5), ``combine2``/``combine4``, and ``finish``, which adds the two
parts and walks the column's CSR outliers (a loop whose bounds are data: the one non-affine
part, a few iterations per column).

Operands: x float32 [M, K], then formats/mixed.py's operands in their order, then y float32
[M, N].
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.mixed.spec import MixedSpec
from qcompile.kernels.tir.codes import field_expr, field_scale_expr
from qcompile.kernels.tir.magic import magic_bits_from, magic_float


def field_scale_cuda(k, bits: int):
    """``2**-(bits * (j % half))`` for k's field j, ``half`` = fields per 16 bits: the factor
    that undoes :func:`field_expr_cuda`'s in-place field. Built as ``1 / float(1 << ...)``: TVM's
    CUDA code generator prints a reinterpret of a constant as the address of a literal, which
    does not compile (uniform/compute_cuda.py)."""
    per_word = 32 // bits
    j = (k % per_word) % (per_word // 2)
    return T.float32(1) / T.Cast("float32", T.shift_left(T.int32(1), j * bits))


def field_expr_cuda(codes, k, n, bits: int, magic_source):
    """float32 code q[k, n] times ``2**(bits * (j % half))`` without an int-to-float convert
    (a quarter-rate instruction on NVIDIA GPUs, the decode's bottleneck): the field, in place in
    its 16-bit half of the word, is OR-ed into the mantissa of 2**23 and 2**23 subtracted:
    one LOP3, one FADD (plus a shift per word for the upper fields), exact.

    ``magic_source``: a uint8 value of the code's group and column, from which the exponent
    bits of 2**23 are computed (:func:`~qcompile.kernels.uniform.compute_cuda.magic_bits_from`:
    as a register, not an immediate, so mask and OR are one LOP3)."""
    per_word = 32 // bits
    half = per_word // 2
    j = k % per_word
    word = T.Cast("uint32", codes[k // per_word, n])
    halfword = T.Select(j >= half, T.shift_right(word, T.uint32(16)), word)
    field = T.bitwise_and(halfword, T.shift_left(T.uint32((1 << bits) - 1),
                                                 T.Cast("uint32", (j % half) * bits)))
    magic = magic_bits_from(T.Cast("float32", magic_source))
    return magic_float(field, magic) - T.float32(1 << 23)


def field_expr_cpu(codes, k, n, bits: int, magic_source):
    """:func:`field_expr` with :func:`field_expr_cuda`'s signature (``magic_source`` unused)."""
    return field_expr(codes, k, n, bits)


def scale1_block():
    """A TIR macro ``(s1, meta2, scale2, zero2, G2, N, g2)``: block ``scale1``, the 2-bit part's
    second-order dequantization ``s1 = (s1q + zero2) * scale2`` (a new macro per function: TVM
    suffixes the block names of a macro's later expansions)."""

    @T.macro
    def scale1(s1, meta2, scale2, zero2, G2, N, g2):
        for g, n in T.grid(G2, N):
            with T.sblock("scale1"):
                vg, vn = T.axis.remap("SS", [g, n])
                s1[vg, vn] = T.Cast(
                    "float32", T.shift_right(meta2[vg, vn], T.uint8(2)) + zero2[vg, vn // g2]
                ) * T.Cast("float32", scale2[vg, vn // g2])

    return scale1


def finish_block():
    """A TIR macro ``(y, y2, y4, x, row_ptr, cols, values, M, N, K, C)``: block ``finish``,
    ``y = y2 + y4`` plus the column's CSR outliers times x (float32), a new macro per function
    (see :func:`scale1_block`)."""

    @T.macro
    def finish(y, y2, y4, x, row_ptr, cols, values, M, N, K, C):
        for m, n in T.grid(M, N):
            with T.sblock("finish"):
                vm, vn = T.axis.remap("SS", [m, n])
                T.reads(y2[vm, vn], y4[vm, vn], row_ptr[vn:vn + 2], cols[0:C], values[0:C],
                        x[vm, 0:K])
                T.writes(y[vm, vn])
                y[vm, vn] = y2[vm, vn] + y4[vm, vn]
                for j in T.serial(row_ptr[vn], row_ptr[vn + 1]):
                    y[vm, vn] = y[vm, vn] + T.Cast("float32", values[j]) * x[
                        vm, T.Cast("int32", cols[j])]

    return finish


def mixed_function(spec: MixedSpec, codes2, codes4, attrs: dict, body):
    """The PrimFunc over the family's operands, formats/mixed.py's in their order: x float32
    [M, K], order, codes2, meta2, scale2, zero2, codes4, scales4, zeros4, the CSR outliers
    (row_ptr, cols, values), y float32 [M, N]. ``codes2`` and ``codes4`` are ``(shape,
    dtype)``: how each compute reads the format's words. ``body`` is a TIR macro over those
    thirteen buffers, in that order, that allocates its own buffers and writes y."""
    lay = spec.layout
    M, K, N = spec.m, spec.k, spec.n
    G, G2, H, C, g2 = lay.groups, lay.groups2, lay.scale_groups4, lay.capacity, lay.g2
    (shape2, dtype2), (shape4, dtype4) = codes2, codes4

    @T.prim_func(s_tir=True)
    def mixed_gemm(
        x: T.Buffer((M, K), "float32"),
        order: T.Buffer((G,), "int32"),
        codes2: T.Buffer(shape2, dtype2),
        meta2: T.Buffer((G2, N), "uint8"),
        scale2: T.Buffer((G2, N // g2), "float16"),
        zero2: T.Buffer((G2, N // g2), "uint8"),
        codes4: T.Buffer(shape4, dtype4),
        scales4: T.Buffer((H, N), "float16"),
        zeros4: T.Buffer((H, N), "uint8"),
        row_ptr: T.Buffer((N + 1,), "int32"),
        cols: T.Buffer((C,), "uint16"),
        values: T.Buffer((C,), "float16"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        body(x, order, codes2, meta2, scale2, zero2, codes4, scales4, zeros4, row_ptr, cols,
             values, y)

    return mixed_gemm


def mixed_compute(spec: MixedSpec, target_kind: str = "cpu"):
    """The PrimFunc for ``spec`` (symbol ``spec.name()``, spec JSON in its attributes).

    ``target_kind`` "cuda" changes how fields are decoded and scaled (same values, exact:
    :func:`field_expr_cuda`), gathers x without the field factors (they go into the dot
    product), and runs the 4-bit part's dot products and x sums per g1-group (the scale and
    zero of its g4 group applied to each): the same sums in another order."""
    cuda = target_kind == "cuda"
    field = field_expr_cuda if cuda else field_expr_cpu

    # CPU: the field factors go into the gathered x once (gather2/gather4). CUDA: the gathered
    # x stays plain (a group's x is one run of 16 floats the schedule loads with 128-bit
    # loads, and its group sum reads it from there); the factor, a constant once unrolled,
    # goes into the dot product.
    def gathered(value, k, bits: int):
        return value if cuda else value * field_scale_expr(k, bits)

    def group_input(from_x, from_gathered):
        return from_gathered if cuda else from_x

    def scaled(value, k, bits: int):
        return value * field_scale_cuda(k, bits) if cuda else value
    lay = spec.layout
    M, K, N = spec.m, spec.k, spec.n
    G2, H = lay.groups2, lay.scale_groups4
    K2, K4, C = lay.rows2, lay.rows4, lay.capacity
    g1, g2, g4 = lay.g1, lay.g2, lay.g4
    # The 4-bit part's dot products and x sums run over H1 groups of r1 rows: its scale groups
    # on CPUs; on CUDA its g1-groups (runs of g1 floats of x, like the 2-bit part's), each
    # scaled by its g4 group's scale and zero.
    H1, r1 = (K4 // g1, g1) if cuda else (H, g4)

    def scale_group(vh):
        return vh // (g4 // g1) if cuda else vh

    attrs = spec.func_attrs()
    scale1, finish = scale1_block(), finish_block()

    @T.macro
    def body(x, order, codes2, meta2, scale2, zero2, codes4, scales4, zeros4, row_ptr, cols,
             values, y):
        x2 = T.sblock_alloc_buffer((M, K2), "float32")
        xs2 = T.sblock_alloc_buffer((M, G2), "float32")
        dot2 = T.sblock_alloc_buffer((M, G2, N), "float32")
        s1 = T.sblock_alloc_buffer((G2, N), "float32")
        y2 = T.sblock_alloc_buffer((M, N), "float32")
        x4 = T.sblock_alloc_buffer((M, K4), "float32")
        xs4 = T.sblock_alloc_buffer((M, H1), "float32")
        dot4 = T.sblock_alloc_buffer((M, H1, N), "float32")
        y4 = T.sblock_alloc_buffer((M, N), "float32")
        for m, r in T.grid(M, K2):
            with T.sblock("gather2"):
                vm, vr = T.axis.remap("SS", [m, r])
                x2[vm, vr] = gathered(x[vm, order[vr // g1] * g1 + vr % g1], vr, 2)
        for m, g, j in T.grid(M, G2, g1):
            with T.sblock("group_sum2"):
                vm, vg, vj = T.axis.remap("SSR", [m, g, j])
                with T.init():
                    xs2[vm, vg] = T.float32(0)
                xs2[vm, vg] = xs2[vm, vg] + group_input(x[vm, order[vg] * g1 + vj],
                                                         x2[vm, vg * g1 + vj])
        for m, g, n, j in T.grid(M, G2, N, g1):
            with T.sblock("group_dot2"):
                vm, vg, vn, vj = T.axis.remap("SSSR", [m, g, n, j])
                with T.init():
                    dot2[vm, vg, vn] = T.float32(0)
                dot2[vm, vg, vn] = dot2[vm, vg, vn] + scaled(
                    x2[vm, vg * g1 + vj], vg * g1 + vj, 2) * field(codes2, vg * g1 + vj, vn, 2,
                                                                   meta2[vg, vn])
        scale1(s1, meta2, scale2, zero2, G2, N, g2)
        for m, n, g in T.grid(M, N, G2):
            with T.sblock("combine2"):
                vm, vn, vg = T.axis.remap("SSR", [m, n, g])
                with T.init():
                    y2[vm, vn] = T.float32(0)
                y2[vm, vn] = y2[vm, vn] + s1[vg, vn] * (
                    dot2[vm, vg, vn]
                    - T.Cast("float32", T.bitwise_and(meta2[vg, vn], T.uint8(3))) * xs2[vm, vg])
        for m, r in T.grid(M, K4):
            with T.sblock("gather4"):
                vm, vr = T.axis.remap("SS", [m, r])
                x4[vm, vr] = gathered(x[vm, order[G2 + vr // g1] * g1 + vr % g1], vr, 4)
        for m, h, j in T.grid(M, H1, r1):
            with T.sblock("group_sum4"):
                vm, vh, vj = T.axis.remap("SSR", [m, h, j])
                with T.init():
                    xs4[vm, vh] = T.float32(0)
                xs4[vm, vh] = xs4[vm, vh] + group_input(
                    x[vm, order[G2 + (vh * r1 + vj) // g1] * g1 + (vh * r1 + vj) % g1],
                    x4[vm, vh * r1 + vj])
        for m, h, n, j in T.grid(M, H1, N, r1):
            with T.sblock("group_dot4"):
                vm, vh, vn, vj = T.axis.remap("SSSR", [m, h, n, j])
                with T.init():
                    dot4[vm, vh, vn] = T.float32(0)
                dot4[vm, vh, vn] = dot4[vm, vh, vn] + scaled(
                    x4[vm, vh * r1 + vj], vh * r1 + vj, 4) * field(
                        codes4, vh * r1 + vj, vn, 4, zeros4[scale_group(vh), vn])
        for m, n, h in T.grid(M, N, H1):
            with T.sblock("combine4"):
                vm, vn, vh = T.axis.remap("SSR", [m, n, h])
                with T.init():
                    y4[vm, vn] = T.float32(0)
                y4[vm, vn] = y4[vm, vn] + T.Cast("float32", scales4[scale_group(vh), vn]) * (
                    dot4[vm, vh, vn]
                    - T.Cast("float32", zeros4[scale_group(vh), vn]) * xs4[vm, vh])
        finish(y, y2, y4, x, row_ptr, cols, values, M, N, K, C)

    return mixed_function(spec, ((K2 // 16, N), "int32"), ((K4 // 8, N), "int32"), attrs, body)
