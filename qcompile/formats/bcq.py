"""Binary-coding quantization (BCQ) with a bias z, as LUT-GEMM extends it (its eq. 2):

    W[k, n] ~= sum_i alpha[g, i, n] * b_i[k, n] + z[g, n],    b_i[k, n] in {-1, +1},  g = k // gs

with q sign planes b_i, a scale per (group, plane, output) and a bias z per (group, output). This
module holds the tensors and their packing, and the exact conversion of uniform (GPTQ) weights
into BCQ (eq. 5). The quantizer from float weights is in :mod:`qcompile.quantize.bcq`.

Packing, laid out for the table lookups: plane i's signs are bits along K, 32 rows of K per
int32 word, LSB first, bit set for +1:

    planes[i, k // 32, n] >> (k % 32) & 1  ==  (b_i[k, n] == +1)

so the mu signs of rows c*mu .. c*mu+mu-1 of one output are mu consecutive bits of one column
of words: the index of their row in the 2**mu table of x's signed sums (bit j <-> x[c*mu + j]).
The layout does not depend on mu (a chunk may straddle two words when mu does not divide 32).

==========  ========  =================  ============================================
tensor      dtype     shape              content
==========  ========  =================  ============================================
planes      int32     [q, K / 32, N]     sign bits along K (bit set: +1)
alpha       float16   [G, q, N]          alpha[g, i, n] (any sign; 2**(i-1) s from GPTQ)
z           float32   [G, N]             z[g, n], the bias
==========  ========  =================  ============================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.act_order import is_trivial
from qcompile.formats.gptq import GptqTensors, as_numpy, num_groups

#: Sign bits per packed word.
WORD_BITS = 32
#: Sign planes the family supports (q).
SUPPORTED_PLANES = (1, 2, 3, 4, 5, 6, 7, 8)


def check_planes(q: int) -> None:
    if q not in SUPPORTED_PLANES:
        raise FormatError(f"q={q} sign planes is not supported; supported: {SUPPORTED_PLANES}")


def pack_planes(signs: np.ndarray) -> np.ndarray:
    """Sign planes -> packed bits.

    Parameters
    ----------
    signs : numpy.ndarray of int, shape [q, K, N], every value -1 or +1
        K must be a multiple of 32.

    Returns
    -------
    numpy.ndarray of int32, shape [q, K / 32, N]
        Bit ``k % 32`` of word ``[i, k // 32, n]`` is set iff ``signs[i, k, n] == +1``.
    """
    signs = np.asarray(signs)
    if signs.ndim != 3:
        raise FormatError(f"signs must be 3-D [q, K, N]; got shape {tuple(signs.shape)}")
    q, k, n = signs.shape
    if k % WORD_BITS:
        raise FormatError(f"K={k} must be a multiple of {WORD_BITS} to pack sign bits along K")
    if not np.all((signs == 1) | (signs == -1)):
        bad = signs[(signs != 1) & (signs != -1)][0]
        raise FormatError(f"signs must be -1 or +1; found {bad}")
    return pack_bits(signs > 0)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """Plane bits (bool [q, K, N], True for +1; K a multiple of 32) -> int32 [q, K / 32, N],
    bit ``k % 32`` of word ``[i, k // 32, n]`` = ``bits[i, k, n]``. One byte per bit in flight
    (7168x28672 at q = 3: 0.6 GB), not eight."""
    q, k, n = bits.shape
    if k % WORD_BITS:
        raise FormatError(f"K={k} must be a multiple of {WORD_BITS} to pack sign bits along K")
    by_column = np.ascontiguousarray(np.swapaxes(bits, 1, 2))            # [q, N, K]
    packed = np.packbits(by_column, axis=2, bitorder="little")           # [q, N, K / 8] bytes
    words = packed.view("<u4")                                           # [q, N, K / 32]
    return np.ascontiguousarray(np.swapaxes(words, 1, 2)).astype(np.uint32).view(np.int32)


def unpack_planes(planes: np.ndarray) -> np.ndarray:
    """Packed bits int32 [q, K / 32, N] -> signs int8 [q, K, N] (-1 or +1)."""
    planes = np.asarray(planes)
    if planes.ndim != 3 or planes.dtype not in (np.int32, np.uint32):
        raise FormatError(f"planes must be int32 [q, K/32, N]; got {planes.dtype} "
                          f"{tuple(planes.shape)}")
    q, words, n = planes.shape
    shifts = np.arange(WORD_BITS, dtype=np.uint32)[None, None, :, None]
    bits = (planes.view(np.uint32)[:, :, None, :] >> shifts) & np.uint32(1)
    return (bits.astype(np.int8) * 2 - 1).reshape(q, words * WORD_BITS, n)


def table_keys(planes: np.ndarray, mu: int) -> np.ndarray:
    """The table index of every chunk: int64 [q, K / mu, N], bit j of key c <-> row c*mu + j.

    What the kernels extract from the packed words (a reference for tests)."""
    signs = unpack_planes(planes)
    q, k, n = signs.shape
    if k % mu:
        raise FormatError(f"K={k} must be a multiple of mu={mu}")
    bits = (signs > 0).astype(np.int64).reshape(q, k // mu, mu, n)
    return (bits << np.arange(mu, dtype=np.int64)[None, None, :, None]).sum(axis=2)


@dataclass(frozen=True)
class BcqTensors:
    """One layer in BCQ form, checked.

    Attributes
    ----------
    planes : numpy.ndarray of int32, shape [q, K / 32, N]
    alpha : numpy.ndarray of float16, shape [G, q, N]
    z : numpy.ndarray of float32, shape [G, N]
    group_size : int
        Rows of K per group; -1 for one group per column.
    """

    planes: np.ndarray
    alpha: np.ndarray
    z: np.ndarray
    group_size: int

    @classmethod
    def from_tensors(cls, *, planes, alpha, z, group_size: int) -> BcqTensors:
        """Validate tensors (torch or numpy); errors name the tensor and the numbers."""
        planes = as_numpy("planes", planes)
        alpha = as_numpy("alpha", alpha)
        z = as_numpy("z", z)
        if planes.ndim != 3 or planes.dtype not in (np.int32, np.uint32):
            raise FormatError(f"planes must be int32 [q, K/32, N]; got {planes.dtype} "
                              f"{tuple(planes.shape)}")
        q, words, n = planes.shape
        check_planes(q)
        k = words * WORD_BITS
        if group_size != -1 and (group_size <= 0 or k % group_size):
            raise FormatError(f"K={k} (planes {tuple(planes.shape)}) must be divisible by "
                              f"group_size={group_size} (or use -1 for one group per column)")
        groups = num_groups(k, group_size)
        if alpha.shape != (groups, q, n) or alpha.dtype != np.float16:
            raise FormatError(f"alpha must be float16 [G, q, N]=({groups}, {q}, {n}); got "
                              f"{alpha.dtype} {tuple(alpha.shape)}")
        if z.shape != (groups, n) or z.dtype != np.float32:
            raise FormatError(f"z must be float32 [G, N]=({groups}, {n}); got {z.dtype} "
                              f"{tuple(z.shape)}")
        return cls(planes=planes.view(np.int32), alpha=alpha, z=z, group_size=group_size)

    @property
    def q(self) -> int:
        return self.planes.shape[0]

    @property
    def k(self) -> int:
        return self.planes.shape[1] * WORD_BITS

    @property
    def n(self) -> int:
        return self.planes.shape[2]

    @property
    def groups(self) -> int:
        return self.alpha.shape[0]

    def dequantize(self) -> np.ndarray:
        """The weight W [K, N], float32: ``sum_i alpha[g, i] * b_i + z[g]`` row by row."""
        signs = unpack_planes(self.planes).astype(np.float64)
        rows = self.k // self.groups
        alpha = np.repeat(self.alpha.astype(np.float64), rows, axis=0)  # [K, q, N]
        z = np.repeat(self.z.astype(np.float64), rows, axis=0)
        weight = np.einsum("kin,ikn->kn", alpha, signs) + z
        return weight.astype(np.float32)


def from_uniform(layer: GptqTensors) -> BcqTensors:
    """Uniform b-bit weights -> BCQ with q = b planes, exactly (LUT-GEMM eq. 5).

    With ``w = s * (c - zq)`` and ``c = sum_i 2**i * c_i`` (bits c_i in {0, 1}), writing
    ``b_i = 2 c_i - 1`` gives ``w = sum_i 2**(i-1) s * b_i + s * ((2**b - 1) / 2 - zq)``:
    ``alpha_i = 2**(i-1) * s`` (exact in float16: a power-of-two multiple of an fp16 scale) and
    ``z = s * ((2**b - 1) / 2 - zq)`` (exact in float32).

    Parameters
    ----------
    layer : GptqTensors
        Sequential groups (``g_idx`` trivial); reorder act_order weights first
        (:func:`qcompile.formats.act_order.reorder`). Scales float16.

    Returns
    -------
    BcqTensors
        q = layer.bits planes, the layer's group size.
    """

    if not is_trivial(layer.g_idx, layer.group_size):
        raise FormatError("g_idx is not k // group_size (act_order weights): reorder the layer "
                          "first (qcompile.formats.act_order.reorder) so each group is contiguous")
    if layer.scales.dtype != np.float16:
        raise FormatError(f"scales must be float16 (GPTQ stores fp16 scales); got "
                          f"{layer.scales.dtype}")
    if layer.in_features % WORD_BITS:
        raise FormatError(f"K={layer.in_features} must be a multiple of {WORD_BITS} to pack "
                          "sign bits along K")
    bits = layer.bits
    codes = layer.codes()                                              # int32 [K, N]
    plane_bits = np.stack([((codes >> i) & 1).astype(bool) for i in range(bits)])
    scales = layer.scales.astype(np.float32)                           # [G, N]
    powers = np.array([2.0 ** (i - 1) for i in range(bits)], dtype=np.float32)
    alpha32 = scales[:, None, :] * powers[None, :, None]               # [G, q, N]
    alpha = alpha32.astype(np.float16)
    inexact = alpha.astype(np.float32) != alpha32
    if inexact.any():
        g, i, n = (int(v[0]) for v in np.nonzero(inexact))
        raise FormatError(
            f"alpha = 2**(i-1) * scale is not exact in float16 at group {g}, plane {i}, column "
            f"{n} (scale {scales[g, n]!r}): the scale is too small or too large for fp16")
    zeros = layer.zeros().astype(np.float64)
    z = (scales.astype(np.float64) * ((2 ** bits - 1) / 2 - zeros)).astype(np.float32)
    return BcqTensors(planes=pack_bits(plane_bits), alpha=alpha, z=z,
                      group_size=layer.group_size)
