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
from qcompile.formats import bitpack
from qcompile.kernels.uniform.spec import UniformSpec

#: Activations are scaled to [-127, 127].
X_LEVELS = 127
#: Codes per vpmaddubsw step and column (4 bytes).
STEP = 4
_INT16_MAX = 32767


def planes(bits: int) -> int:
    """Byte planes per K unit: 3 for 3-bit (two 2-bit planes, one 1-bit plane), else 1."""
    return 3 if bits == 3 else 1


def unit_rows(bits: int) -> int:
    """Rows of K per unit of ``qweight``: a word (32/b codes), or a 32-row block at 3 bits."""
    return 32 if bits == 3 else 32 // bits


def order_block(bits: int) -> int:
    """Rows of K within which storage order permutes: a word; 16 (a 2-bit plane) at 3 bits."""
    return 16 if bits == 3 else 32 // bits


def storage_to_row(position, bits: int):
    """The row of K (of the float weight) stored at ``position`` in storage order.

    Within a block of ``4 * f`` rows (f codes per byte), position ``p*4 + j`` holds row
    ``j*f + p``: byte j, field p.
    """
    per_byte = 2 if bits == 4 else 4  # 3-bit codes are ordered as their 2-bit planes
    block = order_block(bits)
    return position // block * block + position % STEP * per_byte + position // STEP % per_byte


def chunk_limit(bits: int) -> int:
    """Most rows of K whose pair sums fit in 16 bits (see the module docstring)."""
    pair_max = 2 * X_LEVELS * ((1 << bits) - 1)
    return STEP * (_INT16_MAX // pair_max)


def chunk_rows(spec: UniformSpec) -> int:
    """Rows of K per 16-bit chunk of ``spec``'s groups (:func:`chunk_rows_for`)."""
    return chunk_rows_for(spec.effective_group_size, spec.bits)


def chunk_rows_for(group_rows: int, bits: int) -> int:
    """Rows of K per 16-bit chunk: the largest divisor of ``group_rows`` that is a whole number
    of K units (so the unpacking's shift counts repeat within it) and fits :func:`chunk_limit`."""
    block = unit_rows(bits)
    fits = [d for d in range(block, min(group_rows, chunk_limit(bits)) + 1, block)
            if group_rows % d == 0]
    return max(fits)


def code_expr(qweight, position, n, bits: int):
    """uint8 code at storage ``position`` of column n (see the module docstring)."""
    if bits == 3:
        unit, part = position // 32, position // 16 % 2
        byte, field = position % STEP, position // STEP % 4
        low = T.bitwise_and(T.shift_right(qweight[unit, part, n, byte],
                                          T.Cast("uint8", field * 2)), T.uint8(3))
        high = T.bitwise_and(T.shift_right(qweight[unit, 2, n, byte],
                                           T.Cast("uint8", position // STEP % 8)), T.uint8(1))
        return T.bitwise_or(low, T.shift_left(high, T.uint8(2)))
    per_byte = 8 // bits
    block = unit_rows(bits)
    field = position // STEP % per_byte
    return T.bitwise_and(
        T.shift_right(qweight[position // block, 0, n, position % STEP],
                      T.Cast("uint8", field * bits)),
        T.uint8((1 << bits) - 1))


def integer_group_dot():
    """A TIR macro ``(dot_name, widen_name, xq, codes, dot16, dot, M, G, C, N, rows, CH)``:
    blocks ``dot_name`` and ``widen_name`` computing ``dot[m, g, n]``, the int32 sum over the
    ``rows`` rows of group g (C chunks of CH) of ``xq[m, k] * codes[n, k]``, as 16-bit pair sums
    per chunk (``dot16`` [M, G, C, N, 2]: the tensorized vpmaddubsw) widened to int32
    (vpmaddwd). A new macro per call site: TVM suffixes the block names of a macro's second
    and later expansions ("_1", ...), and the schedules find blocks by name."""

    @T.macro
    def group_dot(dot_name, widen_name, xq, codes, dot16, dot, M, G, C, N, rows, CH):
        for m, g, c, n, h, r, e in T.grid(M, G, C, N, 2, CH // STEP, 2):
            with T.sblock(dot_name):
                vm, vg, vc, vn, vh, vr, ve = T.axis.remap("SSSSSRR", [m, g, c, n, h, r, e])
                with T.init():
                    dot16[vm, vg, vc, vn, vh] = T.int16(0)
                dot16[vm, vg, vc, vn, vh] = dot16[vm, vg, vc, vn, vh] + T.Cast(
                    "int16", xq[vm, vg * rows + vc * CH + vr * STEP + vh * 2 + ve]) * T.Cast(
                    "int16", codes[vn, vg * rows + vc * CH + vr * STEP + vh * 2 + ve])
        for m, g, n, c, h in T.grid(M, G, N, C, 2):
            with T.sblock(widen_name):
                vm, vg, vn, vc, vh = T.axis.remap("SSSRR", [m, g, n, c, h])
                with T.init():
                    dot[vm, vg, vn] = 0
                dot[vm, vg, vn] = dot[vm, vg, vn] + T.Cast("int32", dot16[vm, vg, vc, vn, vh])

    return group_dot


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


def byte_planes(qweight, bits: int):
    """GPTQ's packed codes -> the int8 kernel's ``qweight`` (host side, at prepare time).

    Parameters
    ----------
    qweight : numpy.ndarray of int32, shape [K * bits/32, N]
        GPTQ's codes packed along K (3-bit: 32 codes per 3 words).
    bits : int
        2, 3 or 4.

    Returns
    -------
    numpy.ndarray of uint8, shape [U, P, N, 4]
        The byte planes of the module docstring (2/4-bit: the words' own bytes).
    """
    import numpy as np


    words = np.ascontiguousarray(qweight).view(np.int32)
    rows, n = words.shape
    if bits != 3:
        return words.view(np.uint8).reshape(rows, 1, n, STEP).copy()
    codes = bitpack.unpack(words, 3).astype(np.uint8)  # [K, N]
    k = codes.shape[0]
    # [unit, s, j, p, n]: row u*32 + s*16 + j*4 + p
    blocks = codes.reshape(k // 32, 2, STEP, 4, n)
    low, high = blocks & 3, blocks >> 2
    out = np.zeros((k // 32, 3, STEP, n), dtype=np.uint8)
    for p in range(4):
        out[:, 0:2] |= low[:, :, :, p] << (2 * p)
        for s in range(2):
            out[:, 2] |= high[:, s, :, p] << (4 * s + p)
    return np.ascontiguousarray(out.transpose(0, 1, 3, 2))


def quantized_activations(x, group_size: int):
    """The activations the kernel actually multiplies, dequantized (host side, numpy).

    Parameters
    ----------
    x : numpy.ndarray of float32, shape [M, K]
    group_size : int
        The spec's group size (-1: K).

    Returns
    -------
    numpy.ndarray of float64, shape [M, K]
        ``rint(x * (127 / amax)) * amax / 127`` per row and group, rounded as the kernel
        rounds (float32, ties to even): ``x_hat @ W`` is the kernel's output up to float32
        accumulation. ``x - x_hat`` is the int8 rounding error.
    """
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    size = k if group_size == -1 else group_size
    groups = x.reshape(m, k // size, size)
    amax = np.abs(groups).max(axis=2, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    inverse = np.where(amax > 0, np.float32(X_LEVELS) / safe, np.float32(0)).astype(np.float32)
    codes = np.rint((groups * inverse).astype(np.float32))
    return (codes.astype(np.float64) * (amax.astype(np.float64) / X_LEVELS)).reshape(m, k)
