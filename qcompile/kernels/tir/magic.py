"""The "magic number" conversion of a code to float32: OR-ing a value below 2**23 into the
mantissa of 2**23 gives 2**23 + value, one logic op instead of an int->float conversion
(uniform/compute_cuda.py explains the factorisation that uses it)."""

from __future__ import annotations

from qcompile._tvm import T

#: float32 bit pattern of 2**23: OR-ing a value below 2**23 into its mantissa gives 2**23 + value.
MAGIC_BITS = 0x4B000000

MAGIC = 8388608.0  # 2**23


def magic_float(bits_expr, magic_bits):
    """float32 ``2**23 + v`` for a uint32 expression ``v < 2**23`` (one OR, no conversion);
    ``magic_bits`` is an expression equal to :data:`MAGIC_BITS` (:func:`magic_bits_from`)."""
    return T.reinterpret("float32", T.bitwise_or(bits_expr, magic_bits))


def magic_bits_from(value):
    """uint32 :data:`MAGIC_BITS`, computed from a float32 ``value`` in [0, 2**23): the smaller
    of the bits of ``2**23 + value`` (0x4B000000 and up) and 0x4B000000.

    Why not the constant: a LOP3 takes one immediate, so ``(word & mask) | 0x4B000000`` with two
    immediates costs ptxas two LOP3s per code. Computed from data (neither TVM nor ptxas can
    fold it; an AND of the exponent bits ptxas would merge back into every LOP3), the magic
    sits in a register once per group and column, and mask and OR become one LOP3.
    """
    return T.min(T.reinterpret("uint32", T.float32(MAGIC) + value), T.uint32(MAGIC_BITS))
