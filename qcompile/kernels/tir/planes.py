"""int8 byte planes: packed codes read as bytes, 32 at a time (8 columns times 4 bytes), and the
"storage order" of K in which x is stored to pair with them (uniform/compute_int8.py's module
docstring describes the planes at 2, 3 and 4 bits)."""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.formats import bitpack

#: Codes per vpmaddubsw step and column (4 bytes).
STEP = 4


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
