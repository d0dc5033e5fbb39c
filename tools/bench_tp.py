"""TP-aware vs naive act_order MLP latency, the TP-aware dequantization paper's tables.

One torchrun job per TP size; every rank builds the same synthetic act_order layers (4-bit,
g=128, scrambled g_idx), shards them for both algorithms with qcompile.tp, and times both on the
same activations, alternating algorithm by repeat so noise hits both alike. Rank 0 prints the
table and writes JSON.

    torchrun --standalone --nproc-per-node 2 tools/bench_tp.py --json tp2.json

On GPUs the local GEMMs use the torch fallback (each shard dequantized once to fp16, cuBLAS), as
the paper measured in fp16; NCCL does the collectives, with NVLink multicast off
(NCCL_NVLS_ENABLE=0). On a CPU it runs on gloo with --models tiny for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

MODELS = {  # K1, N1, N2 (the paper's MLP problem sizes)
    "llama70b": (8192, 28672, 8192),
    "granite20b": (6144, 24576, 6144),
    "tiny": (256, 1024, 256),
}


def time_mlp(mlp, x, iterations: int, synchronize) -> float:
    """Seconds per call over ``iterations`` back-to-back calls, all ranks started together."""
    import torch.distributed as dist

    dist.barrier()
    synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        mlp(x)
    synchronize()
    return (time.perf_counter() - start) / iterations


def main(argv=None) -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    import torch
    import torch.distributed as dist

    from qcompile.tp import ALGORITHMS, MlpLayers, TensorParallelMLP, shard_mlp
    from qcompile.tp.local_linear import TorchDequantLinear
    from qcompile.tp.synthetic import random_act_order_layer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama70b,granite20b")
    parser.add_argument("--rows", default="1,2,4,8,16", help="batch sizes M")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dtype = torch.float16 if cuda else torch.float32
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)

    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    for model in args.models.split(","):
        k1, n1, n2 = MODELS[model]
        rng = np.random.default_rng(0)  # the same layers on every rank
        layers = MlpLayers(
            up=random_act_order_layer(k1, n1, args.bits, args.group_size, rng),
            down=random_act_order_layer(n1, n2, args.bits, args.group_size, rng),
        )
        mlps = {}
        for algorithm in ALGORITHMS:
            shards = shard_mlp(layers, rank, size, algorithm)
            mlps[algorithm] = TensorParallelMLP(
                shards, lambda shard: TorchDequantLinear(shard, dtype, device)).to(device)
        del layers
        for rows in rows_list:
            x = torch.randn(rows, k1, generator=torch.Generator().manual_seed(rows)).to(
                device=device, dtype=dtype)
            outputs = {name: mlp(x) for name, mlp in mlps.items()}  # warm-up, and a check
            agreement = float((outputs["naive"] - outputs["tp_aware"]).abs().max()
                              / outputs["naive"].abs().max())
            timings = {name: [] for name in mlps}
            for repeat in range(args.repeats):
                order = ALGORITHMS if repeat % 2 == 0 else ALGORITHMS[::-1]
                for name in order:
                    timings[name].append(time_mlp(mlps[name], x, args.iterations, synchronize))
            naive_ms = statistics.median(timings["naive"]) * 1e3
            aware_ms = statistics.median(timings["tp_aware"]) * 1e3
            row = {"model": model, "K1": k1, "N1": n1, "N2": n2, "tp": size, "M": rows,
                   "naive_ms": naive_ms, "tp_aware_ms": aware_ms,
                   "speedup": naive_ms / aware_ms, "max_rel_difference": agreement,
                   "device": torch.cuda.get_device_name() if cuda else "cpu",
                   "local_gemm": f"torch-dequant {str(dtype).removeprefix('torch.')}"}
            results.append(row)
            if rank == 0:
                print(f"{model:10s} TP={size} M={rows:2d}  naive {naive_ms:7.3f} ms  "
                      f"tp-aware {aware_ms:7.3f} ms  speedup {row['speedup']:.2f}x  "
                      f"(outputs agree to {agreement:.1e})", flush=True)
    if rank == 0:
        for model in args.models.split(","):
            mine = [r["speedup"] for r in results if r["model"] == model]
            print(f"{model:10s} TP={size} average speedup over M: {statistics.mean(mine):.2f}x")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(results, handle, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
