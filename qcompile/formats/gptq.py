"""The GPTQ checkpoint format (AutoGPTQ, GPTQModel, optimum): tensors, zero-point conventions,
the reference dequantization, and a round-to-nearest quantizer that writes the same layout.

Orientation follows the checkpoints (../shared/formats/gptq.md): K = in_features, N = out_features,
G = number of groups, and ``y = x @ W`` with W of shape [K, N].

=========  ======  ================  ============================================
tensor     dtype   shape             content
=========  ======  ================  ============================================
qweight    int32   [K * bits/32, N]  codes q[k, n], packed along K, LSB first
qzeros     int32   [G, N * bits/32]  zero-points packed along N (v1 stores z - 1)
scales     fp16    [G, N]            per-group, per-column scale
g_idx      int32   [K]               group of input row k
=========  ======  ================  ============================================

``W[k, n] = scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n])``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack

#: Zero-point conventions: v1 ("gptq") stores z - 1, v2 ("gptq_v2") stores z.
ZERO_CONVENTIONS = ("v1", "v2")


def as_numpy(name: str, tensor) -> np.ndarray:
    """A numpy view (or copy) of a torch tensor or array-like, for format checks and math."""
    if hasattr(tensor, "detach"):  # torch.Tensor, without importing torch here
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    if isinstance(tensor, np.ndarray):
        return tensor
    raise FormatError(
        f"{name} must be a torch.Tensor or numpy.ndarray; got {type(tensor).__name__}")


def num_groups(in_features: int, group_size: int) -> int:
    """G for a layer: 1 for group_size -1 (one group spans the whole column)."""
    return 1 if group_size == -1 else in_features // group_size


def check_group_size(in_features: int, group_size: int) -> None:
    if group_size == -1:
        return
    if group_size <= 0:
        raise FormatError(f"group_size must be -1 (whole column) or positive; got {group_size}")
    if in_features % group_size:
        raise FormatError(
            f"K={in_features} must be divisible by group_size={group_size}"
        )


def trivial_g_idx(in_features: int, group_size: int) -> np.ndarray:
    """g_idx without act_order: row k belongs to group k // group_size."""
    if group_size == -1:
        return np.zeros(in_features, dtype=np.int32)
    return (np.arange(in_features) // group_size).astype(np.int32)


def unpack_zeros(qzeros: np.ndarray, bits: int, out_features: int, convention: str) -> np.ndarray:
    """Zero-points z [G, N] (int32) from packed ``qzeros`` [G, N * bits/32].

    v1 checkpoints store z - 1. GPTQModel converts v2 -> v1 by subtracting 0x11..1 from whole
    words (per field for 3-bit), so an asymmetric z = 0 borrows from the next field; adding the
    same constant to whole words undoes that exactly, where a field-wise "+1" would not.
    """
    if convention not in ZERO_CONVENTIONS:
        raise FormatError(
            f"zero-point convention must be one of {ZERO_CONVENTIONS}; got {convention!r}")
    words = np.ascontiguousarray(qzeros).view(np.uint32)
    if convention == "v1" and bits != 3:
        ones = sum(1 << (bits * j) for j in range(32 // bits))  # 0x11111111 for 4-bit
        words = (words.astype(np.uint64) + ones).astype(np.uint32)
    zeros = bitpack.unpack(words.T, bits, out_features).T
    if convention == "v1" and bits == 3:
        zeros = (zeros + 1) & 7
    return zeros.astype(np.int32)


def pack_zeros(zeros: np.ndarray, bits: int, convention: str) -> np.ndarray:
    """Inverse of :func:`unpack_zeros`: z [G, N] -> int32 [G, N * bits/32] in ``convention``."""
    if convention not in ZERO_CONVENTIONS:
        raise FormatError(
            f"zero-point convention must be one of {ZERO_CONVENTIONS}; got {convention!r}")
    zeros = np.asarray(zeros, dtype=np.int64)
    if convention == "v1" and bits == 3:
        return bitpack.pack(((zeros - 1) & 7).T, bits).T.copy()
    words = bitpack.pack(zeros.T, bits).T.copy()
    if convention == "v1":
        ones = sum(1 << (bits * j) for j in range(32 // bits))
        words = (words.view(np.uint32).astype(np.int64) - ones).astype(np.uint32).view(np.int32)
    return words


@dataclass(frozen=True)
class GptqTensors:
    """One layer's GPTQ tensors, checked against each other.

    Attributes
    ----------
    qweight : numpy.ndarray of int32, shape [K * bits/32, N]
    scales : numpy.ndarray of float16 or float32, shape [G, N]
    qzeros : numpy.ndarray of int32, shape [G, N * bits/32]
    g_idx : numpy.ndarray of int32, shape [K]
    bits, group_size, in_features, out_features : int
    zero_convention : str
        "v1" (stored z - 1) or "v2" (stored z).
    """

    qweight: np.ndarray
    scales: np.ndarray
    qzeros: np.ndarray
    g_idx: np.ndarray
    bits: int
    group_size: int
    in_features: int
    out_features: int
    zero_convention: str = "v1"

    @classmethod
    def from_tensors(cls, *, qweight, scales, qzeros, bits: int, group_size: int,
                     g_idx=None, zero_convention: str = "v1") -> GptqTensors:
        """Validate checkpoint tensors (torch or numpy); errors name the tensor and numbers."""
        bitpack.check_bits(bits)
        qweight = as_numpy("qweight", qweight)
        scales = as_numpy("scales", scales)
        qzeros = as_numpy("qzeros", qzeros)
        for name, array, dtypes in (("qweight", qweight, (np.int32, np.uint32)),
                                    ("qzeros", qzeros, (np.int32, np.uint32)),
                                    ("scales", scales, (np.float16, np.float32))):
            if array.ndim != 2:
                raise FormatError(f"{name} must be 2-D; got shape {tuple(array.shape)}")
            if array.dtype not in dtypes:
                allowed = " or ".join(np.dtype(d).name for d in dtypes)
                raise FormatError(f"{name} must be {allowed}; got {array.dtype}")
        values, words = bitpack.block_shape(bits)
        in_features = qweight.shape[0] * values // words
        out_features = qweight.shape[1]
        if qweight.shape[0] % words:
            raise FormatError(
                f"qweight has {qweight.shape[0]} rows; {bits}-bit rows come in blocks of {words}"
            )
        try:
            check_group_size(in_features, group_size)
        except FormatError as error:
            raise FormatError(f"qweight {tuple(qweight.shape)} holds K={in_features} rows of "
                              f"{bits}-bit codes: {error}") from None
        groups = num_groups(in_features, group_size)
        if g_idx is not None:
            g_idx = as_numpy("g_idx", g_idx)
            if g_idx.shape != (in_features,):
                raise FormatError(
                    f"g_idx must have shape [K]=({in_features},); got {tuple(g_idx.shape)}")
        if scales.shape != (groups, out_features):
            raise FormatError(
                f"scales must have shape [G, N]=({groups}, {out_features}) for K={in_features}, "
                f"group_size={group_size}; got {tuple(scales.shape)}"
            )
        zero_cols = bitpack.packed_length(out_features, bits)
        if qzeros.shape != (groups, zero_cols):
            raise FormatError(
                f"qzeros must have shape [G, N*bits/32]=({groups}, {zero_cols}); "
                f"got {tuple(qzeros.shape)}"
            )
        if g_idx is None:
            g_idx = trivial_g_idx(in_features, group_size)
        else:
            g_idx = g_idx.astype(np.int32)
            check_g_idx(g_idx, group_size, groups)
        return cls(qweight=qweight, scales=scales, qzeros=qzeros, g_idx=g_idx, bits=bits,
                   group_size=group_size, in_features=in_features, out_features=out_features,
                   zero_convention=zero_convention)

    @property
    def num_groups(self) -> int:
        return self.scales.shape[0]

    def codes(self) -> np.ndarray:
        """Unpacked codes q [K, N], int32."""
        return bitpack.unpack(self.qweight, self.bits, self.in_features)

    def zeros(self) -> np.ndarray:
        """Zero-points z [G, N], int32, whatever the convention on disk."""
        return unpack_zeros(self.qzeros, self.bits, self.out_features, self.zero_convention)

    def dequantize(self) -> np.ndarray:
        """The reference weight W [K, N], float32: ``scales[g] * (q - z[g])`` row by row."""
        scales = self.scales.astype(np.float32)[self.g_idx]
        zeros = self.zeros().astype(np.float32)[self.g_idx]
        return (scales * (self.codes().astype(np.float32) - zeros)).astype(np.float32)


def check_g_idx(g_idx: np.ndarray, group_size: int, groups: int) -> None:
    """Every group id in [0, G), and each group holding group_size rows (act_order permutes rows
    between groups but never changes a group's size)."""
    if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise FormatError(
            f"g_idx values must lie in [0, {groups}); got [{g_idx.min()}, {g_idx.max()}]"
        )
    if group_size != -1:
        counts = np.bincount(g_idx, minlength=groups)
        bad = np.flatnonzero(counts != group_size)
        if bad.size:
            g = int(bad[0])
            raise FormatError(
                f"g_idx is inconsistent with group_size={group_size}: group {g} has "
                f"{counts[g]} rows ({bad.size} of {groups} groups differ)"
            )


def concatenate(parts: list[GptqTensors]) -> GptqTensors:
    """Layers that read the same input, as one layer of their columns side by side.

    ``x @ concatenate([A, B]).dequantize() == [x @ A.dequantize(), x @ B.dequantize()]``
    exactly: codes, scales and zero-points are per column, so they concatenate along N. The
    zero-points are repacked in the first part's convention.

    Parameters
    ----------
    parts : list of GptqTensors
        At least one; all of the same bits, group size, K and ``g_idx`` (act_order layers of
        one input share their Hessian's order, so GPTQ gives them the same g_idx).

    Returns
    -------
    GptqTensors
        qweight int32 [K*bits/32, sum N], scales [G, sum N] (float16 unless a part is float32),
        qzeros int32 [G, sum N * bits/32], the parts' g_idx.

    Raises
    ------
    FormatError
        The parts differ in bits, group size, K or g_idx (the message names the first that
        differs and how).
    """
    if not parts:
        raise FormatError("concatenate needs at least one layer")
    first = parts[0]
    for index, part in enumerate(parts[1:], 1):
        for field in ("bits", "group_size", "in_features"):
            if getattr(part, field) != getattr(first, field):
                raise FormatError(f"part {index} has {field}={getattr(part, field)} but part 0 "
                                  f"has {field}={getattr(first, field)}: layers concatenate "
                                  "along N only with the same quantization and K")
        if not np.array_equal(part.g_idx, first.g_idx):
            differ = int(np.count_nonzero(part.g_idx != first.g_idx))
            raise FormatError(f"part {index}'s g_idx differs from part 0's in {differ} of "
                              f"{first.in_features} rows: act_order orders differ")
    zeros = np.concatenate([part.zeros() for part in parts], axis=1)
    scales = np.concatenate([part.scales for part in parts], axis=1)
    return GptqTensors(
        qweight=np.concatenate([part.qweight for part in parts], axis=1),
        scales=scales,
        qzeros=pack_zeros(zeros, first.bits, first.zero_convention),
        g_idx=first.g_idx,
        bits=first.bits,
        group_size=first.group_size,
        in_features=first.in_features,
        out_features=sum(part.out_features for part in parts),
        zero_convention=first.zero_convention,
    )
