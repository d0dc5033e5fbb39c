"""Tensor-parallel MLPs with act_order weights: the naive algorithm, the TP-aware one, and the
rank-sorted one (vLLM's).

Megatron sharding: the first layer(s) (up, and gate for a Llama MLP) are column-parallel, the
second (down) is row-parallel. With act_order, a layer is reordered offline (Algorithm 1):
``x @ W == x[:, P] @ W[P]``. Reordered as a whole, the row-parallel down layer wants its input in
order P2, so

- the naive algorithm (Algorithm 2) gathers the first layer's output from every rank, permutes
  it by P2 and takes this rank's chunk: one AllGather per MLP;
- the TP-aware algorithm (Algorithm 3) permutes the first layer's output columns by P2 offline
  (``W1[P1, P2]``), so each rank's local output is already the chunk the down layer needs: no
  AllGather, only the final AllReduce.

The rank-sorted algorithm (vLLM's GPTQ-Marlin path) never reorders the down layer as a whole:
rank r takes the down layer's rows ``[r*N1/size, (r+1)*N1/size)`` as stored, which are exactly
the first layer's output columns it computes, keeps every group's scales and zero-points, and
sorts its rows by group locally (Q_r, :mod:`qcompile.tp.sorted_rows`). At run time it gathers
its own output columns by Q_r: no AllGather, no offline change to the first layer, only the
final AllReduce; the price is the replicated scales and a local gather per call.

Activations commute with column permutations, so a gated MLP permutes gate and up alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qcompile.formats.gptq import GptqTensors
from qcompile.tp.shard import permute_columns, reorder, shard_columns, shard_rows
from qcompile.tp.sorted_rows import SortedRowShard, shard_rows_sorted

ALGORITHMS = ("naive", "tp_aware", "rank_sorted")
#: What :func:`shard_mlp` does unless told: TP-aware needs no collective between the two layers
#: and reads each weight once at its own size; it was the fastest of the three on two H200s at
#: every M = 1..16 (docs/design/tensor-parallel.md).
DEFAULT_ALGORITHM = "tp_aware"


@dataclass(frozen=True)
class MlpLayers:
    """One MLP's quantized layers, checkpoint orientation (y = x @ W).

    Attributes
    ----------
    up : GptqTensors, [K1, N1]
    down : GptqTensors, [N1, N2]
    gate : GptqTensors or None, [K1, N1]
        Present for a Llama-style MLP: ``down(silu(gate(x)) * up(x))``; absent for the paper's
        single up/down pair: ``down(up(x))``.
    """

    up: GptqTensors
    down: GptqTensors
    gate: GptqTensors | None = None

    def __post_init__(self) -> None:
        if self.down.in_features != self.up.out_features:
            raise ValueError(f"down's K={self.down.in_features} must equal up's "
                             f"N={self.up.out_features}")
        if self.gate is not None and (self.gate.in_features, self.gate.out_features) != (
                self.up.in_features, self.up.out_features):
            raise ValueError("gate and up must have the same shape")


@dataclass(frozen=True)
class RankShards:
    """What one rank holds: its shards and the permutations it applies at run time.

    Attributes
    ----------
    algorithm : str
        One of :data:`ALGORITHMS`.
    rank, size : int
    up_permutation : numpy.ndarray of int64, shape [K1]
        P1 of up: gathers x.
    gate_permutation : numpy.ndarray of int64, shape [K1], or None
        P1 of gate.
    down_permutation : numpy.ndarray of int64
        naive: P2 [N1], permutes the gathered first-layer output; tp_aware: P2 [N1], folded into
        the first layer's columns offline (unused at run time); rank_sorted: Q_r [N1/size], this
        rank's local sort, gathers its own first-layer output.
    up, gate : GptqTensors, [K1, N1/size]
        Column shards, rows in P1 order (for tp_aware, columns in P2 order before sharding).
    down : GptqTensors or SortedRowShard, [N1/size, N2]
        naive and tp_aware: a row shard of the reordered layer (its groups' scales only);
        rank_sorted: a :class:`~qcompile.tp.sorted_rows.SortedRowShard` (every group's scales).
    """

    algorithm: str
    rank: int
    size: int
    up_permutation: np.ndarray
    gate_permutation: np.ndarray | None
    down_permutation: np.ndarray
    up: GptqTensors
    gate: GptqTensors | None
    down: GptqTensors | SortedRowShard


def shard_mlp(layers: MlpLayers, rank: int, size: int,
              algorithm: str = DEFAULT_ALGORITHM) -> RankShards:
    """Offline: what rank ``rank`` of ``size`` holds for ``algorithm`` (default
    :data:`DEFAULT_ALGORITHM`).

    naive and tp_aware reorder every layer, permute W1's columns by P2 (tp_aware only) and
    shard; rank_sorted reorders the first layer(s) as naive does, and takes its down shard with
    :func:`~qcompile.tp.sorted_rows.shard_rows_sorted` (no global reorder of down).

    Raises
    ------
    ValueError
        An unknown algorithm, or a rank outside [0, size).
    FormatError
        A dimension the sharding cannot split (the message names it and the rule).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}; got {algorithm!r}")
    if algorithm == "rank_sorted":
        down_permutation, down = shard_rows_sorted(layers.down, rank, size)
    else:
        down_permutation, sequential_down = reorder(layers.down)
        down = shard_rows(sequential_down, rank, size)

    def first_layer(layer: GptqTensors) -> tuple[np.ndarray, GptqTensors]:
        permutation, sequential = reorder(layer)
        if algorithm == "tp_aware":
            sequential = permute_columns(sequential, down_permutation)
        return permutation, shard_columns(sequential, rank, size)

    up_permutation, up = first_layer(layers.up)
    gate_permutation, gate = first_layer(layers.gate) if layers.gate is not None else (None, None)
    return RankShards(algorithm=algorithm, rank=rank, size=size, up_permutation=up_permutation,
                      gate_permutation=gate_permutation, down_permutation=down_permutation,
                      up=up, gate=gate, down=down)


class TensorParallelMLP:
    """One rank's MLP: local GEMMs through ``make_linear`` and torch.distributed collectives.

    Parameters
    ----------
    shards : RankShards
    make_linear : callable
        ``make_linear(shard: GptqTensors | SortedRowShard) -> callable(x [M, K] -> [M, N])``:
        the local GEMM backend (see :mod:`qcompile.tp.local_linear`).
    group : torch.distributed ProcessGroup, optional
    """

    def __init__(self, shards: RankShards, make_linear: Callable, group=None) -> None:
        import torch

        self.shards = shards
        self.group = group
        self.up = make_linear(shards.up)
        self.gate = make_linear(shards.gate) if shards.gate is not None else None
        self.down = make_linear(shards.down)
        self._up_index = torch.from_numpy(shards.up_permutation)
        self._gate_index = (torch.from_numpy(shards.gate_permutation)
                            if shards.gate_permutation is not None else None)
        down_index = shards.down_permutation
        if shards.algorithm == "naive":  # only this rank's chunk of P2 is ever read
            down_index = np.array_split(down_index, shards.size)[shards.rank]
        self._down_index = torch.from_numpy(np.ascontiguousarray(down_index))
        # rank-sorted: a backend that gathers its input anyway (a padded kernel layout) takes
        # Q_r into that gather, one index_select per call instead of two. (The first layers
        # keep a gather before the kernel: the tensor-core kernels' act_order form, which
        # reads x through perm itself, measured slower than index_select + the plain kernel:
        # docs/design/tensor-parallel.md)
        self._down_gathers = shards.algorithm == "rank_sorted" and hasattr(self.down,
                                                                            "gather_first")
        if self._down_gathers:
            self.down.gather_first(shards.down_permutation)

    def to(self, device) -> TensorParallelMLP:
        """Move the permutation indices (the shards' backends place their own weights)."""
        self._up_index = self._up_index.to(device)
        if self._gate_index is not None:
            self._gate_index = self._gate_index.to(device)
        self._down_index = self._down_index.to(device)
        return self

    def first_layer(self, x):
        """This rank's first-layer output: [M, N1/size] (columns in P2 order for TP-aware, in
        the checkpoint's order otherwise)."""
        import torch

        # advanced indexing: torch's faster gather of columns (tools/studies/gather_probe.py)
        hidden = self.up(x[:, self._up_index])
        if self.gate is not None:
            gate = self.gate(x[:, self._gate_index])
            hidden = torch.nn.functional.silu(gate) * hidden
        return hidden

    def _gather_columns(self, hidden):
        """[M, N1/size] on every rank -> [M, N1] (rank r's columns at r*N1/size): the naive
        algorithm's AllGather, into one buffer (the collective's fastest form); none at size 1."""
        import torch
        import torch.distributed as dist

        size = self.shards.size
        if size == 1:
            return hidden
        rows, columns = hidden.shape
        gathered = torch.empty((size * rows, columns), dtype=hidden.dtype, device=hidden.device)
        dist.all_gather_into_tensor(gathered, hidden.contiguous(), group=self.group)
        return gathered.view(size, rows, columns).permute(1, 0, 2).reshape(rows, size * columns)

    def __call__(self, x):
        """x: [M, K1], the same on every rank -> [M, N2], the same on every rank."""
        import torch.distributed as dist

        hidden = self.first_layer(x)
        if self.shards.algorithm == "naive":  # this rank's chunk of the gathered columns by P2
            hidden = self._gather_columns(hidden)[:, self._down_index]
        elif self.shards.algorithm == "rank_sorted" and not self._down_gathers:
            hidden = hidden[:, self._down_index]  # Q_r: this rank's columns only
        out = self.down(hidden)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out


def reference_mlp(layers: MlpLayers, x: np.ndarray) -> np.ndarray:
    """Single-process float64 reference: dequantize every layer, then the MLP."""
    x = np.asarray(x, dtype=np.float64)
    hidden = x @ layers.up.dequantize().astype(np.float64)
    if layers.gate is not None:
        gate = x @ layers.gate.dequantize().astype(np.float64)
        hidden = gate / (1 + np.exp(-gate)) * hidden
    return hidden @ layers.down.dequantize().astype(np.float64)
