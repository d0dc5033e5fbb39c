"""The rank-sorted row-parallel shard of an act_order layer (vLLM's GPTQ-Marlin path).

A row-parallel rank takes its contiguous K slice of the layer as the checkpoint stores it (codes
and ``g_idx``, no global reorder), keeps the scales and zero-points of every group (its rows may
belong to any group, so they are replicated on every rank, not sharded), and sorts its own rows by
group: ``Q = argsort(g_idx[slice])``, stable. Since ``x_local @ W_slice == x_local[:, Q] @
W_slice[Q]``, the rank gathers its own input columns by Q and nothing crosses ranks.

After the sort a group's rows are contiguous in the slice, but a slice holds anywhere from 0 to
group_size rows of each group, so the shard is not a GPTQ layer of K_local rows: it is a
:class:`SortedRowShard`. The torch fallback dequantizes it as it is; qcompile's uniform kernels
read one scale per fixed run of rows and have no per-row group lookup, so
:meth:`SortedRowShard.sequential` pads each group's run to whole sub-groups with rows of weight
exactly zero fed by a zero column: an exact layout they run, at the price of the padding and of
one scale per sub-group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.act_order import permute_packed_rows, sequential_permutation
from qcompile.formats.gptq import GptqTensors, pack_zeros, unpack_zeros
from qcompile.tp.shard import row_block

#: Bytes the uniform kernels read per group and column besides the codes: an fp16 scale and a
#: uint8 zero-point (``UniformFamily.bytes_read``); they set the sub-group size of ``sequential``.
GROUP_PARAMETER_BYTES = 3


@dataclass(frozen=True)
class SortedRowShard:
    """Rows ``[start, stop)`` of an act_order layer W [K, N], sorted by group on the rank.

    Attributes
    ----------
    qweight : numpy.ndarray of int32, shape [K_local * bits/32, N]
        The slice's codes in the local order (row i is slice row ``Q[i]``), packed along K as
        GPTQ packs them (3-bit: 32 codes per 3 words).
    scales : numpy.ndarray of float16 or float32, shape [G, N]
        The scales of every group of the full layer, the same on every rank.
    qzeros : numpy.ndarray of int32, shape [G, N * bits/32]
        The zero-points of every group, packed along N in ``zero_convention``.
    g_idx : numpy.ndarray of int32, shape [K_local]
        Group of each local row, nondecreasing, in [0, G); a group has 0 to group_size rows here.
    bits, group_size : int
        The full layer's.
    in_features : int
        K_local, the slice's rows.
    out_features : int
        N.
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

    def __post_init__(self) -> None:
        rows = bitpack.packed_length(self.in_features, self.bits)
        groups = self.scales.shape[0]
        zero_columns = bitpack.packed_length(self.out_features, self.bits)
        for name, array, shape in (
                ("qweight", self.qweight, (rows, self.out_features)),
                ("scales", self.scales, (groups, self.out_features)),
                ("qzeros", self.qzeros, (groups, zero_columns)),
                ("g_idx", self.g_idx, (self.in_features,))):
            if array.shape != shape:
                raise FormatError(f"{name} must have shape {shape} for K_local="
                                  f"{self.in_features}, N={self.out_features}, G={groups}; "
                                  f"got {tuple(array.shape)}")
        if self.in_features and (self.g_idx.min() < 0 or self.g_idx.max() >= groups
                                 or np.any(np.diff(self.g_idx) < 0)):
            raise FormatError(f"g_idx must be nondecreasing in [0, {groups}): the rows sorted "
                              "by group")

    def codes(self) -> np.ndarray:
        """Unpacked codes q [K_local, N], int32, in the local order."""
        return bitpack.unpack(self.qweight, self.bits, self.in_features)

    def zeros(self) -> np.ndarray:
        """Zero-points z [G, N], int32, of every group."""
        return unpack_zeros(self.qzeros, self.bits, self.out_features, self.zero_convention)

    def dequantize(self) -> np.ndarray:
        """W_slice[Q] [K_local, N], float32: row i is ``scales[g] * (q[i] - z[g])``, g =
        ``g_idx[i]`` (the torch fallback multiplies by this)."""
        scales = self.scales.astype(np.float32)[self.g_idx]
        zeros = self.zeros().astype(np.float32)[self.g_idx]
        return scales * (self.codes().astype(np.float32) - zeros)

    def sequential(self, row_multiple: int = 1,
                   group_sizes: tuple[int, ...] | None = None) -> tuple[np.ndarray, GptqTensors]:
        """This shard as a sequential GPTQ layer, the layout qcompile's uniform kernels run.

        Each group's run of rows is padded to whole sub-groups of S rows with rows whose code
        is the group's zero-point (weight exactly 0) and whose input is a zero column, and
        every sub-group gets its group's scale and zero-point. S is the multiple of the packed
        block (8 rows at 4 bits) that minimizes the bytes a kernel reads: padded codes plus 3
        bytes per sub-group and column. A slice of whole groups (TP = 1, or a layer without
        act_order) needs no padding and keeps its group size.

        Parameters
        ----------
        row_multiple : int
            K_pad is made a multiple of this (the last group takes more padding rows): what a
            kernel's tiling needs (128 for the tensor-core kernels).
        group_sizes : tuple of int, optional
            The values S may take (the kernel's group sizes); None: any multiple of the block.

        Returns
        -------
        index : numpy.ndarray of int64, shape [K_pad]
            Column of the sorted input ``x_sorted = x_local[:, Q]`` [M, K_local] that feeds
            each row of ``layer``; a padding row reads column K_local, a zero column appended
            to x_sorted.
        layer : GptqTensors
            [K_pad, N], trivial g_idx, group_size S, scales [K_pad / S, N]:
            ``[x_sorted, 0][:, index] @ layer.dequantize() == x_sorted @ self.dequantize()``,
            and a kernel's partial sums over the padding are 0 whatever its arithmetic.
        """
        groups, starts, counts = np.unique(self.g_idx, return_index=True, return_counts=True)
        step = self._sub_group_rows(counts, group_sizes)
        if row_multiple % step and step % row_multiple:
            raise ValueError(f"sub-groups of {step} rows cannot fill a multiple of "
                             f"{row_multiple} rows")
        lengths = -(-counts // step) * step
        lengths[-1] += -int(lengths.sum()) % row_multiple
        codes, zeros = self.codes(), self.zeros()
        padded_codes = np.empty((int(lengths.sum()), self.out_features), dtype=codes.dtype)
        index = np.empty(int(lengths.sum()), dtype=np.int64)
        position = 0
        for group, start, count, length in zip(groups, starts, counts, lengths, strict=True):
            real, end = position + count, position + length
            padded_codes[position:real] = codes[start:start + count]
            padded_codes[real:end] = zeros[group]
            index[position:real] = np.arange(start, start + count)
            index[real:end] = self.in_features
            position = end
        sub_groups = np.repeat(groups, lengths // step)
        layer = GptqTensors.from_tensors(
            qweight=bitpack.pack(padded_codes, self.bits), scales=self.scales[sub_groups],
            qzeros=pack_zeros(zeros[sub_groups], self.bits, self.zero_convention),
            bits=self.bits, group_size=step, zero_convention=self.zero_convention)
        return index, layer

    def _sub_group_rows(self, counts: np.ndarray, group_sizes: tuple[int, ...] | None) -> int:
        """S for :meth:`sequential`: the candidate (powers of two times the packed block, and
        the runs' common divisor when it is a multiple of the block; or ``group_sizes``) of the
        fewest bytes."""
        values, _ = bitpack.block_shape(self.bits)
        candidates = {values}
        while max(candidates) * 2 <= counts.max():
            candidates.add(max(candidates) * 2)
        common = int(np.gcd.reduce(counts))
        if common % values == 0:
            candidates.add(common)
        if group_sizes is not None:
            candidates = {size for size in group_sizes if size > 0 and size % values == 0}
            if not candidates:
                raise ValueError(f"none of the group sizes {group_sizes} is a multiple of the "
                                 f"{self.bits}-bit packing block ({values} rows)")

        def bytes_read(step: int) -> float:
            rows = int((-(-counts // step) * step).sum())
            return rows * self.bits / 8 + rows // step * GROUP_PARAMETER_BYTES

        return min(sorted(candidates, reverse=True), key=bytes_read)


def shard_rows_sorted(layer: GptqTensors, rank: int,
                      size: int) -> tuple[np.ndarray, SortedRowShard]:
    """The rank-sorted row-parallel shard: rows ``[rank*K/size, (rank+1)*K/size)`` of ``layer``
    as stored, sorted by group on the rank, with every group's scales and zero-points.

    Parameters
    ----------
    layer : GptqTensors
        W [K, N] in checkpoint order, any g_idx (act_order or not); not reordered.
    rank, size : int
        This rank and the world size; K/size must be a whole number of packed blocks (8 rows
        at 4 bits), and need not hold whole groups.

    Returns
    -------
    Q : numpy.ndarray of int64, shape [K/size]
        The local sort, stable: local row i is slice row Q[i], so ``x_local @ W_slice ==
        x_local[:, Q] @ shard.dequantize()`` for x_local [M, K/size].
    shard : SortedRowShard
        qweight int32 [K/size * bits/32, N] (rows in Q order), scales [G, N] and qzeros
        [G, N * bits/32] of all G groups (the layer's own arrays), g_idx int32 [K/size] sorted.

    Raises
    ------
    ValueError
        The rank does not lie in [0, size).
    FormatError
        K is not divisible by ``size``, or K/size is not a whole number of packed blocks.
    """
    start, stop, word_rows = row_block(layer, rank, size)
    rows = stop - start
    g_idx = layer.g_idx[start:stop]
    permutation = sequential_permutation(g_idx)
    sliced = layer.qweight[word_rows]
    return permutation, SortedRowShard(
        qweight=permute_packed_rows(sliced, permutation, layer.bits),
        scales=layer.scales, qzeros=layer.qzeros,
        g_idx=np.ascontiguousarray(g_idx[permutation]).astype(np.int32),
        bits=layer.bits, group_size=layer.group_size, in_features=rows,
        out_features=layer.out_features, zero_convention=layer.zero_convention)
