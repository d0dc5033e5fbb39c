"""The offline steps, checked in one process against the dequantized reference."""

from dataclasses import replace

import numpy as np
import pytest

from qcompile.errors import FormatError
from qcompile.tp import (
    ALGORITHMS,
    MlpLayers,
    permute_columns,
    reorder,
    shard_columns,
    shard_mlp,
    shard_rows,
    shard_rows_sorted,
)
from qcompile.tp.mlp import reference_mlp
from qcompile.tp.synthetic import random_act_order_layer


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [32, -1])
def test_reorder_permute_and_shards_preserve_the_product(bits, group_size):
    rng = np.random.default_rng(bits)
    layer = random_act_order_layer(256, 128, bits, group_size, rng)
    x = rng.standard_normal((3, 256))
    full = x @ layer.dequantize()
    permutation, sequential = reorder(layer)
    np.testing.assert_allclose(x[:, permutation] @ sequential.dequantize(), full, rtol=1e-6,
                               atol=1e-6)
    columns = rng.permutation(128)
    np.testing.assert_allclose(permute_columns(layer, columns).dequantize(),
                               layer.dequantize()[:, columns])
    parts = [shard_columns(layer, r, 4).dequantize() for r in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), layer.dequantize())
    rows = [shard_rows(sequential, r, 2).dequantize() for r in range(2)]
    np.testing.assert_array_equal(np.concatenate(rows, axis=0), sequential.dequantize())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [32, -1])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_rank_sorted_shards_preserve_the_product(bits, group_size, size):
    """Each rank's slice as stored, sorted locally, with every group's scales; the rows' sum
    over ranks is the full product, and the padded sequential layout computes the same."""
    rng = np.random.default_rng(bits * 10 + size)
    layer = random_act_order_layer(256, 64, bits, group_size, rng)
    x = rng.standard_normal((3, 256))
    total = np.zeros((3, 64))
    for rank in range(size):
        local, shard = shard_rows_sorted(layer, rank, size)
        rows = slice(rank * 256 // size, (rank + 1) * 256 // size)
        np.testing.assert_array_equal(np.sort(local), np.arange(256 // size))
        np.testing.assert_array_equal(shard.g_idx, np.sort(layer.g_idx[rows]))
        np.testing.assert_array_equal(shard.scales, layer.scales)  # every group, every rank
        np.testing.assert_array_equal(shard.zeros(), layer.zeros())
        np.testing.assert_array_equal(shard.dequantize(), layer.dequantize()[rows][local])
        x_sorted = x[:, rows][:, local]
        index, sequential = shard.sequential()
        assert sequential.in_features % sequential.group_size == 0
        assert not sequential.dequantize()[index == shard.in_features].any()  # padding: W = 0
        padded = np.pad(x_sorted, ((0, 0), (0, 1)))[:, index]  # and its input a zero column
        np.testing.assert_allclose(padded @ sequential.dequantize(),
                                   x_sorted @ shard.dequantize(), rtol=1e-12, atol=1e-12)
        if size == 1:  # whole groups: no padding, the layer's own group size
            assert sequential.in_features == 256
            assert sequential.group_size == (256 if group_size == -1 else group_size)
        # the tensor-core kernels' layout: K a multiple of 128, groups of 32, 64 or 128 rows
        index, half = shard.sequential(row_multiple=128, group_sizes=(32, 64, 128))
        assert half.in_features % 128 == 0 and half.group_size in (32, 64, 128)
        assert not half.dequantize()[index == shard.in_features].any()
        np.testing.assert_allclose(np.pad(x_sorted, ((0, 0), (0, 1)))[:, index]
                                   @ half.dequantize(), x_sorted @ shard.dequantize(),
                                   rtol=1e-12, atol=1e-12)
        total += x_sorted @ shard.dequantize()
    np.testing.assert_allclose(total, x @ layer.dequantize(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tensor_core_layout_keeps_the_unsorted_k_split(seed):
    """A rank-sorted down shard padded for the fp16 tensor-core kernels splits K over about as
    many warps as the unsorted shard of the other algorithms. When the split had to divide K's
    units, Llama-70B's down padded to 137 units at TP = 2 (a prime: one warp per 32 columns),
    which made rank_sorted 4.5x slower than TP-aware on two H200s; the split now takes any
    count of units."""
    from qcompile.kernels.uniform.compute_cuda_mma_f16 import k_split, unit_slice
    from qcompile.tp.local_linear import kernel_layer, shard_spec

    layer = random_act_order_layer(4096, 256, 4, 128, np.random.default_rng(seed))
    _, sequential = reorder(layer)
    x = np.random.default_rng(seed).standard_normal((2, 2048))
    for rank in range(2):
        local, shard = shard_rows_sorted(layer, rank, 2)
        unsorted = shard_spec(shard_rows(sequential, rank, 2), 1, "float16")  # 16 units
        for rows in (1, 16):
            spec = shard_spec(shard, rows, "float16")
            assert spec.k % 128 == 0 and spec.group_size in (32, 64, 128)
            assert spec.k < unsorted.k + 128 * 8   # padded to whole units, not to the split
            # (any count of units splits: no prime count leaves one warp per 32 columns)
            assert k_split(spec) >= 0.7 * k_split(replace(unsorted, m=rows))
            slices = [unit_slice(spec, p) for p in range(k_split(spec))]
            assert sum(count for _, count in slices) == spec.k // 128
        index, padded = kernel_layer(shard, "float16")
        assert not padded.dequantize()[index == shard.in_features].any()  # padding: W = 0
        x_sorted = x[:, local]
        np.testing.assert_allclose(np.pad(x_sorted, ((0, 0), (0, 1)))[:, index]
                                   @ padded.dequantize(), x_sorted @ shard.dequantize(),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_unpadded_sorted_shard_needs_no_gather(dtype):
    """At TP = 1 (whole groups) the sequential layout of a rank-sorted shard has no padding,
    so the kernel reads its input as it is: no gather per call."""
    from qcompile.tp.local_linear import kernel_layer

    layer = random_act_order_layer(512, 64, 4, 128, np.random.default_rng(3))
    _, shard = shard_rows_sorted(layer, 0, 1)
    index, padded = kernel_layer(shard, dtype)
    assert index is None
    np.testing.assert_array_equal(padded.dequantize(), shard.dequantize())
    _, shard = shard_rows_sorted(layer, 0, 2)
    assert kernel_layer(shard, dtype)[0] is not None  # a slice of part-groups is padded


def test_single_process_simulation_of_every_algorithm():
    rng = np.random.default_rng(5)
    layers = MlpLayers(up=random_act_order_layer(128, 256, 4, 32, rng),
                       down=random_act_order_layer(256, 64, 4, 32, rng),
                       gate=random_act_order_layer(128, 256, 4, 32, rng))
    x = rng.standard_normal((2, 128))
    reference = reference_mlp(layers, x)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    for size in (1, 2, 4):
        for algorithm in ALGORITHMS:
            shards = [shard_mlp(layers, r, size, algorithm) for r in range(size)]
            hidden = [silu(x[:, s.gate_permutation] @ s.gate.dequantize())
                      * (x[:, s.up_permutation] @ s.up.dequantize()) for s in shards]
            if algorithm == "naive":
                full = np.concatenate(hidden, axis=1)[:, shards[0].down_permutation]
                hidden = np.split(full, size, axis=1)
            if algorithm == "rank_sorted":  # each rank gathers its own columns, nothing else
                hidden = [h[:, s.down_permutation] for h, s in zip(hidden, shards, strict=True)]
            out = sum(h @ s.down.dequantize() for h, s in zip(hidden, shards, strict=True))
            np.testing.assert_allclose(out, reference, rtol=1e-9, atol=1e-9)


def test_shard_errors_state_the_rule():
    rng = np.random.default_rng(0)
    layer = random_act_order_layer(256, 96, 4, 64, rng)
    with pytest.raises(FormatError, match="N=96 must be divisible by the world size 5"):
        shard_columns(layer, 0, 5)
    with pytest.raises(FormatError, match="needs sequential groups"):
        shard_rows(layer, 0, 2)
    _, sequential = reorder(layer)
    with pytest.raises(FormatError, match="K/size=32 must hold whole groups of group_size=64"):
        shard_rows(sequential, 0, 8)
    with pytest.raises(ValueError, match=r"rank must lie in \[0, 2\)"):
        shard_rows(sequential, 2, 2)
    with pytest.raises(FormatError, match="K/size=4 must be a multiple of 8"):
        shard_rows_sorted(layer, 0, 64)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        shard_mlp(MlpLayers(up=layer, down=random_act_order_layer(96, 32, 4, 32, rng)), 0, 1,
                  "sorted")


def test_rank_sorted_shard_states_its_rule():
    rng = np.random.default_rng(1)
    _, shard = shard_rows_sorted(random_act_order_layer(256, 64, 4, 32, rng), 0, 2)
    with pytest.raises(FormatError, match="g_idx must be nondecreasing"):
        replace(shard, g_idx=shard.g_idx[::-1].copy())
    with pytest.raises(FormatError, match=r"qzeros must have shape \(4, 8\) .* G=4"):
        replace(shard, scales=shard.scales[:4])
