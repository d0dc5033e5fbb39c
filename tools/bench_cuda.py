"""H200 benchmark of the uniform family's CUDA kernels, in one run: the GPU's copy bandwidth, then
4-bit g=128 kernels at each shape and M against fp16 ``torch.nn.functional.linear`` and PyTorch's
int4 GPU kernel (``torch._weight_int4pack_mm``, bfloat16 activations), at the same shape.

Every implementation is timed the same way: a CUDA graph of back-to-back calls (so launch gaps
and Python overhead stay out: these kernels run for microseconds), its weights rotating among
enough copies to exceed the L2 cache three times (so weights come from HBM, as in a model),
replayed in interleaved rounds; the table gives medians. Each kernel's output is checked against
a float64 reference first (random codes, zero-points and scales; never zeros).

``--activations float32,int8`` adds the int8-activation kernels (x rounded to int8 per row
and group inside the call, ``dp4a`` dot products: compute_cuda_int8.py); their error is given
against the float64 product of the int8-rounded x (what they compute) and against float x.

Kernels come from the tuning database (``--db``, the best record of each workload), else from
``--so-dir`` (libraries exported elsewhere, e.g. on a machine without a GPU), else are built
untuned from the design space's heuristic; the JSON says which, per workload.

    python tools/bench_cuda.py --db sqlite:////tmp/qc/tuning.sqlite \\
        --json tools/results/cuda_h200.json --png tools/results/cuda_h200.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.cli import parse_shape
from qcompile.errors import NoRecordError
from qcompile.formats import bitpack
from qcompile.formats.gptq import GptqTensors, pack_zeros, trivial_g_idx
from qcompile.kernels import UniformSpec, family_of
from qcompile.kernels.uniform.compute_int8 import quantized_activations
from tuning_db import Storage

SHAPES = "4096x4096,8192x8192,8192x28672,28672x8192"
BATCHES = "1,4,16"
GRAPH_MS = 2.0          # GPU time per graph replay
INT4_INNER_K_TILES = 8  # torch's int4 layout: K must be a multiple of 16 * this


def random_layer(spec: UniformSpec, rng: np.random.Generator) -> GptqTensors:
    """GPTQ tensors with uniformly random codes and zero-points, scales in [0.005, 0.015)."""
    codes = rng.integers(0, 1 << spec.bits, size=(spec.k, spec.n), dtype=np.int64)
    zeros = rng.integers(0, 1 << spec.bits, size=(spec.groups, spec.n), dtype=np.int64)
    scales = (0.005 + 0.01 * rng.random((spec.groups, spec.n))).astype(np.float16)
    return GptqTensors(qweight=bitpack.pack(codes, spec.bits), scales=scales,
                       qzeros=pack_zeros(zeros, spec.bits, "v1"),
                       g_idx=trivial_g_idx(spec.k, spec.group_size), bits=spec.bits,
                       group_size=spec.group_size, in_features=spec.k, out_features=spec.n)


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> dict:
    """Device-to-device copy of ``nbytes``: median TB/s counting bytes read plus written."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    seconds = statistics.median(times)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "median_us": seconds * 1e6, "tbps": 2 * nbytes / seconds / 1e12}


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """Copies of a weight set so that one pass over them is at least three L2s."""
    return max(1, math.ceil(3 * l2_bytes / max(nbytes, 1)))


class Timed:
    """One implementation: calls rotating over weight copies, captured in a CUDA graph."""

    def __init__(self, name: str, calls: list, bytes_read: int) -> None:
        self.name = name
        self.calls = calls
        self.bytes_read = bytes_read
        self.graph = None
        self.per_graph = 0
        self.method = "cuda-graph"
        self.samples: list[float] = []

    def prepare(self) -> None:
        self.warm()
        self.capture()

    def warm(self) -> None:
        """Call everything twice (module loads, handles, autotuning, workspace pools)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):         # warm-up: module loads, handles, autotuning
            for call in self.calls * 2:
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def capture(self) -> None:
        """Estimate a call's time and capture enough calls for a sample in one CUDA graph."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for call in self.calls:
            call()
        end.record()
        end.synchronize()
        estimate_ms = max(start.elapsed_time(end) / len(self.calls), 1e-3)
        self.per_graph = max(len(self.calls), int(GRAPH_MS / estimate_ms))
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(self.per_graph):
                    self.calls[i % len(self.calls)]()
            self.graph = graph
        except Exception as error:  # noqa: BLE001 - record why, time eagerly instead
            self.method = f"eager (graph capture failed: {str(error).splitlines()[0][:120]})"
            torch.cuda.synchronize()

    def sample(self) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if self.graph is not None:
            self.graph.replay()
        else:
            for i in range(self.per_graph):
                self.calls[i % len(self.calls)]()
        end.record()
        end.synchronize()
        self.samples.append(start.elapsed_time(end) * 1e3 / self.per_graph)

    def result(self) -> dict:
        us = statistics.median(self.samples)
        return {"median_us": us, "tbps": self.bytes_read / (us * 1e-6) / 1e12,
                "bytes_read": self.bytes_read, "calls_per_sample": self.per_graph,
                "samples": len(self.samples), "method": self.method}


def prepare_all(timed: list[Timed]) -> None:
    """Warm every item up, then capture each one's graph.

    TVM functions take their scratch buffers (partial sums over K slices) from a workspace pool
    that frees a buffer to allocate a larger one, so a graph captured before a later kernel's
    first, larger request would replay into freed memory. Once every kernel has run, the pool
    holds its largest buffer and every capture reuses it (the graphs replay one at a time)."""
    for item in timed:
        item.warm()
    for item in timed:
        item.capture()


def load_kernel(spec: UniformSpec, preset, args, out_dir: Path):
    """(Kernel, where it came from): the database's best record, a prebuilt .so, or untuned."""
    if args.db:
        try:
            result = build(spec, preset, out_dir, storage=Storage(args.db))
            return qcompile.load(result.so_path), {"source": "tuned", "record": result.record_id,
                                                   "tuned_us": result.tuned_us}
        except NoRecordError:
            pass
    if args.so_dir:
        so = Path(args.so_dir) / f"{spec.name()}.so"
        if so.exists():
            return qcompile.load(so), {"source": "prebuilt", "path": str(so)}
    result = build_untuned(spec, preset, out_dir)
    return qcompile.load(result.so_path), {"source": "untuned heuristic"}


def int4_weights(layer: GptqTensors, device: str):
    """PyTorch int4 operands for the same weights: packed codes and bf16 (scale, zero) pairs.

    torch dequantizes ``(q - 8) * scale + zero``; GPTQ's ``(q - z) * s`` is that with
    ``zero = (8 - z) * s``.
    """
    codes = torch.from_numpy(layer.codes().T.astype(np.uint8)).to(device)        # [N, K]
    packed = (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()
    weight = torch._convert_weight_to_int4pack(packed, INT4_INNER_K_TILES)
    scales = torch.from_numpy(layer.scales.astype(np.float32))
    zeros = (8 - torch.from_numpy(layer.zeros().astype(np.float32))) * scales
    pairs = torch.stack([scales, zeros], dim=2).to(torch.bfloat16).contiguous().to(device)
    return weight, pairs


def bench_workload(spec: UniformSpec, preset, args, copy: dict, layer: GptqTensors,
                   weight: torch.Tensor, out_dir: Path) -> dict:
    """Check and time one (shape, M); ``weight`` is ``layer`` dequantized, fp32 [K, N] on GPU."""
    family = family_of(spec)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    kernel, origin = load_kernel(spec, preset, args, out_dir)
    x = torch.randn(spec.m, spec.k, device="cuda")
    reference = (x.double() @ weight.double()).float()
    scale = reference.abs().max().item()
    row = {"name": spec.name(), "k": spec.k, "n": spec.n, "m": spec.m, "kernel": origin,
           "activations": "int8" if spec.int8_activations else "float32"}

    prepared = kernel.prepare(qweight=layer.qweight, scales=layer.scales, qzeros=layer.qzeros)
    y = torch.full((spec.m, spec.n), float("nan"), device="cuda")
    kernel.function(x, *prepared.tensors, y)
    if spec.int8_activations:  # exact up to float32 sums against the x it multiplies
        x_hat = torch.from_numpy(quantized_activations(x.cpu().numpy(), spec.group_size))
        computed = (x_hat.cuda() @ weight.double()).float()
        row["max_rel_error_vs_float_x"] = (y - reference).abs().max().item() / scale
        row["max_rel_error"] = (y - computed).abs().max().item() / scale
    else:
        row["max_rel_error"] = (y - reference).abs().max().item() / scale
    ours_copies = [prepared.tensors] + [tuple(t.clone() for t in prepared.tensors) for _ in
                                        range(copies_for(prepared.nbytes(), l2) - 1)]
    impls = [Timed("qcompile", [lambda w=w: kernel.function(x, *w, y) for w in ours_copies],
                   family.bytes_read(spec))]

    w16 = weight.T.contiguous().half()                                          # [N, K]
    x16 = x.half()
    w16_copies = [w16] + [w16.clone() for _ in range(copies_for(w16.nbytes, l2) - 1)]
    impls.append(Timed("fp16_linear", [lambda w=w: torch.nn.functional.linear(x16, w)
                                       for w in w16_copies], 2 * spec.k * spec.n + 2 * x.numel()))
    row["fp16_max_rel_error"] = (torch.nn.functional.linear(x16, w16).float() - reference
                                 ).abs().max().item() / scale

    try:
        w4, pairs = int4_weights(layer, "cuda")
        xb = x.bfloat16()
        out = torch._weight_int4pack_mm(xb, w4, spec.group_size, pairs)
        row["int4_max_rel_error"] = (out.float() - reference).abs().max().item() / scale
        int4_bytes = w4.nbytes + pairs.nbytes
        w4_copies = [w4] + [w4.clone() for _ in range(copies_for(int4_bytes, l2) - 1)]
        impls.append(Timed("torch_int4", [
            lambda w=w: torch._weight_int4pack_mm(xb, w, spec.group_size, pairs)
            for w in w4_copies], int4_bytes + 2 * x.numel()))
    except Exception as error:  # noqa: BLE001 - an API change must not lose the other numbers
        row["int4_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"

    for impl in impls:
        impl.prepare()
    for _ in range(args.rounds):
        for impl in impls:
            impl.sample()
    results = {impl.name: impl.result() for impl in impls}
    row.update(results)
    ours = results["qcompile"]["median_us"]
    row["speedup_vs_fp16_linear"] = results["fp16_linear"]["median_us"] / ours
    if "torch_int4" in results:
        row["speedup_vs_torch_int4"] = results["torch_int4"]["median_us"] / ours
    row["fraction_of_copy_bandwidth"] = results["qcompile"]["tbps"] / copy["tbps"]
    del impls, ours_copies, w16_copies, prepared
    torch.cuda.empty_cache()
    return row


def line(row: dict) -> str:
    """One table line of a workload's results."""
    nan = float("nan")
    int4 = row.get("torch_int4", {}).get("median_us", nan)
    return (f"{row['k']:6d}x{row['n']:<6d} M={row['m']:<3d} "
            f"{'x int8 ' if row.get('activations') == 'int8' else ''}qcompile "
            f"{row['qcompile']['median_us']:8.1f} us {row['qcompile']['tbps']:5.2f} TB/s | "
            f"fp16 {row['fp16_linear']['median_us']:8.1f} us "
            f"({row['speedup_vs_fp16_linear']:.2f}x) | int4 {int4:8.1f} us "
            f"({row.get('speedup_vs_torch_int4', nan):.2f}x) | err {row['max_rel_error']:.1e} | "
            f"{row['kernel']['source']}")


def done_when(rows: list[dict]) -> list[str]:
    """The issue's acceptance lines, each PASS or FAIL with its numbers."""
    lines = []
    for activations in sorted({r.get("activations", "float32") for r in rows}):
        ours = [r for r in rows if r.get("activations", "float32") == activations]
        lines += _shape_goals({(r["k"], r["n"], r["m"]): r for r in ours}, f"x {activations}")
        slower = [r["name"] for r in ours if r.get("speedup_vs_torch_int4", 0) <= 1.0]
        lines.append(f"{'PASS' if not slower else 'FAIL'} faster than torch int4 everywhere "
                     f"(x {activations})" + (f" (not: {', '.join(slower)})" if slower else ""))
    wrong = [r["name"] for r in rows if not r["max_rel_error"] < 1e-4]
    lines.append(f"{'PASS' if not wrong else 'FAIL'} outputs match the float64 reference "
                 f"(max rel error < 1e-4)" + (f" (not: {', '.join(wrong)})" if wrong else ""))
    return lines


def _shape_goals(by: dict, label: str) -> list[str]:
    """The issue's two goals on 8192x28672, for the kernels of one activation dtype."""
    lines = []
    one = by.get((8192, 28672, 1))
    if one:
        ok = one["speedup_vs_fp16_linear"] >= 3.3 and one["fraction_of_copy_bandwidth"] >= 0.75
        lines.append(f"{'PASS' if ok else 'FAIL'} 8192x28672 M=1 ({label}): "
                     f"{one['speedup_vs_fp16_linear']:.2f}x fp16 linear (>= 3.3), "
                     f"{one['fraction_of_copy_bandwidth']:.0%} of copy bandwidth (>= 75%)")
    sixteen = by.get((8192, 28672, 16))
    if sixteen:
        ok = sixteen["speedup_vs_fp16_linear"] >= 2.5
        lines.append(f"{'PASS' if ok else 'FAIL'} 8192x28672 M=16 ({label}): "
                     f"{sixteen['speedup_vs_fp16_linear']:.2f}x fp16 linear (>= 2.5)")
    return lines


def plot(rows: list[dict], copy: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['k']}x{r['n']}\nM={r['m']}"
              + ("\nx int8" if r.get("activations") == "int8" else "") for r in rows]
    xs = np.arange(len(rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, len(rows) * 0.9), 8), sharex=True)
    top.bar(xs - 0.2, [r["speedup_vs_fp16_linear"] for r in rows], 0.4, label="vs fp16 linear")
    top.bar(xs + 0.2, [r.get("speedup_vs_torch_int4", 0) for r in rows], 0.4,
            label="vs torch int4 (bf16)")
    top.axhline(1.0, color="black", linewidth=0.8)
    top.set_ylabel("speedup of qcompile 4-bit")
    top.legend()
    bottom.bar(xs, [r["qcompile"]["tbps"] for r in rows], 0.5, label="qcompile (bytes read)")
    bottom.axhline(copy["tbps"], color="black", linestyle="--",
                   label=f"copy bandwidth {copy['tbps']:.2f} TB/s")
    bottom.axhline(0.75 * copy["tbps"], color="gray", linestyle=":", label="75% of copy")
    bottom.set_ylabel("effective TB/s")
    bottom.set_xticks(xs, labels, fontsize=8)
    bottom.legend()
    fig.suptitle(f"4-bit g=128 on {torch.cuda.get_device_name(0)}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--db", metavar="URL", help="tuning database with the tuned records")
    parser.add_argument("--so-dir", help="prebuilt kernels (<name>.so + manifest) to use instead")
    parser.add_argument("--shapes", default=SHAPES, help=f"KxN list (default {SHAPES})")
    parser.add_argument("--batches", default=BATCHES, help=f"M list (default {BATCHES})")
    parser.add_argument("--activations", default="float32",
                        help="float32, int8 or both (comma-separated; default float32)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--png", metavar="PATH", help="write a plot (needs matplotlib)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    preset = targets.get(args.target)
    rng = np.random.default_rng(0)
    props = torch.cuda.get_device_properties(0)
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {copy['tbps']:.2f} TB/s "
          f"(read + write, {copy['bytes'] >> 20} MiB)", flush=True)
    rows = []
    out_dir = Path(tempfile.mkdtemp(prefix="qcompile-bench-cuda-"))
    started = time.monotonic()
    for k, n in (parse_shape(s) for s in args.shapes.split(",")):
        layer = random_layer(UniformSpec(k=k, n=n), rng)
        weight = torch.from_numpy(layer.dequantize()).cuda()
        for m in (int(v) for v in args.batches.split(",")):
            for activations in args.activations.split(","):
                spec = UniformSpec(k=k, n=n, bits=4, group_size=128, m=m,
                                   int8_activations=activations == "int8")
                row = bench_workload(spec, preset, args, copy, layer, weight, out_dir)
                rows.append(row)
                print(line(row), flush=True)
        del layer, weight
        torch.cuda.empty_cache()
    verdict = done_when(rows)
    print("\n".join(verdict))
    result = {
        "device": torch.cuda.get_device_name(0), "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size, "torch": torch.__version__,
        "cuda": torch.version.cuda, "qcompile": qcompile.__version__, "target": preset.name,
        "copy_bandwidth": copy, "rounds": args.rounds, "workloads": rows, "done_when": verdict,
        "seconds": time.monotonic() - started,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        try:
            plot(rows, copy, args.png)
        except ImportError:
            print("bench_cuda: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
