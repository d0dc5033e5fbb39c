"""The offline steps, checked in one process against the dequantized reference."""

import numpy as np
import pytest

from qcompile.errors import FormatError
from qcompile.tp import MlpLayers, permute_columns, reorder, shard_columns, shard_mlp, shard_rows
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


def test_single_process_simulation_of_both_algorithms():
    rng = np.random.default_rng(5)
    layers = MlpLayers(up=random_act_order_layer(128, 256, 4, 32, rng),
                       down=random_act_order_layer(256, 64, 4, 32, rng),
                       gate=random_act_order_layer(128, 256, 4, 32, rng))
    x = rng.standard_normal((2, 128))
    reference = reference_mlp(layers, x)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    for size in (1, 2, 4):
        for algorithm in ("naive", "tp_aware"):
            shards = [shard_mlp(layers, r, size, algorithm) for r in range(size)]
            hidden = [silu(x[:, s.gate_permutation] @ s.gate.dequantize())
                      * (x[:, s.up_permutation] @ s.up.dequantize()) for s in shards]
            if algorithm == "naive":
                full = np.concatenate(hidden, axis=1)[:, shards[0].down_permutation]
                hidden = np.split(full, size, axis=1)
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
