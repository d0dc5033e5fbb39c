"""Code extraction expressions over GPTQ's packed words (int32 [K * bits/32, N], packed along K):
a code as float32 times its field's power of two, and the 3-bit codes of a 96-bit, 3-word block.
"""

from __future__ import annotations

from qcompile._tvm import T


def fields_per_word(bits: int) -> int:
    """Codes decoded per packed unit along K: 32/bits, or 32 for the 3-word 3-bit block."""
    return 32 if bits == 3 else 32 // bits


def code3_expr(qweight, k, n):
    """uint32 expression for the 3-bit code q[k, n] (0..7) of a 96-bit, 3-word block.

    The 32 values of a block live in three words as one bit stream; the next word of the same
    block is always OR-ed in (shifted left by 32 - s in two steps, as a shift by 32 is
    undefined), and its bits land above the mask unless the value straddles.
    """
    base = k // 32 * 3
    offset = k % 32 * 3
    word = base + offset // 32
    shift = T.Cast("uint32", offset % 32)
    low = T.shift_right(T.Cast("uint32", qweight[word, n]), shift)
    nxt = T.Cast("uint32", qweight[T.min(word + 1, base + 2), n])
    high = T.shift_left(T.shift_left(nxt, T.uint32(1)), T.uint32(31) - shift)
    return T.bitwise_and(T.bitwise_or(low, high), T.uint32(7))


def field_expr(qweight, k, n, bits: int):
    """float32 expression for code q[k, n] times ``2**(bits * j)`` (j = k's field in its word).

    Words are read as uint32 so right shifts are logical; 3-bit codes come from
    :func:`code3_expr`. The field scale is 1 for 3 bits and for the top field of a word.
    """
    mask = (1 << bits) - 1
    if bits == 3:
        return T.Cast("float32", T.Cast("int32", code3_expr(qweight, k, n)))
    per_word = 32 // bits
    j = k % per_word
    word = T.Cast("uint32", qweight[k // per_word, n])
    in_place = T.bitwise_and(word, T.shift_left(T.uint32(mask), T.Cast("uint32", j * bits)))
    top = T.shift_right(word, T.uint32(32 - bits))
    return T.Cast("float32", T.Cast("int32", T.Select(j == per_word - 1, top, in_place)))


def field_scale_expr(k, bits: int):
    """``2**-(bits * j)`` for k's field j (1 for the top field and for 3 bits), as float32."""
    if bits == 3:
        return T.float32(1)
    per_word = 32 // bits
    j = k % per_word
    exponent_bits = T.Cast("int32", 127 - j * bits) * T.int32(1 << 23)  # IEEE-754 2**-(b*j)
    return T.Select(j == per_word - 1, T.float32(1), T.reinterpret("float32", exponent_bits))
