"""What each algorithm communicates and holds, in one process: every rank's TensorParallelMLP runs
on the torch fallback (float64) with torch.distributed's collectives replaced by recorders."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from qcompile.tp import ALGORITHMS, MlpLayers, SortedRowShard, TensorParallelMLP, shard_mlp
from qcompile.tp.local_linear import TorchDequantLinear
from qcompile.tp.mlp import reference_mlp
from qcompile.tp.synthetic import random_act_order_layer

K1, N1, N2, ROWS, GROUP = 128, 256, 64, 2, 32


@pytest.fixture
def collectives(monkeypatch):
    """Names of the collectives called, in order. all_reduce leaves the rank's partial sum
    (the test adds the ranks' outputs); all_gather_into_tensor fills zeros (counted only)."""
    calls = []

    def all_reduce(tensor, op=None, group=None):
        calls.append("all_reduce")

    def all_gather_into_tensor(output, tensor, group=None):
        calls.append("all_gather")
        output.zero_()

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather_into_tensor", all_gather_into_tensor)
    return calls


def _layers(rng) -> MlpLayers:
    make = lambda k, n: random_act_order_layer(k, n, 4, GROUP, rng)  # noqa: E731
    return MlpLayers(up=make(K1, N1), down=make(N1, N2), gate=make(K1, N1))


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_collectives_per_call(collectives, algorithm, size):
    """One AllReduce per call for every algorithm; the naive one adds an AllGather (none at
    size 1), TP-aware and rank-sorted none; the AllGather-free ones sum to the reference."""
    rng = np.random.default_rng(size)
    layers = _layers(rng)
    x = rng.standard_normal((ROWS, K1))
    make_linear = lambda shard: TorchDequantLinear(shard, torch.float64, "cpu")  # noqa: E731
    partials = []
    for rank in range(size):
        collectives.clear()
        mlp = TensorParallelMLP(shard_mlp(layers, rank, size, algorithm), make_linear)
        partials.append(mlp(torch.from_numpy(x)).numpy())
        gathers = 1 if algorithm == "naive" and size > 1 else 0
        assert collectives == ["all_gather"] * gathers + ["all_reduce"], (algorithm, rank)
    if algorithm != "naive" or size == 1:
        np.testing.assert_allclose(sum(partials), reference_mlp(layers, x), rtol=1e-9,
                                   atol=1e-9)


@pytest.mark.parametrize("size", [2, 4])
def test_rank_sorted_replicates_scales_and_shards_the_rest(size):
    """Every rank holds all G groups' scales and zero-points of down, and only its own K/size
    rows of codes and g_idx; naive and TP-aware ranks hold G/size groups."""
    layers = _layers(np.random.default_rng(0))
    down = layers.down
    for rank in range(size):
        shard = shard_mlp(layers, rank, size, "rank_sorted").down
        assert isinstance(shard, SortedRowShard)
        np.testing.assert_array_equal(shard.scales, down.scales)
        np.testing.assert_array_equal(shard.qzeros, down.qzeros)
        assert shard.in_features == N1 // size
        assert shard.qweight.shape == (down.qweight.shape[0] // size, N2)
        rows = slice(rank * N1 // size, (rank + 1) * N1 // size)
        np.testing.assert_array_equal(shard.g_idx, np.sort(down.g_idx[rows]))
        for algorithm in ("naive", "tp_aware"):
            other = shard_mlp(layers, rank, size, algorithm).down
            assert other.scales.shape == (down.num_groups // size, N2)


def test_tp_aware_is_the_default():
    """shard_mlp without an algorithm shards as TP-aware (docs/design/tensor-parallel.md: the
    fastest of the three on two H200s at every M = 1..16)."""
    layers = _layers(np.random.default_rng(1))
    default, tp_aware = shard_mlp(layers, 1, 2), shard_mlp(layers, 1, 2, "tp_aware")
    for name in ("up", "gate", "down"):
        a, b = getattr(default, name), getattr(tp_aware, name)
        np.testing.assert_array_equal(a.qweight, b.qweight)
        np.testing.assert_array_equal(a.g_idx, b.g_idx)
