"""TensorIR of the uniform family, in QIGen's factorised form (eq. 1 and 2):

    y[m, n] = sum_g s[g, n] * (dot[m, g, n] - z[g, n] * xsum[m, g])
    dot[m, g, n] = sum_{k in g} x[m, k] * q[k, n]         (codes, never dequantized)
    xsum[m, g] = sum_{k in g} x[m, k]

so the inner loop is one multiply-add per weight and scales and zero-points are applied once per
group. With group_size -1 there is one group (eq. 1, the full-column fast path). Scales stay fp16
and zero-points uint8 (3 bytes per group and column, against 64 of 4-bit codes at g=128): a GEMV
streams its weights once, so every byte counts.

Field extraction without shifts: for a field j below the top of a 2/4/8-bit word,
``w & (mask << b*j)`` is the code times 2**(b*j), exact in float32 (a code has at most 8
significant bits); the factor 2**-(b*j) is folded into x once per call (``scale_x``). The top
field is a plain
logical shift. That leaves AND, convert, FMA per vector of weights. 3-bit fields straddle words and
use the general shift-or-mask decode.

Operands (all compact, row-major):

=========  ========  ==================  =============================================
name       dtype     shape               content
=========  ========  ==================  =============================================
x          float32   [M, K]              activations
qweight    int32     [K * bits/32, N]    GPTQ codes packed along K (the checkpoint's bits)
scales     float16   [G, N]              s[g, n], as GPTQ stores them
zeros      uint8     [G, N]              z[g, n], unpacked once at prepare time
y          float32   [M, N]              output
=========  ========  ==================  =============================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.tir.codes import field_expr, field_scale_expr
from qcompile.kernels.uniform.spec import UniformSpec


def uniform_compute(spec: UniformSpec):
    """The PrimFunc for ``spec`` (symbol ``spec.name()``, spec JSON in its attributes).

    Variants keep the four blocks and their names, so the design spaces apply to every one:
    float16/bfloat16 activations are converted to float32 where ``scale_x`` and ``group_sum``
    read them and the float32 result is converted back by a last block, ``cast_y``; act_order's
    gather ``x[:, perm]`` is fused into the same two reads. The float32 sequential kernel is
    exactly the TensorIR of compute version 1.
    """
    widened = spec.act_order or spec.dtype != "float32"
    blocks = _gemm_blocks(spec, widened)
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    rows, dtype, attrs = spec.packed_rows, spec.dtype, spec.func_attrs()
    if not spec.act_order:
        return uniform_function(m=M, k=K, n=N, groups=G, rows=rows, dtype=dtype, attrs=attrs,
                                body=blocks)

    @T.prim_func(s_tir=True)
    def uniform_gemm_gather(
        x: T.Buffer((M, K), dtype),
        qweight: T.Buffer((rows, N), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        perm: T.Buffer((K,), "int32"),
        y: T.Buffer((M, N), dtype),
    ):
        T.func_attr(attrs)
        blocks(x, qweight, scales, zeros, y, perm)

    return uniform_gemm_gather


def uniform_function(*, m: int, k: int, n: int, groups: int, rows: int, dtype: str,
                     attrs: dict, body):
    """The PrimFunc over the family's operands without act_order (x and y of ``dtype``, qweight
    int32 [rows, N], scales float16 and zeros uint8 [G, N]); ``body`` is a TIR macro ``(x,
    qweight, scales, zeros, y)`` that allocates its own buffers and writes y. The CPU and CUDA
    computes share it."""
    M, K, N, G = m, k, n, groups

    @T.prim_func(s_tir=True)
    def uniform_gemm(
        x: T.Buffer((M, K), dtype),
        qweight: T.Buffer((rows, N), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), dtype),
    ):
        T.func_attr(attrs)
        body(x, qweight, scales, zeros, y)

    return uniform_gemm


def _gemm_blocks(spec: UniformSpec, widened: bool):
    """A TIR macro ``(x, qweight, scales, zeros, y, perm=None)``: the buffers and blocks of
    :func:`uniform_compute`. ``perm`` is None, or act_order's permutation (x is read at
    ``perm[k]``); ``widened`` (act_order, or activations not float32): x is converted to float32
    where it is read, and ``combine`` accumulates into ``y_acc``, which ``cast_y`` stores."""
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, gsize, dtype = spec.bits, spec.effective_group_size, spec.dtype

    def read_x(x, perm, m, k):
        value = x[m, k] if perm is None else x[m, perm[k]]
        return T.Cast("float32", value) if widened else value

    @T.macro
    def blocks(x, qweight, scales, zeros, y, perm=None):
        x_field = T.sblock_alloc_buffer((M, K), "float32")
        x_sum = T.sblock_alloc_buffer((M, G), "float32")
        dot = T.sblock_alloc_buffer((M, G, N), "float32")
        if widened:
            y_acc = T.sblock_alloc_buffer((M, N), "float32")
        else:
            y_acc = T.meta_var(y)  # y itself, not renamed
        for m, k in T.grid(M, K):
            with T.sblock("scale_x"):
                vm, vk = T.axis.remap("SS", [m, k])
                x_field[vm, vk] = read_x(x, perm, vm, vk) * field_scale_expr(vk, bits)
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("group_sum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    x_sum[vm, vg] = T.float32(0)
                x_sum[vm, vg] = x_sum[vm, vg] + read_x(x, perm, vm, vg * gsize + vr)
        for m, g, n, r in T.grid(M, G, N, gsize):
            with T.sblock("group_dot"):
                vm, vg, vn, vr = T.axis.remap("SSSR", [m, g, n, r])
                with T.init():
                    dot[vm, vg, vn] = T.float32(0)
                dot[vm, vg, vn] = dot[vm, vg, vn] + x_field[vm, vg * gsize + vr] * field_expr(
                    qweight, vg * gsize + vr, vn, bits)
        for m, n, g in T.grid(M, N, G):
            with T.sblock("combine"):
                vm, vn, vg = T.axis.remap("SSR", [m, n, g])
                with T.init():
                    y_acc[vm, vn] = T.float32(0)
                y_acc[vm, vn] = y_acc[vm, vn] + T.Cast("float32", scales[vg, vn]) * (
                    dot[vm, vg, vn] - T.Cast("float32", zeros[vg, vn]) * x_sum[vm, vg])
        if widened:
            for m, n in T.grid(M, N):
                with T.sblock("cast_y"):
                    vm, vn = T.axis.remap("SS", [m, n])
                    y[vm, vn] = T.Cast(dtype, y_acc[vm, vn])

    return blocks
