"""act_order MLP latency under tensor parallelism: the naive, TP-aware and rank-sorted algorithms
(the TP-aware dequantization paper's tables, plus vLLM's way).

One torchrun job per TP size; every rank builds the same synthetic act_order layers (4-bit,
g=128, scrambled g_idx), shards them for every algorithm with qcompile.tp, and times them on the
same activations, rotating the algorithms' order by repeat so noise hits all alike, once per
local GEMM backend. Rank 0 prints the table and writes JSON.

    torchrun --standalone --nproc-per-node 2 tools/bench_tp.py --json tp2.json

Backends (``--backends``): ``torch-dequant``, the torch fallback (each shard dequantized once, fp16
on GPUs, as the paper measured), and ``qcompile``, our kernels through the kernel cache (the
database's best record, else the untuned heuristic; each row says which), with activations of
``--dtype`` (fp16 on GPUs: the tensor-core kernels; float32 on CPUs). On GPUs NCCL does the
collectives, with NVLink multicast off (NCCL_NVLS_ENABLE=0), and each timing replays a CUDA
graph of ``--iterations`` MLP calls (collectives included), so Python's cost per call stays out
as it does in a served model; the row says when capture failed and calls ran eagerly. On a CPU
it runs on gloo; ``--models tiny`` makes a smoke test.

Untuned kernels are built on first use, one rank at a time. ``--build-only --tp 1,2`` builds
every kernel the given TP sizes need first, in ``--jobs`` processes, without torch.distributed:

    python tools/bench_tp.py --build-only --tp 1,2 --jobs 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools.harness

import targets  # noqa: E402
from qcompile.tp import ALGORITHMS, MlpLayers, TensorParallelMLP, shard_mlp  # noqa: E402
from qcompile.tp.local_linear import KernelLinear, TorchDequantLinear, shard_spec  # noqa: E402
from qcompile.tp.synthetic import random_act_order_layer  # noqa: E402
from tools.harness import cuda_timing  # noqa: E402
from tools.harness.loading import load  # noqa: E402

MODELS = {  # K1, N1, N2 (the paper's MLP problem sizes)
    "llama70b": (8192, 28672, 8192),
    "granite20b": (6144, 24576, 6144),
    "tiny": (256, 1024, 256),
}
BACKENDS = ("torch-dequant", "qcompile")


def eager_calls(mlp, x, iterations: int):
    """A function that makes ``iterations`` back-to-back calls of ``mlp(x)``."""
    def run():
        for _ in range(iterations):
            mlp(x)
    return run


def graphed_calls(mlp, x, iterations: int):
    """``iterations`` calls of ``mlp(x)`` captured in one CUDA graph (every rank captures its
    own, collectives included): its replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            mlp(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iterations):
            mlp(x)
    torch.cuda.synchronize()
    return graph.replay


def time_calls(run, iterations: int, synchronize) -> float:
    """Seconds per MLP call of ``run`` (``iterations`` calls), all ranks started together."""
    import torch.distributed as dist

    dist.barrier()
    synchronize()
    start = time.perf_counter()
    run()
    synchronize()
    return (time.perf_counter() - start) / iterations


def in_turns(build, rank: int, size: int):
    """``build()`` on one rank at a time: the ranks share one kernel cache directory, and a
    kernel one rank builds is then loaded, not built again, by the next."""
    import torch.distributed as dist

    result = None
    for turn in range(size):
        if turn == rank:
            result = build()
        dist.barrier()
    return result


def main(argv=None) -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama70b,granite20b")
    parser.add_argument("--rows", default="1,2,4,8,16", help="batch sizes M")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"local GEMMs, comma-separated: {', '.join(BACKENDS)}")
    parser.add_argument("--target", help="qcompile backend's preset (default: cuda on a GPU, "
                                         "else avx2)")
    parser.add_argument("--db", default=None, help="tuning database URL (qcompile backend)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="qcompile backend's activations (default: float16 on a GPU, "
                             "else float32)")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-graphs", action="store_true",
                        help="time eager calls on GPUs instead of CUDA-graph replays")
    parser.add_argument("--build-only", action="store_true",
                        help="build the qcompile kernels of --tp's sizes, then stop")
    parser.add_argument("--tp", default="1,2", help="TP sizes --build-only builds for")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                        help="--build-only's build processes")
    parser.add_argument("--profile", default="", metavar="ROWS",
                        help="batch sizes M (comma-separated) whose rows also record each "
                             "algorithm's GPU time per kernel (torch.profiler over one timed "
                             "run); rank 0 prints its own")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    if unknown := [b for b in backends if b not in BACKENDS]:
        parser.error(f"--backends: unknown {unknown}; choose from {list(BACKENDS)}")
    if unknown := [m for m in args.models.split(",") if m not in MODELS]:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")

    cuda = torch.cuda.is_available()
    target = args.target or ("cuda" if cuda else "avx2")
    kernel_dtype = args.dtype or ("float16" if cuda else "float32")
    if args.build_only:
        return build_only(args, target, kernel_dtype)
    if "qcompile" in backends and targets.get(target).kind != ("cuda" if cuda else "cpu"):
        parser.error(f"--target {target} runs on a {targets.get(target).kind} device; this "
                     f"host's tensors are on {'cuda' if cuda else 'cpu'}")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    fallback_dtype = torch.float16 if cuda else torch.float32
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"

    origins = []  # where each qcompile kernel came from (tuned record, untuned heuristic)

    def kernel_of(spec):
        kernel, origin = load(spec, target, db=args.db)
        origins.append(origin["source"])
        return kernel

    def build_mlps(shards, make_linear):
        return {name: TensorParallelMLP(s, make_linear).to(device) for name, s in shards.items()}

    shared = {}  # each shard's padded layer and packed weights, made once for every M

    def kernel_linear(rows):
        return lambda shard: KernelLinear(shard, kernel_of, rows, kernel_dtype, shared)

    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    for model in args.models.split(","):
        k1, n1, n2 = MODELS[model]
        layers = model_layers(model, args.bits, args.group_size)  # the same on every rank
        shards = {algorithm: shard_mlp(layers, rank, size, algorithm) for algorithm in ALGORITHMS}
        shared.clear()  # keyed by the shards' ids: none of another model's may stay
        del layers
        for backend in backends:
            if backend == "torch-dequant":
                fallback = build_mlps(
                    shards, lambda shard: TorchDequantLinear(shard, fallback_dtype, device))
            for rows in rows_list:
                if backend == "torch-dequant":
                    mlps, dtype, kernels = fallback, fallback_dtype, None
                    local_gemm = f"torch-dequant {str(dtype).removeprefix('torch.')}"
                else:
                    origins.clear()
                    specs = [shard_spec(shard, rows, kernel_dtype, shared)
                             for s in shards.values() for shard in (s.up, s.gate, s.down)
                             if shard is not None]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the row says "untuned" instead
                        # kernels built (where missing) one rank at a time, then every rank
                        # packs its weights at once from the kernels it holds
                        in_turns(lambda specs=specs: [kernel_of(spec) for spec in specs],
                                 rank, size)
                        mlps = build_mlps(shards, kernel_linear(rows))
                    dtype = getattr(torch, kernel_dtype)
                    local_gemm = f"qcompile {target} {kernel_dtype}"
                    kernels = sorted(set(origins))
                row = run_row(mlps, rows, k1, dtype, device, args, synchronize)
                row = {"model": model, "K1": k1, "N1": n1, "N2": n2, "tp": size, "M": rows,
                       "backend": backend, **row, "device": device_name,
                       "local_gemm": local_gemm, "kernels": kernels}
                results.append(row)
                if rank == 0:
                    print(describe(row), flush=True)
                    for name, kernels in row.get("profile_us", {}).items():
                        print(f"    {name} GPU us per call: " + "; ".join(
                            f"{kernel} {us:.1f}" for kernel, us in kernels.items()), flush=True)
                    if args.json:  # after every row: a run cut short keeps what it measured
                        write_json(args.json, results)
            if backend == "torch-dequant":
                del fallback
    if rank == 0:
        for model in args.models.split(","):
            for backend in backends:
                mine = [r for r in results if r["model"] == model and r["backend"] == backend]
                means = "  ".join(
                    f"{name} {statistics.mean(r[f'{name}_speedup'] for r in mine):.2f}x"
                    for name in ALGORITHMS[1:])
                print(f"{model:10s} TP={size} {backend:13s} mean speedup over naive: {means}")
    dist.destroy_process_group()
    return 0


def write_json(path: str, results: list[dict]) -> None:
    """The rows so far, replacing the file whole (written beside it, then renamed)."""
    partial_path = f"{path}.part"
    with open(partial_path, "w") as handle:
        json.dump(results, handle, indent=2)
    os.replace(partial_path, path)


def run_row(mlps: dict, rows: int, k1: int, dtype, device, args, synchronize) -> dict:
    """Check every algorithm against the naive one, then time them: medians in ms, speedups
    over naive, and the largest relative difference of an output from the naive one."""
    import torch

    x = torch.randn(rows, k1, generator=torch.Generator().manual_seed(rows)).to(
        device=device, dtype=dtype)
    outputs = {name: mlp(x).float() for name, mlp in mlps.items()}  # warm-up, and a check
    scale = float(outputs["naive"].abs().max())
    difference = max(float((outputs[name] - outputs["naive"]).abs().max()) / scale
                     for name in ALGORITHMS)
    method = "eager"
    runs = {name: eager_calls(mlp, x, args.iterations) for name, mlp in mlps.items()}
    if device.type == "cuda" and not args.no_graphs:
        runs = {name: graphed_calls(mlp, x, args.iterations) for name, mlp in mlps.items()}
        method = "cuda-graph"
    timings = {name: [] for name in ALGORITHMS}
    for repeat in range(args.repeats):
        shift = repeat % len(ALGORITHMS)
        for name in ALGORITHMS[shift:] + ALGORITHMS[:shift]:
            timings[name].append(time_calls(runs[name], args.iterations, synchronize))
    ms = {name: statistics.median(timings[name]) * 1e3 for name in ALGORITHMS}
    row = {**{f"{name}_ms": ms[name] for name in ALGORITHMS},
           **{f"{name}_speedup": ms["naive"] / ms[name] for name in ALGORITHMS[1:]},
           "max_rel_difference": difference, "timing": method}
    if device.type == "cuda" and str(rows) in args.profile.split(","):
        row["profile_us"] = {name: kernel_times(runs[name], args.iterations, synchronize)
                             for name in ALGORITHMS}
    return row


def kernel_times(run, iterations: int, synchronize) -> dict:
    """{kernel name: GPU microseconds per MLP call} over one ``run`` of ``iterations`` calls
    (:func:`tools.harness.cuda_timing.kernel_times`, all ranks started together), longest
    first, with "all kernels": their sum. What the call's median leaves beyond that sum is
    launch gaps and time the GPU waits (for a collective's peer, say)."""
    import torch.distributed as dist

    dist.barrier()
    kernels = cuda_timing.kernel_times(run, iterations, synchronize)
    ordered = {name[:120]: us for name, us in sorted(kernels.items(), key=lambda i: -i[1])}
    return {"all kernels": sum(ordered.values()), **ordered}


def model_layers(model: str, bits: int, group_size: int) -> MlpLayers:
    """The synthetic act_order MLP of ``model``, seeded: the same layers on every rank and in
    every process (so --build-only finds the same g_idx, and the same padded shards)."""
    k1, n1, n2 = MODELS[model]
    rng = np.random.default_rng(0)
    return MlpLayers(up=random_act_order_layer(k1, n1, bits, group_size, rng),
                     down=random_act_order_layer(n1, n2, bits, group_size, rng))


def rank_specs(model: str, size: int, rank: int, bits: int, group_size: int,
               rows_list: list[int], dtype: str) -> set:
    """The kernel specs one rank of a TP ``size`` job runs for ``model``: its up and down
    shards for every algorithm, at every M of ``rows_list``."""
    layers = model_layers(model, bits, group_size)
    specs = set()
    for algorithm in ALGORITHMS:
        shards = shard_mlp(layers, rank, size, algorithm)
        shared = {}  # each shard's padded layer, made once for every M
        specs |= {shard_spec(s, rows, dtype, shared) for s in (shards.up, shards.down)
                  for rows in rows_list}
    return specs


def _build_one(target: str, db: str | None, spec) -> str:
    kernel, origin = load(spec, target, db=db)
    return f"{spec.name()}: {origin['source']}"


def build_only(args, target: str, dtype: str) -> int:
    """Build (or find built) every kernel that --models, --rows and the TP sizes of --tp run,
    in ``--jobs`` processes: first each (model, TP size, rank)'s specs (sharding the layers,
    the slow part), then the kernels."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rows_list = [int(r) for r in args.rows.split(",")]
    tasks = [(model, size, rank) for model in args.models.split(",")
             for size in (int(v) for v in args.tp.split(",")) for rank in range(size)]
    started = time.perf_counter()
    # spawned, not forked: the parent has initialized CUDA, and each child loads what it builds
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(rank_specs, model, size, rank, args.bits, args.group_size,
                               rows_list, dtype) for model, size, rank in tasks]
        specs = sorted(set().union(*(future.result() for future in futures)),
                       key=lambda spec: spec.name())
        print(f"building {len(specs)} kernels for TP {args.tp} in {args.jobs} processes "
              f"(specs in {time.perf_counter() - started:.0f} s)", flush=True)
        for line in pool.map(partial(_build_one, target, args.db), specs):
            print(f"  {line}", flush=True)
    print(f"built in {time.perf_counter() - started:.0f} s")
    return 0


def describe(row: dict) -> str:
    """One printed line: every algorithm's median and its speedup over the naive one."""
    times = "  ".join(f"{name} {row[f'{name}_ms']:7.3f} ms"
                      + (f" ({row[f'{name}_speedup']:.2f}x)" if name != "naive" else "")
                      for name in ALGORITHMS)
    kernels = f" [{', '.join(row['kernels'])}]" if row["kernels"] else ""
    return (f"{row['model']:10s} TP={row['tp']} M={row['M']:2d} {row['backend']:13s} {times}  "
            f"(outputs agree to {row['max_rel_difference']:.1e}){kernels}")


if __name__ == "__main__":
    sys.exit(main())
