"""TensorIR of the uniform family for CUDA GPUs: the same operands and blocks as compute.py,
factorised for a GPU's instruction rates.

compute.py (QIGen's form, right for CPUs) turns each code into a float with an integer->float
conversion and folds the zero-points out with per-group sums of x. On NVIDIA GPUs from sm_80 to
sm_90 that conversion runs at 16 results per clock per SM, a quarter of the integer logic and an
eighth of the fp32 add/FMA rate: at 4 bits and M = 1 it alone would cost more time than reading
the weights from HBM (the estimate: docs/design/uniform-cuda.md, "The float-x kernel"). So
here a code becomes a float with the "magic number" trick, and the zero-point is subtracted
from it exactly, which removes the per-group sums of x altogether:

    y[m, n]      = sum_g s[g, n] * dot[m, g, n]
    dot[m, g, n] = sum_{k in g} xf[m, k] * ((q[k, n] - z[g, n]) * 2**(b*j'))
    xf[m, k]     = x[m, k] * 2**-(b*j')                (j' = k's field in its 16-bit half)

with, for 2/4/8-bit words w and the field's mask shifted in place within its half h of w,

    float_bits(0x4B000000 | (h & (mask << b*j')))  =  2**23 + q * 2**(b*j')     (exact: < 2**24)
    (2**23 + q * 2**(b*j')) - (2**23 + z * 2**(b*j'))  =  (q - z) * 2**(b*j')   (exact)

That is one LOP3, one FADD and one FFMA per weight at M = 1 (plus one shift per word for the
upper half), all at full rate. The FADD cannot be folded away: 2**23 times a sum of x would
swamp the dot product in float32. 3-bit codes straddle words; they use the bit-stream extraction
of compute.py and the same magic-number conversion (j' = 0).

Blocks (the CUDA design space in schedules/cuda/ schedules them by these names):

``scale_x``    xf[m, k] = float32(x[m, k]) * 2**-(b*j')          spatial  [M, K]
``group_dot``  dot[m, g, n] += xf * ((q - z) * 2**(b*j'))         reduce   [M, G, N | gsize]
``combine``    y[m, n] += float32(s[g, n]) * dot[m, g, n]        reduce   [M, N | G]
``store``      y[m, n] = cast(y_acc[m, n])  (only when the dtype is not float32; combine then
               accumulates into the float32 ``y_acc``)

Operands are those of compute.py, so ``prepare`` serves both:

=========  ==========  ==================  ==========================================
name       dtype       shape               content
=========  ==========  ==================  ==========================================
x          spec.dtype  [M, K]              activations
qweight    int32       [K * bits/32, N]    GPTQ codes packed along K
scales     float16     [G, N]              s[g, n]
zeros      uint8       [G, N]              z[g, n]
y          spec.dtype  [M, N]              output
=========  ==========  ==================  ==========================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.codes import code3_expr
from qcompile.kernels.tir.magic import MAGIC, magic_bits_from, magic_float
from qcompile.kernels.uniform.compute import uniform_function
from qcompile.kernels.uniform.spec import UniformSpec

#: Marks the PrimFunc as this factorisation (a workload names its compute; see tuning_db).
COMPUTE_NAME = "uniform.cuda.v2"


def fields_per_half(bits: int) -> int:
    """Codes in one 16-bit half of a word (2/4/8 bits); 3-bit codes are taken one by one (1)."""
    return 1 if bits == 3 else 16 // bits


def _pow2(exponent):
    """float32 ``2**exponent`` for an integer expression ``exponent`` in [0, 30] (exact).

    Not built by reinterpreting exponent bits: TVM's CUDA code generator prints a reinterpret
    of a constant (as it is once a loop is unrolled) as the address of a literal, which nvcc
    rejects. A shift and a cast fold to a constant when unrolled.
    """
    return T.Cast("float32", T.shift_left(T.int32(1), exponent))


def half_field(k, bits: int):
    """(half, j') of row k: which 16-bit half of its word holds the code, and the field in it."""
    per_word = 32 // bits
    j = k % per_word
    per_half = fields_per_half(bits)
    return j // per_half, j % per_half


def x_field_scale(k, bits: int):
    """``2**-(bits * j')`` as float32: the factor ``scale_x`` folds into x for row k."""
    if bits == 3:
        return T.float32(1)
    _, jj = half_field(k, bits)
    return T.float32(1) / _pow2(jj * bits)


def code_bits_in_place(qweight, k, n, bits: int):
    """uint32 ``q[k, n] * 2**(bits * j')``: the code masked in place within its 16-bit half.

    For 3 bits, the code itself (j' = 0).
    """
    if bits == 3:
        return code3_expr(qweight, k, n)
    per_word = 32 // bits
    half, jj = half_field(k, bits)
    word = T.Cast("uint32", qweight[k // per_word, n])
    part = T.shift_right(word, T.Cast("uint32", half * 16))
    mask = T.shift_left(T.uint32((1 << bits) - 1), T.Cast("uint32", jj * bits))
    return T.bitwise_and(part, mask)


def code_minus_zero(qweight, zeros, g, k, n, bits: int):
    """float32 ``(q[k, n] - z[g, n]) * 2**(bits * j')``, exact, without an int->float convert."""
    if bits == 3:
        shift = T.float32(1)
    else:
        _, jj = half_field(k, bits)
        shift = _pow2(jj * bits)
    zero = T.Cast("float32", zeros[g, n])
    offset = T.float32(MAGIC) + zero * shift
    return magic_float(code_bits_in_place(qweight, k, n, bits), magic_bits_from(zero)) - offset


def uniform_compute_cuda(spec: UniformSpec):
    """The CUDA PrimFunc for ``spec`` (symbol ``spec.name()``, spec JSON in its attributes)."""
    if spec.act_order:
        raise SpecError(
            f"{spec.name()}: the fused act_order gather (act_order=True) has no CUDA form; use "
            "act_order=False: prepare reorders act_order weights and the call gathers x first")
    return uniform_compute_cuda_for(
        m=spec.m, k=spec.k, n=spec.n, groups=spec.groups, rows=spec.packed_rows, bits=spec.bits,
        group_size=spec.effective_group_size, dtype=spec.dtype, attrs=spec.func_attrs())


def uniform_compute_cuda_for(*, m: int, k: int, n: int, groups: int, rows: int, bits: int,
                             group_size: int, dtype: str, attrs: dict):
    """The CUDA PrimFunc from plain numbers (what :func:`uniform_compute_cuda` passes).

    ``dtype`` is the activation and output dtype; arithmetic is float32 whatever it is.
    """
    M, K, N, G, gsize = m, k, n, groups, group_size
    attrs = {**attrs, COMPUTE_ATTR: COMPUTE_NAME}

    widened = dtype != "float32"  # float32 inside: convert x, accumulate in y_acc, store y

    def read_x(value):
        return T.Cast("float32", value) if widened else value

    @T.macro
    def body(x, qweight, scales, zeros, y):
        x_field = T.sblock_alloc_buffer((M, K), "float32")
        dot = T.sblock_alloc_buffer((M, G, N), "float32")
        if widened:
            y_acc = T.sblock_alloc_buffer((M, N), "float32")
        else:
            y_acc = T.meta_var(y)  # y itself, not renamed
        for vm, vk in T.grid(M, K):
            with T.sblock("scale_x"):
                im, ik = T.axis.remap("SS", [vm, vk])
                x_field[im, ik] = read_x(x[im, ik]) * x_field_scale(ik, bits)
        for vm, vg, vn, vr in T.grid(M, G, N, gsize):
            with T.sblock("group_dot"):
                im, ig, i_n, ir = T.axis.remap("SSSR", [vm, vg, vn, vr])
                with T.init():
                    dot[im, ig, i_n] = T.float32(0)
                dot[im, ig, i_n] = dot[im, ig, i_n] + x_field[im, ig * gsize + ir] * (
                    code_minus_zero(qweight, zeros, ig, ig * gsize + ir, i_n, bits))
        for vm, vn, vg in T.grid(M, N, G):
            with T.sblock("combine"):
                im, i_n, ig = T.axis.remap("SSR", [vm, vn, vg])
                with T.init():
                    y_acc[im, i_n] = T.float32(0)
                y_acc[im, i_n] = y_acc[im, i_n] + T.Cast("float32", scales[ig, i_n]) * (
                    dot[im, ig, i_n])
        if widened:
            for vm, vn in T.grid(M, N):
                with T.sblock("store"):
                    im, i_n = T.axis.remap("SS", [vm, vn])
                    y[im, i_n] = T.Cast(dtype, y_acc[im, i_n])

    return uniform_function(m=M, k=K, n=N, groups=G, rows=rows, dtype=dtype, attrs=attrs,
                            body=body)
