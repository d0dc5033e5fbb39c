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
from qcompile.kernels.uniform.compute import field_expr, field_scale_expr


def field_scale_cuda(k, bits: int):
    """``2**-(bits * j)`` for k's field j as uniform/compute.py's ``field_scale_expr``, built
    as ``1 / float(1 << bits*j)``: TVM's CUDA code generator prints a reinterpret of a constant
    as the address of a literal, which does not compile (uniform/compute_cuda.py)."""
    per_word = 32 // bits
    j = k % per_word
    return T.Select(j == per_word - 1, T.float32(1), T.float32(1) / T.Cast(
        "float32", T.shift_left(T.int32(1), j * bits)))


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


def mixed_compute(spec: MixedSpec, target_kind: str = "cpu"):
    """The PrimFunc for ``spec`` (symbol ``spec.name()``, spec JSON in its attributes).

    ``target_kind`` "cuda" changes only how the field scales are written (same values)."""
    field_scale = field_scale_cuda if target_kind == "cuda" else field_scale_expr
    lay = spec.layout
    M, K, N = spec.m, spec.k, spec.n
    G, G2, H = lay.groups, lay.groups2, lay.scale_groups4
    K2, K4, C = lay.rows2, lay.rows4, lay.capacity
    g1, g2, g4 = lay.g1, lay.g2, lay.g4
    attrs = spec.func_attrs()
    scale1, finish = scale1_block(), finish_block()

    @T.prim_func(s_tir=True)
    def mixed_gemm(
        x: T.Buffer((M, K), "float32"),
        order: T.Buffer((G,), "int32"),
        codes2: T.Buffer((K2 // 16, N), "int32"),
        meta2: T.Buffer((G2, N), "uint8"),
        scale2: T.Buffer((G2, N // g2), "float16"),
        zero2: T.Buffer((G2, N // g2), "uint8"),
        codes4: T.Buffer((K4 // 8, N), "int32"),
        scales4: T.Buffer((H, N), "float16"),
        zeros4: T.Buffer((H, N), "uint8"),
        row_ptr: T.Buffer((N + 1,), "int32"),
        cols: T.Buffer((C,), "uint16"),
        values: T.Buffer((C,), "float16"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        x2 = T.sblock_alloc_buffer((M, K2), "float32")
        xs2 = T.sblock_alloc_buffer((M, G2), "float32")
        dot2 = T.sblock_alloc_buffer((M, G2, N), "float32")
        s1 = T.sblock_alloc_buffer((G2, N), "float32")
        y2 = T.sblock_alloc_buffer((M, N), "float32")
        x4 = T.sblock_alloc_buffer((M, K4), "float32")
        xs4 = T.sblock_alloc_buffer((M, H), "float32")
        dot4 = T.sblock_alloc_buffer((M, H, N), "float32")
        y4 = T.sblock_alloc_buffer((M, N), "float32")
        for m, r in T.grid(M, K2):
            with T.sblock("gather2"):
                vm, vr = T.axis.remap("SS", [m, r])
                x2[vm, vr] = x[vm, order[vr // g1] * g1 + vr % g1] * field_scale(vr, 2)
        for m, g, j in T.grid(M, G2, g1):
            with T.sblock("group_sum2"):
                vm, vg, vj = T.axis.remap("SSR", [m, g, j])
                with T.init():
                    xs2[vm, vg] = T.float32(0)
                xs2[vm, vg] = xs2[vm, vg] + x[vm, order[vg] * g1 + vj]
        for m, g, n, j in T.grid(M, G2, N, g1):
            with T.sblock("group_dot2"):
                vm, vg, vn, vj = T.axis.remap("SSSR", [m, g, n, j])
                with T.init():
                    dot2[vm, vg, vn] = T.float32(0)
                dot2[vm, vg, vn] = dot2[vm, vg, vn] + x2[vm, vg * g1 + vj] * field_expr(
                    codes2, vg * g1 + vj, vn, 2)
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
                x4[vm, vr] = x[vm, order[G2 + vr // g1] * g1 + vr % g1] * field_scale(vr, 4)
        for m, h, j in T.grid(M, H, g4):
            with T.sblock("group_sum4"):
                vm, vh, vj = T.axis.remap("SSR", [m, h, j])
                with T.init():
                    xs4[vm, vh] = T.float32(0)
                xs4[vm, vh] = xs4[vm, vh] + x[
                    vm, order[G2 + (vh * g4 + vj) // g1] * g1 + (vh * g4 + vj) % g1]
        for m, h, n, j in T.grid(M, H, N, g4):
            with T.sblock("group_dot4"):
                vm, vh, vn, vj = T.axis.remap("SSSR", [m, h, n, j])
                with T.init():
                    dot4[vm, vh, vn] = T.float32(0)
                dot4[vm, vh, vn] = dot4[vm, vh, vn] + x4[vm, vh * g4 + vj] * field_expr(
                    codes4, vh * g4 + vj, vn, 4)
        for m, n, h in T.grid(M, N, H):
            with T.sblock("combine4"):
                vm, vn, vh = T.axis.remap("SSR", [m, n, h])
                with T.init():
                    y4[vm, vn] = T.float32(0)
                y4[vm, vn] = y4[vm, vn] + T.Cast("float32", scales4[vh, vn]) * (
                    dot4[vm, vh, vn] - T.Cast("float32", zeros4[vh, vn]) * xs4[vm, vh])
        finish(y, y2, y4, x, row_ptr, cols, values, M, N, K, C)

    return mixed_gemm
