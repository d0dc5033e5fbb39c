"""TensorIR of the mixed family with int8 activations: integer dot products for both parts.

The float32 kernel (compute.py) spends an AND, a convert and an FMA on every code, so its
2-bit part (75% of the groups at the default share) decodes no faster per code than a 4-bit
matrix. Here, as in the uniform family's int8 kernel (uniform/compute_int8.py, whose storage
order, code unpacking, chunk bound and AVX2 intrinsics this module reuses), x is rounded once
per call to int8 per row and g1-group, and each part's codes stay integers:

    xq[m, k]   = rint(x[m, k] * (127 / amax[m, s]))        (s: k's g1-group in storage order)
    y2[m, n]   = sum_s s1[s, n] * amax[m, s] / 127 * (dot2[m, s, n] - z1[s, n] * xqs[m, s])
    y4[m, n]   = sum_s scales4[h, n] * amax[m, G2 + s] / 127 * (dot4[m, s, n]
                                                                - zeros4[h, n] * xqs4[m, s])
    y[m, n]    = y2 + y4 + sum_{j in row_ptr[n]..row_ptr[n+1]} values[j] * x[m, cols[j]]

with h = s // (g4 / g1) the 4-bit scale group of g1-group s; ``dot2``/``dot4`` are exact int32
sums over a g1-group (16-bit chunks of :func:`uniform.compute_int8.chunk_rows_for` rows, widened
once per chunk). The second-order scales s1 are dequantized as in compute.py (block ``scale1``).
The zero-point terms are float32 products of integers (z <= 15, |xqs| <= 127 * g1), exact while
below 2**24 (any g1 <= 8192), so the combine needs no integer multiply (vpmulld, slow on AMD).

The **outliers are applied in float32 with the float x**, not the rounded one: they are the
weights whose error matters most, and the CSR walk costs the same either way. The dense part
under an outlier is its group's zero (the quantizer's convention), so the int8 rounding touches
only the dense weights.

Scales of x per g1-group (16 rows by default) rather than per 4-bit scale group: one scale per
group of either kind, so both parts take the same x and the rounding error stays at the uniform
g = 16 level; the 4-bit combine then runs once per g1-group (reading the same scales4 row
g4/g1 times, from cache).

Codes are read as bytes: ``codes2`` uint8 [K2/16, 1, N, 4] and ``codes4`` uint8 [K4/8, 1, N, 4]
are the format's int32 words as their 4 little-endian bytes (uniform's byte planes, P = 1; the
same memory, no repacking), x is stored per part in the matching storage order.

Operands: x float32 [M, K], then formats/mixed.py's operands in their order (codes2 and codes4
as byte planes), then y float32 [M, N].
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.mixed.compute import finish_block, mixed_function, scale1_block
from qcompile.kernels.mixed.spec import MixedSpec
from qcompile.kernels.tir.activations import X_LEVELS
from qcompile.kernels.tir.int8_dot import chunk_rows_for, integer_group_dot
from qcompile.kernels.tir.planes import STEP, byte_planes, code_expr, storage_to_row, unit_rows


def input_column(order, position, first_group: int, g1: int, bits: int):
    """The column of x at storage ``position`` of a part whose groups start at ``first_group``
    of ``order``: the group's input rows, permuted within the word as the byte planes are."""
    row = storage_to_row(position, bits)  # stays within its g1-group (blocks of 8 or 16 rows)
    return order[first_group + row // g1] * g1 + row % g1


def rounded_part():
    """A TIR macro ``(part, x, order, x_amax, xq, xq_sum, codes, unpacked, M, N, rows, first,
    groups, g1, bits)``: for the part ``part`` ("2" or "4") whose ``groups`` g1-groups start at
    ``first`` of ``order``, blocks ``x_quant<part>`` (x rounded to int8 in the part's storage
    order), ``x_qsum<part>`` (per-group sums of it) and ``unpack<part>`` (the codes as bytes). A
    new macro per call site (TVM suffixes a macro's later expansions' block names)."""
    levels = float(X_LEVELS)

    @T.macro
    def part_inputs(part, x, order, x_amax, xq, xq_sum, codes, unpacked, M, N, rows, first,
                    groups, g1, bits):
        for m, r in T.grid(M, rows):
            with T.sblock("x_quant" + part):
                vm, vr = T.axis.remap("SS", [m, r])
                xq[vm, vr] = T.Cast("int8", T.nearbyint(
                    x[vm, input_column(order, vr, first, g1, bits)]
                    * T.Select(x_amax[vm, first + vr // g1] > T.float32(0),
                               T.float32(levels) / x_amax[vm, first + vr // g1],
                               T.float32(0))))
        for m, s, j in T.grid(M, groups, g1):
            with T.sblock("x_qsum" + part):
                vm, vs, vj = T.axis.remap("SSR", [m, s, j])
                with T.init():
                    xq_sum[vm, vs] = 0
                xq_sum[vm, vs] = xq_sum[vm, vs] + T.Cast("int32", xq[vm, vs * g1 + vj])
        for n, r in T.grid(N, rows):
            with T.sblock("unpack" + part):
                vn, vr = T.axis.remap("SS", [n, r])
                unpacked[vn, vr] = code_expr(codes, vr, vn, bits)

    return part_inputs


def mixed_compute_int8(spec: MixedSpec):
    """The PrimFunc for an ``int8_activations`` spec (symbol ``spec.name()``)."""
    lay = spec.layout
    M, K, N = spec.m, spec.k, spec.n
    G, G2, G4 = lay.groups, lay.groups2, lay.groups4
    K2, K4, C = lay.rows2, lay.rows4, lay.capacity
    g1, g2 = lay.g1, lay.g2
    per4 = lay.g4 // g1
    U2, U4 = K2 // unit_rows(2), K4 // unit_rows(4)
    CH2, CH4 = chunk_rows_for(g1, 2), chunk_rows_for(g1, 4)
    C2, C4 = g1 // CH2, g1 // CH4
    attrs = spec.func_attrs()
    inverse_levels = 1.0 / X_LEVELS
    inputs2, inputs4 = rounded_part(), rounded_part()
    group_dot2, group_dot4 = integer_group_dot(), integer_group_dot()
    scale1, finish = scale1_block(), finish_block()

    @T.macro
    def body(x, order, codes2, meta2, scale2, zero2, codes4, scales4, zeros4, row_ptr, cols,
             values, y):
        x_amax = T.sblock_alloc_buffer((M, G), "float32")
        xq2 = T.sblock_alloc_buffer((M, K2), "int8")
        xq4 = T.sblock_alloc_buffer((M, K4), "int8")
        xq_sum2 = T.sblock_alloc_buffer((M, G2), "int32")
        xq_sum4 = T.sblock_alloc_buffer((M, G4), "int32")
        unpacked2 = T.sblock_alloc_buffer((N, K2), "uint8")
        unpacked4 = T.sblock_alloc_buffer((N, K4), "uint8")
        dot16_2 = T.sblock_alloc_buffer((M, G2, C2, N, 2), "int16")
        dot16_4 = T.sblock_alloc_buffer((M, G4, C4, N, 2), "int16")
        dot2 = T.sblock_alloc_buffer((M, G2, N), "int32")
        dot4 = T.sblock_alloc_buffer((M, G4, N), "int32")
        s1 = T.sblock_alloc_buffer((G2, N), "float32")
        y2 = T.sblock_alloc_buffer((M, N), "float32")
        y4 = T.sblock_alloc_buffer((M, N), "float32")
        for m, s, j in T.grid(M, G, g1):
            with T.sblock("x_amax"):
                vm, vs, vj = T.axis.remap("SSR", [m, s, j])
                with T.init():
                    x_amax[vm, vs] = T.float32(0)
                x_amax[vm, vs] = T.max(x_amax[vm, vs], T.fabs(x[vm, order[vs] * g1 + vj]))
        inputs2("2", x, order, x_amax, xq2, xq_sum2, codes2, unpacked2, M, N, K2, 0, G2, g1, 2)
        group_dot2("group_dot2", "widen2", xq2, unpacked2, dot16_2, dot2, M, G2, C2, N, g1, CH2)
        scale1(s1, meta2, scale2, zero2, G2, N, g2)
        for m, n, s in T.grid(M, N, G2):
            with T.sblock("combine2"):
                vm, vn, vs = T.axis.remap("SSR", [m, n, s])
                with T.init():
                    y2[vm, vn] = T.float32(0)
                y2[vm, vn] = y2[vm, vn] + s1[vs, vn] * (
                    x_amax[vm, vs] * T.float32(inverse_levels)) * (
                    T.Cast("float32", dot2[vm, vs, vn])
                    - T.Cast("float32", T.bitwise_and(meta2[vs, vn], T.uint8(3)))
                    * T.Cast("float32", xq_sum2[vm, vs]))
        inputs4("4", x, order, x_amax, xq4, xq_sum4, codes4, unpacked4, M, N, K4, G2, G4, g1, 4)
        group_dot4("group_dot4", "widen4", xq4, unpacked4, dot16_4, dot4, M, G4, C4, N, g1, CH4)
        for m, n, s in T.grid(M, N, G4):
            with T.sblock("combine4"):
                vm, vn, vs = T.axis.remap("SSR", [m, n, s])
                with T.init():
                    y4[vm, vn] = T.float32(0)
                y4[vm, vn] = y4[vm, vn] + T.Cast("float32", scales4[vs // per4, vn]) * (
                    x_amax[vm, G2 + vs] * T.float32(inverse_levels)) * (
                    T.Cast("float32", dot4[vm, vs, vn])
                    - T.Cast("float32", zeros4[vs // per4, vn])
                    * T.Cast("float32", xq_sum4[vm, vs]))
        finish(y, y2, y4, x, row_ptr, cols, values, M, N, K, C)

    return mixed_function(spec, ((U2, 1, N, STEP), "uint8"), ((U4, 1, N, STEP), "uint8"), attrs,
                          body)


def byte_plane_operands(tensors: dict) -> dict:
    """The format's arrays -> the int8 kernel's: codes2 and codes4 (int32 [R, N]) as uint8
    byte planes [R, 1, N, 4] (tir.planes.byte_planes: the words' own bytes, a copy),
    numpy or torch; operands already in planes, and the others, pass unchanged."""
    import numpy as np


    out = dict(tensors)
    for name, bits in (("codes2", 2), ("codes4", 4)):
        codes = tensors[name]
        if codes.ndim != 2:
            continue
        if isinstance(codes, np.ndarray):
            out[name] = byte_planes(codes, bits)
        else:
            import torch

            planes = byte_planes(codes.detach().cpu().numpy(), bits)
            out[name] = torch.from_numpy(planes).to(codes.device)
    return out
