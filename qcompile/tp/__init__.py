"""Tensor-parallel inference of act_order GPTQ weights without the extra AllGather
(TP-aware dequantization, Hoque et al. 2024) on torch.distributed."""

from qcompile.tp.mlp import ALGORITHMS, MlpLayers, RankShards, TensorParallelMLP, shard_mlp
from qcompile.tp.shard import permute_columns, reorder, shard_columns, shard_rows

__all__ = [
    "ALGORITHMS",
    "MlpLayers",
    "RankShards",
    "TensorParallelMLP",
    "permute_columns",
    "reorder",
    "shard_columns",
    "shard_mlp",
    "shard_rows",
]
