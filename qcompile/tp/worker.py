"""One rank of a tensor-parallel MLP run, launched by torchrun:

    torchrun --standalone --nproc-per-node 2 -m qcompile.tp.worker \\
        --layers mlp.npz --rows 4 --backend qcompile --kernels kernels/ --out result.npz

Every rank shards the same layers for every algorithm (``ALGORITHMS``: naive, tp_aware,
rank_sorted), runs them on the same activations (seeded), and rank 0 writes each one's output
(float64 [M, N2], keyed by the algorithm's name) to ``--out``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from qcompile.tp.local_linear import KernelLinear, TorchDequantLinear
from qcompile.tp.mlp import ALGORITHMS, TensorParallelMLP, shard_mlp
from qcompile.tp.storage import load_mlp

BACKENDS = ("qcompile", "torch-dequant")


def make_linear_factory(backend: str, rows: int, kernels: str | None, dtype, device):
    if backend == "qcompile":
        if kernels is None:
            raise SystemExit("--backend qcompile needs --kernels DIR (qcompile build output)")
        return lambda shard: KernelLinear(shard, kernels, rows)
    return lambda shard: TorchDequantLinear(shard, dtype, device)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", required=True, help=".npz written by qcompile.tp.storage")
    parser.add_argument("--rows", type=int, default=1, help="activation rows M")
    parser.add_argument("--backend", choices=BACKENDS, default="qcompile")
    parser.add_argument("--kernels", help="directory of built kernels (qcompile backend)")
    parser.add_argument("--out", required=True, help="rank 0 writes the outputs here (.npz)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    layers = load_mlp(args.layers)
    x = np.random.default_rng(args.seed).standard_normal((args.rows, layers.up.in_features))
    x = torch.from_numpy(x.astype(np.float32))
    make_linear = make_linear_factory(args.backend, args.rows, args.kernels, torch.float32, "cpu")
    outputs = {}
    for algorithm in ALGORITHMS:
        mlp = TensorParallelMLP(shard_mlp(layers, rank, size, algorithm), make_linear)
        outputs[algorithm] = mlp(x).numpy().astype(np.float64)
    if rank == 0:
        np.savez(args.out, **outputs)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
