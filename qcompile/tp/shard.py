"""Offline preparation of act_order GPTQ weights for tensor parallelism (TP-aware dequantization,
Hoque et al. 2024): the reorder of Algorithm 1, column permutation, and Megatron sharding.

All functions take and return :class:`qcompile.formats.gptq.GptqTensors` (checkpoint
orientation: W is [K, N], y = x @ W) and never dequantize: codes, scales and zero-points move
as they are, so a shard computes exactly what the matching slice of the full layer computes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.act_order import is_trivial, reorder  # noqa: F401 (re-exported: qcompile.tp.reorder)
from qcompile.formats.gptq import GptqTensors, pack_zeros, trivial_g_idx


def permute_columns(layer: GptqTensors, permutation: np.ndarray) -> GptqTensors:
    """``W[:, permutation]`` with its scales and zero-points: output column j of the result is
    column ``permutation[j]`` of the input (the TP-aware step ``W1[P1, P2]``)."""
    permutation = np.asarray(permutation)
    n = layer.out_features
    if permutation.shape != (n,) or not np.array_equal(np.sort(permutation), np.arange(n)):
        raise FormatError(
            f"column permutation must hold every index 0..N-1 (N={n}) once; "
            f"got shape {tuple(permutation.shape)}"
        )
    zeros = layer.zeros()[:, permutation]
    return replace(
        layer,
        qweight=np.ascontiguousarray(layer.qweight[:, permutation]),
        scales=np.ascontiguousarray(layer.scales[:, permutation]),
        qzeros=pack_zeros(zeros, layer.bits, layer.zero_convention),
    )


def shard_range(length: int, rank: int, size: int, what: str) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s equal part of ``length`` (named ``what`` in errors)."""
    if size <= 0 or not 0 <= rank < size:
        raise ValueError(f"rank must lie in [0, {size}) for world size {size}; got {rank}")
    if length % size:
        raise FormatError(f"{what}={length} must be divisible by the world size {size}")
    part = length // size
    return rank * part, (rank + 1) * part


def row_block(layer: GptqTensors, rank: int, size: int) -> tuple[int, int, slice]:
    """(start, stop, packed word rows) of rank ``rank``'s rows of ``layer``: K/size rows, a
    whole number of packed blocks (FormatError otherwise)."""
    start, stop = shard_range(layer.in_features, rank, size, "K")
    values, words = bitpack.block_shape(layer.bits)
    if (stop - start) % values:
        raise FormatError(f"a row shard of K/size={stop - start} must be a multiple of {values} "
                          f"({layer.bits}-bit codes pack {values} rows per block)")
    return start, stop, slice(start // values * words, stop // values * words)


def shard_columns(layer: GptqTensors, rank: int, size: int) -> GptqTensors:
    """Column-parallel shard: output columns ``[rank*N/size, (rank+1)*N/size)``."""
    start, stop = shard_range(layer.out_features, rank, size, "N")
    values, _ = bitpack.block_shape(layer.bits)
    if (stop - start) % values:
        raise FormatError(
            f"a column shard of N/size={stop - start} must be a multiple of {values}: qzeros "
            f"pack {values} {layer.bits}-bit zero-points per block along N"
        )
    return replace(
        layer,
        qweight=np.ascontiguousarray(layer.qweight[:, start:stop]),
        scales=np.ascontiguousarray(layer.scales[:, start:stop]),
        qzeros=pack_zeros(layer.zeros()[:, start:stop], layer.bits, layer.zero_convention),
        out_features=stop - start,
    )


def shard_rows(layer: GptqTensors, rank: int, size: int) -> GptqTensors:
    """Row-parallel shard: input rows ``[rank*K/size, (rank+1)*K/size)`` with their groups.

    The layer must be sequential (trivial g_idx: call :func:`reorder` first) and each shard must
    hold whole groups, so a shard's scales and zero-points are a plain slice of the layer's.
    """
    if not is_trivial(layer.g_idx, layer.group_size):
        raise FormatError("row-sharding needs sequential groups: reorder the layer (g_idx is "
                          "not k // group_size)")
    start, stop, word_rows = row_block(layer, rank, size)
    rows = stop - start
    if layer.group_size == -1:
        groups = slice(0, 1)  # one group spans the column: every shard keeps its scale
        group_size = -1
    else:
        if rows % layer.group_size:
            raise FormatError(f"a row shard of K/size={rows} must hold whole groups of "
                              f"group_size={layer.group_size}")
        groups = slice(start // layer.group_size, stop // layer.group_size)
        group_size = layer.group_size
    return replace(
        layer,
        qweight=np.ascontiguousarray(layer.qweight[word_rows]),
        scales=np.ascontiguousarray(layer.scales[groups]),
        qzeros=np.ascontiguousarray(layer.qzeros[groups]),
        g_idx=trivial_g_idx(rows, group_size),
        in_features=rows,
        group_size=group_size,
    )
