"""Packing b-bit unsigned codes into int32 words, as GPTQ checkpoints store them.

Every supported width packs 32 values into ``bits`` words as one little-endian bit stream: value
j of a block sits at bit ``bits * j`` of ``w0 | w1 << 32 | ...``. For 2, 4 and 8 bits no value
straddles two words, so this is the familiar "LSB first, 32/bits values per word"; for 3 bits,
values 10 and 21 straddle (../shared/formats/gptq.md, "3-bit").

Packing runs along axis 0; callers transpose for the column-packed ``qzeros``.
"""

from __future__ import annotations

import numpy as np

from qcompile.errors import FormatError

SUPPORTED_BITS = (2, 3, 4, 8)


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise FormatError(f"bits={bits} is not supported; supported bit widths: {SUPPORTED_BITS}")


def block_shape(bits: int) -> tuple[int, int]:
    """(values, words) of one packing block: (16, 1) for 2-bit, (32, 3) for 3-bit, ..."""
    check_bits(bits)
    if bits == 3:
        return 32, 3
    return 32 // bits, 1


def packed_length(length: int, bits: int) -> int:
    """Words needed to pack ``length`` values; ``length`` must fill whole blocks."""
    values, words = block_shape(bits)
    if length % values:
        raise FormatError(
            f"{bits}-bit packing needs a length divisible by {values}; got {length}"
        )
    return length // values * words


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes along axis 0.

    Parameters
    ----------
    codes : array of int, shape [L, ...]
        Values in [0, 2**bits); L divisible by the block length (``block_shape(bits)[0]``).
    bits : int
        2, 3, 4 or 8.

    Returns
    -------
    numpy.ndarray of int32, shape [L * bits / 32, ...]
        The packed words (their bit patterns; int32 because checkpoints store int32).
    """
    values, words = block_shape(bits)
    codes = np.asarray(codes)
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise FormatError(
            f"{bits}-bit codes must lie in [0, {(1 << bits) - 1}]; "
            f"got values in [{codes.min()}, {codes.max()}]"
        )
    length, rest = codes.shape[0], codes.shape[1:]
    packed_length(length, bits)
    blocks = codes.astype(np.uint64).reshape(length // values, values, *rest)
    out = np.zeros((length // values, words, *rest), dtype=np.uint64)
    for j in range(values):
        word, shift = divmod(bits * j, 32)
        out[:, word] |= (blocks[:, j] << np.uint64(shift)) & np.uint64(0xFFFFFFFF)
        if shift + bits > 32:  # the value straddles into the next word
            out[:, word + 1] |= blocks[:, j] >> np.uint64(32 - shift)
    return out.reshape(length // values * words, *rest).astype(np.uint32).view(np.int32)


def unpack(words: np.ndarray, bits: int, length: int | None = None) -> np.ndarray:
    """Inverse of :func:`pack`: int32 words [W, ...] -> int32 codes [W * 32 / bits, ...]."""
    values, per_block = block_shape(bits)
    words = np.asarray(words)
    if words.dtype not in (np.int32, np.uint32):
        raise FormatError(f"packed words must be int32 or uint32; got {words.dtype}")
    if words.shape[0] % per_block:
        raise FormatError(
            f"{bits}-bit data packs {values} values into {per_block} words; "
            f"{words.shape[0]} words is not a whole number of blocks"
        )
    rest = words.shape[1:]
    blocks = words.view(np.uint32).astype(np.uint64).reshape(-1, per_block, *rest)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((blocks.shape[0], values, *rest), dtype=np.uint64)
    for j in range(values):
        word, shift = divmod(bits * j, 32)
        value = blocks[:, word] >> np.uint64(shift)
        if shift + bits > 32:
            value |= blocks[:, word + 1] << np.uint64(32 - shift)
        out[:, j] = value & mask
    codes = out.reshape(-1, *rest).astype(np.int32)
    if length is not None:
        if length > codes.shape[0]:
            raise FormatError(f"asked for {length} values but the words hold {codes.shape[0]}")
        codes = codes[:length]
    return codes
