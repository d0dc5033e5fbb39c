"""act_order (desc_act) weights made sequential: the offline reorder of TP-aware dequantization
(Algorithm 1) and ExLlama's ``make_sequential``.

GPTQ with act_order quantizes input rows in a Hessian-driven order, so ``g_idx`` scatters each
group's rows over K. With ``P = argsort(g_idx)`` (stable), row i of the reordered weight is row
``P[i]`` of the original; every group then occupies a contiguous K-range in group order, the
reordered ``g_idx`` is trivial (``i // group_size``) and scales and zero-points are read once per
group. Since ``x @ W == x[:, P] @ W[P]``, a caller gathers its activations by P.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.gptq import GptqTensors, trivial_g_idx


def sequential_permutation(g_idx: np.ndarray) -> np.ndarray:
    """P = argsort(g_idx), stable: int64 [K], rows of each group in their original order."""
    g_idx = np.asarray(g_idx)
    if g_idx.ndim != 1:
        raise FormatError(f"g_idx must be 1-D [K]; got shape {tuple(g_idx.shape)}")
    return np.argsort(g_idx, kind="stable").astype(np.int64)


def is_trivial(g_idx: np.ndarray, group_size: int) -> bool:
    """True when ``g_idx[k] == k // group_size`` for every k (no act_order, or static groups):
    such weights need no reorder and no gather."""
    g_idx = np.asarray(g_idx)
    size = g_idx.shape[0] if group_size == -1 else group_size
    return bool(np.array_equal(g_idx, np.arange(g_idx.shape[0]) // max(size, 1)))


def permute_packed_rows(qweight: np.ndarray, permutation: np.ndarray, bits: int) -> np.ndarray:
    """Reorder the K rows of packed codes: int32 [K*bits/32, N] -> int32 [K*bits/32, N] holding
    rows ``permutation`` of the original, repacked in the same layout."""
    permutation = np.asarray(permutation)
    codes = bitpack.unpack(qweight, bits)
    if permutation.shape != (codes.shape[0],):
        raise FormatError(
            f"permutation must have shape [K]=({codes.shape[0]},); got {tuple(permutation.shape)}"
        )
    if not np.array_equal(np.sort(permutation), np.arange(codes.shape[0])):
        raise FormatError("permutation must hold every row index 0..K-1 exactly once")
    return bitpack.pack(codes[permutation], bits)


def reorder(layer: GptqTensors) -> tuple[np.ndarray, GptqTensors]:
    """Algorithm 1: ``P = argsort(g_idx)`` and the layer with its K rows in that order.

    Returns
    -------
    (numpy.ndarray of int64 [K], GptqTensors)
        P, and W[P] with a trivial g_idx (groups contiguous, in group order); scales and
        zero-points are per group and stay as they are. ``x @ W == x[:, P] @ W[P]``. A layer
        whose g_idx is trivial already (no act_order, or static groups) comes back unchanged
        with P = arange(K).
    """
    if is_trivial(layer.g_idx, layer.group_size):
        return np.arange(layer.in_features, dtype=np.int64), layer
    permutation = sequential_permutation(layer.g_idx)
    return permutation, replace(
        layer,
        qweight=permute_packed_rows(layer.qweight, permutation, layer.bits),
        g_idx=trivial_g_idx(layer.in_features, layer.group_size),
    )
