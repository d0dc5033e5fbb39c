"""Naive, TP-aware and rank-sorted MLPs on gloo, world sizes 1, 2 and 4, scrambled g_idx, local
GEMMs on compiled qcompile kernels: each agrees with the single-process reference within 1e-3."""

import os
import subprocess
import sys

import numpy as np
import pytest

import targets
from qcompile.build import build_untuned
from qcompile.tp import ALGORITHMS, MlpLayers, shard_mlp
from qcompile.tp.local_linear import shard_spec
from qcompile.tp.mlp import reference_mlp
from qcompile.tp.storage import save_mlp
from qcompile.tp.synthetic import random_act_order_layer

pytestmark = pytest.mark.slow

K1, N1, N2, ROWS = 256, 512, 128, 2
WORLD_SIZES = (1, 2, 4)


def _layers(gated: bool, bits: int, group_size: int, seed: int) -> MlpLayers:
    rng = np.random.default_rng(seed)
    make = lambda k, n: random_act_order_layer(k, n, bits, group_size, rng)  # noqa: E731
    return MlpLayers(up=make(K1, N1), down=make(N1, N2), gate=make(K1, N1) if gated else None)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Every local shard's kernel for every world size and rank, built once (untuned: this
    test checks the algorithms, not the kernels' speed). The rank-sorted down shards differ
    by rank: each pads its own groups' runs."""
    out = tmp_path_factory.mktemp("tp_kernels")
    preset = targets.get("avx2")
    specs = set()
    for gated in (True, False):
        layers = _layers(gated=gated, bits=4, group_size=64, seed=0)
        for size in WORLD_SIZES:
            for rank in range(size):
                for algorithm in ALGORITHMS:
                    shards = shard_mlp(layers, rank, size, algorithm)
                    specs |= {shard_spec(s, ROWS) for s in (shards.up, shards.down)}
    for spec in specs:
        build_untuned(spec, preset, out)
    return out


def _run(tmp_path, layers: MlpLayers, size: int, kernels) -> dict:
    layers_path = tmp_path / f"mlp{size}.npz"
    out_path = tmp_path / f"out{size}.npz"
    save_mlp(layers_path, layers)
    env = {**os.environ, "TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={size}", "-m", "qcompile.tp.worker",
               "--layers", str(layers_path), "--rows", str(ROWS), "--backend", "qcompile",
               "--kernels", str(kernels), "--out", str(out_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with np.load(out_path) as data:
        return {name: data[name] for name in data.files}


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("gated", [True, False], ids=["llama_mlp", "up_down"])
def test_every_algorithm_matches_reference(tmp_path, kernels, size, gated):
    layers = _layers(gated=gated, bits=4, group_size=64, seed=0)
    outputs = _run(tmp_path, layers, size, kernels)
    x = np.random.default_rng(0).standard_normal((ROWS, K1)).astype(np.float32)
    reference = reference_mlp(layers, x)
    assert sorted(outputs) == sorted(ALGORITHMS)
    for algorithm in ALGORITHMS:
        error = np.abs(outputs[algorithm] - reference).max() / np.abs(reference).max()
        assert error < 1e-3, (algorithm, size, error)


def test_kernel_linears_of_several_rows_share_one_packing(tmp_path, kernels):
    """A shard's KernelLinears at M = ROWS and M = 1 pad and pack the shard once (the shared
    dict) and each runs its own kernel on it: both give x @ W of the rank-sorted shard."""
    import torch

    from qcompile.tp.local_linear import KernelLinear

    layers = _layers(gated=False, bits=4, group_size=64, seed=0)
    shard = shard_mlp(layers, 1, 2, "rank_sorted").down
    build_untuned(shard_spec(shard, 1), targets.get("avx2"), tmp_path)
    shared = {}
    weight = shard.dequantize().astype(np.float64)
    for rows, directory in ((ROWS, kernels), (1, tmp_path)):
        linear = KernelLinear(shard, directory, rows, shared=shared)
        x = torch.randn(rows, shard.in_features, generator=torch.Generator().manual_seed(rows))
        expected = x.double().numpy() @ weight
        error = np.abs(linear(x).numpy() - expected).max() / np.abs(expected).max()
        assert error < 1e-5, (rows, error)
    assert len(shared) == 2  # one padded layer, one packing for both kernels


def test_gather_first_composes_a_permutation_with_the_padded_layout(kernels):
    """The rank-sorted MLP hands its local sort Q_r to the down layer's KernelLinear, which
    composes it with its padding index: one gather per call, the same product as
    ``linear(x[:, Q_r])``; anything but a permutation of K_local is one clear error."""
    import torch

    from qcompile.errors import ArgumentError
    from qcompile.tp.local_linear import KernelLinear

    layers = _layers(gated=False, bits=4, group_size=64, seed=0)
    shard = shard_mlp(layers, 1, 2, "rank_sorted").down
    plain = KernelLinear(shard, kernels, ROWS)
    composed = KernelLinear(shard, kernels, ROWS)
    assert plain.pads  # a sorted shard of scrambled groups needs padding rows
    columns = np.random.default_rng(3).permutation(shard.in_features)
    composed.gather_first(columns)
    x = torch.randn(ROWS, shard.in_features, generator=torch.Generator().manual_seed(5))
    np.testing.assert_array_equal(composed(x).numpy(),
                                  plain(x[:, torch.from_numpy(columns)]).numpy())
    with pytest.raises(ArgumentError, match="permutation of 0..255"):
        composed.gather_first(np.zeros(shard.in_features, dtype=np.int64))
