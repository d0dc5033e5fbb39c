"""Tensor-parallel inference of act_order GPTQ weights on torch.distributed: the naive algorithm,
TP-aware dequantization (Hoque et al. 2024) and vLLM's rank-sorted row shards, the last two
without the naive algorithm's AllGather."""

from qcompile.tp.mlp import ALGORITHMS, MlpLayers, RankShards, TensorParallelMLP, shard_mlp
from qcompile.tp.shard import permute_columns, reorder, shard_columns, shard_rows
from qcompile.tp.sorted_rows import SortedRowShard, shard_rows_sorted

__all__ = [
    "ALGORITHMS",
    "MlpLayers",
    "RankShards",
    "SortedRowShard",
    "TensorParallelMLP",
    "permute_columns",
    "reorder",
    "shard_columns",
    "shard_mlp",
    "shard_rows",
    "shard_rows_sorted",
]
