"""TensorIR of the uniform family with int8 activations: integer dot products (AVX2 vpmaddubsw).

The float32 kernel (compute.py) spends an AND, a convert and an FMA on every 8 codes whatever
their width, so 2- and 3-bit weights cost as many instructions per code as 4-bit ones and their
time does not fall with their bytes. Here the activations are quantized once per call, per row
and group, to int8, and the codes stay integers: one ``vpmaddubsw`` multiplies 32 codes (uint8)
by 32 activations (int8) and adds them in pairs into 16-bit lanes, which accumulate a whole
chunk of K before one ``vpmaddwd`` widens them to 32 bits. Per 32 codes that is a shift, an AND,
a multiply-add and an add.

    xq[m, k]   = rint(x[m, k] * (127 / amax[m, g]))         (int8; amax = max |x| in group g)
    y[m, n]    = sum_g s[g, n] * amax[m, g] / 127 * (dot[m, g, n] - z[g, n] * xqsum[m, g])
    dot[m,g,n] = sum_{k in g} xq[m, k] * q[k, n]            (int32, exact)

The only approximation is the rounding of x to 8 bits (about 0.4% of the group's largest
activation per element; the kernel's error against float32 is measured in tests and tools).

Codes are read as bytes, 32 at a time: 8 columns times 4 bytes. The operand ``qweight`` is
uint8 [U, P, N, 4], P byte planes per K unit:

* 2 and 4 bits (P = 1, U = K*b/32): GPTQ's words as they are, as their 4 little-endian bytes;
  byte j of word u holds codes k = u*4f + j*f + p (f = 8/b codes per byte) at bits b*p.
* 3 bits (P = 3, U = K/32): GPTQ's 96-bit blocks are split at prepare time into two 2-bit
  planes (the low bits of k = u*32 + s*16 + j*4 + p, plane s, bits 2p of byte j) and one 1-bit
  plane (the high bit of the same k at bit 4s + p of byte j): 3 bits per weight, as GPTQ.

Shifting a plane right by ``b*p`` and masking gives 32 codes whose K positions are every f-th
row; ``x_quant`` stores x in that same order ("storage order", :func:`storage_to_row`), so the
dot product pairs each code with its activation. Zero-points, scales and the layout tile are
the float32 kernel's (uint8 zeros, float16 scales, ``n_tiled`` column tiles).

16-bit accumulation is exact as long as a chunk's pair sums fit: 2 * 127 * (2**b - 1) per step
of 4 codes, so a chunk holds at most 172 rows of K at 2 bits, 72 at 3 and 32 at 4
(:func:`chunk_rows`). 8-bit codes would overflow a single pair and are refused (spec.py).
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.tir.activations import X_LEVELS
from qcompile.kernels.tir.int8_dot import chunk_rows_for, integer_group_dot
from qcompile.kernels.tir.planes import STEP, code_expr, planes, storage_to_row, unit_rows
from qcompile.kernels.uniform.spec import UniformSpec


def chunk_rows(spec: UniformSpec) -> int:
    """Rows of K per 16-bit chunk of ``spec``'s groups (:func:`chunk_rows_for`)."""
    return chunk_rows_for(spec.effective_group_size, spec.bits)


def uniform_compute_int8(spec: UniformSpec):
    """The PrimFunc for an ``int8_activations`` spec (symbol ``spec.name()``).

    Operands: x float32 [M, K]; qweight uint8 [U, P, N, 4] (module docstring); scales float16
    [G, N]; zeros uint8 [G, N]; y float32 [M, N].
    """
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, gsize = spec.bits, spec.effective_group_size
    U, P = K // unit_rows(bits), planes(bits)
    CH = chunk_rows(spec)
    C = gsize // CH
    attrs = spec.func_attrs()
    levels = float(X_LEVELS)
    group_dot = integer_group_dot()

    @T.prim_func(s_tir=True)
    def uniform_gemm_int8(
        x: T.Buffer((M, K), "float32"),
        qweight: T.Buffer((U, P, N, STEP), "uint8"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        x_amax = T.sblock_alloc_buffer((M, G), "float32")
        xq = T.sblock_alloc_buffer((M, K), "int8")
        xq_sum = T.sblock_alloc_buffer((M, G), "int32")
        codes = T.sblock_alloc_buffer((N, K), "uint8")
        dot16 = T.sblock_alloc_buffer((M, G, C, N, 2), "int16")
        dot = T.sblock_alloc_buffer((M, G, N), "int32")
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_amax"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    x_amax[vm, vg] = T.float32(0)
                x_amax[vm, vg] = T.max(x_amax[vm, vg], T.fabs(x[vm, vg * gsize + vr]))
        for m, k in T.grid(M, K):
            with T.sblock("x_quant"):
                vm, vk = T.axis.remap("SS", [m, k])
                xq[vm, vk] = T.Cast("int8", T.nearbyint(
                    x[vm, storage_to_row(vk, bits)]
                    * T.Select(x_amax[vm, vk // gsize] > T.float32(0),
                               T.float32(levels) / x_amax[vm, vk // gsize], T.float32(0))))
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_qsum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    xq_sum[vm, vg] = 0
                xq_sum[vm, vg] = xq_sum[vm, vg] + T.Cast("int32", xq[vm, vg * gsize + vr])
        for n, k in T.grid(N, K):
            with T.sblock("unpack"):
                vn, vk = T.axis.remap("SS", [n, k])
                codes[vn, vk] = code_expr(qweight, vk, vn, bits)
        group_dot("group_dot16", "widen", xq, codes, dot16, dot, M, G, C, N, gsize, CH)
        for m, n, g in T.grid(M, N, G):
            with T.sblock("combine"):
                vm, vn, vg = T.axis.remap("SSR", [m, n, g])
                with T.init():
                    y[vm, vn] = T.float32(0)
                y[vm, vn] = y[vm, vn] + T.Cast("float32", scales[vg, vn]) * (
                    x_amax[vm, vg] * T.float32(1.0 / levels)) * (
                    T.Cast("float32", dot[vm, vg, vn])
                    - T.Cast("float32", T.Cast("int32", zeros[vg, vn]) * xq_sum[vm, vg]))

    return uniform_gemm_int8


