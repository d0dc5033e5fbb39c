"""CPU GEMV benchmark: our uniform kernels against the memory bandwidth and PyTorch's kernels.

In one run:

1. the machine's streaming-read bandwidth (qcompile/bandwidth.py: a >= 512 MiB float32 buffer
   read with vector loads by every thread, TVM loop and torch.sum, the larger counts), for each
   thread count, up front; and again for every shape, as one more entry of the interleaved rounds
   below (the TVM read loop), so that the denominator of each row is measured under the same
   machine load as its kernels (this machine is shared: its load moves within minutes);
2. for every shape (K x N), thread count, bit width (2/3/4), group size (128, -1) and activation
   kind (float32, and int8: the integer dot-product kernel, compute_int8.py): our kernel
   (the database's best record, or the QIGen model's point when the spec has none: the JSON says
   which), fp32 ``torch.mv`` on the dequantized weight and PyTorch's own int4 CPU kernel
   (``torch.ops.aten._weight_int4pack_mm_for_cpu``, bfloat16 activations, g=128) at the same
   shape, timed in interleaved rounds (every kernel once per round, in blocks of ~30 ms after
   untimed warm-up calls) so that machine noise hits all alike;
3. medians, effective GB/s (every byte our kernel must read: codes, scales, zero-points, x),
   the fraction of the measured bandwidth, the ratios to both peers, the error against the float64
   reference (int8 rows: the rounding of x to 8 bits) and the issue's "Done when" checks; JSON
   (--json) and a PNG plot (--plot, needs matplotlib: pip install -e '.[bench]').

    python tools/bench_cpu.py --target avx2 --json bench_cpu.json --plot bench_cpu.png
    python tools/bench_cpu.py --shapes 4096x4096 --bits 4 --group-sizes 128 --threads 2  # quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_uniform import time_calls  # tools/ is sys.path[0] when a tool runs

import qcompile
import targets
from qcompile import _tvm, bandwidth
from qcompile.build import build, build_untuned
from qcompile.cli import parse_shape
from qcompile.errors import NoRecordError
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.uniform.spec import INT8_BITS
from tuning_db import Storage

FAMILY = get_family("uniform")
SHAPES = ("4096x4096", "4096x11008", "11008x4096", "8192x28672")
WARMUP_CALLS = 2
BLOCK_SECONDS = 0.03
INT4_GROUP = 128
ACTIVATIONS = ("float32", "int8")


def kernel_for(spec, preset, storage, out_dir):
    """(loaded kernel, source): the best tuned record, else the model's point."""
    try:
        result = build(spec, preset, out_dir, storage=storage)
        source = f"tuned record {result.record_id} ({result.tuned_us:.1f} us when tuned)"
    except NoRecordError:
        result = build_untuned(spec, preset, out_dir)
        source = "QIGen model point (untuned)"
    return qcompile.load(result.so_path), source


def our_runner(kernel, spec, seed: int):
    """A zero-argument call of the compiled function on prepared random weights."""
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = kernel.prepare(**tensors)
    x = torch.from_numpy(rng.standard_normal((1, spec.k)).astype(np.float32))
    y = torch.empty((1, spec.n), dtype=torch.float32)
    # Correctness in this very run: the kernel we time computes the layer.
    reference = FAMILY.reference(spec, x.numpy(), **tensors)
    kernel.function(x, *weights.tensors, y)
    error = float(np.abs(y.numpy() - reference).max() / np.abs(reference).max())
    args = (x, *weights.tensors, y)
    return (lambda: kernel.function(*args)), error


def peer_runners(k: int, n: int, seed: int):
    """fp32 torch.mv on an [N, K] weight and torch's int4 kernel (bf16 x, g=128) at K x N."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn((n, k), generator=gen, dtype=torch.float32)
    x = torch.randn(k, generator=gen, dtype=torch.float32)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    del codes
    scales_zeros = torch.randn((k // INT4_GROUP, n, 2), generator=gen).to(torch.bfloat16)
    xb = x.to(torch.bfloat16).reshape(1, k)
    return {
        "torch_mv_fp32": lambda: torch.mv(dense, x),
        "torch_int4_bf16": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            xb, packed, INT4_GROUP, scales_zeros),
    }


def interleaved(runners: dict, rounds: int) -> dict:
    """Median seconds per call of each runner, timed round-robin in ~30 ms blocks."""
    calls = {name: max(3, int(BLOCK_SECONDS / max(time_calls(fn, 2, warmup=WARMUP_CALLS), 1e-7)))
             for name, fn in runners.items()}
    samples = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            samples[name].append(time_calls(fn, calls[name], warmup=WARMUP_CALLS))
    return {name: statistics.median(values) for name, values in samples.items()}


def done_when(rows: list[dict], preset_name: str, host_lacks: str | None) -> list[dict]:
    """The issue's acceptance checks on these measurements (2 threads)."""
    def find(shape, bits, group, activations="float32"):
        return next((r for r in rows if r["shape"] == shape and r["bits"] == bits
                     and r["group_size"] == group and r["threads"] == 2
                     and r["activations"] == activations), None)

    checks = []
    for shape in SHAPES:
        row = find(shape, 4, 128)
        if row:
            checks.append({"check": f"4-bit g128 {shape} {preset_name}: no slower than torch int4",
                           "value": row["speedup_vs_torch_int4"], "holds":
                           row["speedup_vs_torch_int4"] >= 1.0})
    for activations in ACTIVATIONS:
        row = find("8192x28672", 4, 128, activations)
        if not row or (activations != "float32" and preset_name != "avx512"):
            continue
        check = {"check": f"4-bit g128 8192x28672 avx512, {activations} activations: >= 80% of "
                 "bandwidth and >= 1.1x torch int4"}
        if preset_name != "avx512" or host_lacks:
            checks.append({**check, "value": None, "holds": None,
                           "note": f"not measurable here: {host_lacks}" if host_lacks else
                           "run with --target avx512"})
            continue
        checks.append({**check, "value": [row["fraction_of_bandwidth"],
                                          row["speedup_vs_torch_int4"]],
                       "holds": row["fraction_of_bandwidth"] >= 0.8
                       and row["speedup_vs_torch_int4"] >= 1.1})
    for bits in (3, 2):
        for activations in ACTIVATIONS:
            row = find("8192x28672", bits, 128, activations)
            if row:
                checks.append({"check": f"{bits}-bit g128 8192x28672, {activations} activations:"
                               " >= 75% of bandwidth",
                               "value": row["fraction_of_bandwidth"],
                               "holds": row["fraction_of_bandwidth"] >= 0.75,
                               "note": f"(max relative error {row['max_rel_error']:.1e})"})
    return checks


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["threads"] == max(result["threads"])]
    shapes = [s for s in result["shapes"] if any(r["shape"] == s for r in rows)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    configs = sorted({(r["bits"], r["group_size"], r["activations"]) for r in rows},
                     key=lambda c: (c[1] < 0, c[2], c[0]))
    width = 0.8 / max(1, len(configs))
    for i, (bits, group, activations) in enumerate(configs):
        values = [next((r["fraction_of_bandwidth"] for r in rows if r["shape"] == s and
                        r["bits"] == bits and r["group_size"] == group and
                        r["activations"] == activations), 0) for s in shapes]
        label = f"{bits}-bit g{'col' if group == -1 else group} x {activations}"
        left.bar(np.arange(len(shapes)) + i * width, values, width, label=label,
                 hatch=("//" if group == -1 else "") + (".." if activations == "int8" else ""))
    left.axhline(1.0, color="black", linewidth=0.8)
    left.axhline(0.75, color="grey", linestyle="--", linewidth=0.8)
    left.set_xticks(np.arange(len(shapes)) + width * (len(configs) - 1) / 2, shapes)
    left.set_ylabel("fraction of measured read bandwidth")
    left.set_title(f"{result['target']}, {max(result['threads'])} threads; bandwidth measured "
                   "in the same rounds", fontsize=10)
    left.legend(fontsize=8)
    for j, threads in enumerate(result["threads"]):
        four = [next((r for r in result["rows"] if r["shape"] == s and r["bits"] == 4 and
                      r["activations"] == "float32" and
                      r["group_size"] == 128 and r["threads"] == threads), None) for s in shapes]
        right.bar(np.arange(len(shapes)) + j * 0.2, [r["speedup_vs_torch_int4"] if r else 0
                                                     for r in four], 0.2,
                  label=f"vs torch int4, {threads} thr")
        right.bar(np.arange(len(shapes)) + (j + len(result["threads"])) * 0.2,
                  [r["speedup_vs_torch_mv"] if r else 0 for r in four], 0.2,
                  label=f"vs fp32 torch.mv, {threads} thr")
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks(np.arange(len(shapes)) + 0.3, shapes)
    right.set_ylabel("speedup (x)")
    right.set_title("4-bit g128: speedup over PyTorch")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=["avx2", "avx512"])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="KxN,KxN,...")
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--group-sizes", default="128,-1")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--activations", default=",".join(ACTIVATIONS),
                        help="float32 and/or int8 (the integer dot-product kernel)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--bandwidth-mib", type=int, default=1024)
    parser.add_argument("--db", help="tuning database URL (default: $QCOMPILE_DB or the cache)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH", help="PNG of the results (needs matplotlib)")
    args = parser.parse_args(argv)

    preset = targets.get(args.target)
    supported, reason = preset.host_support()
    if not supported:
        print(f"target {args.target} cannot run here: {reason}", file=sys.stderr)
        return 2
    hw = preset.hardware()
    target = _tvm.Target(preset.tvm_target(hw))
    shapes = [s.strip() for s in args.shapes.split(",")]
    bit_widths = [int(b) for b in args.bits.split(",")]
    groups = [int(g) for g in args.group_sizes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    activation_kinds = [a.strip() for a in args.activations.split(",")]
    unknown = sorted(set(activation_kinds) - set(ACTIVATIONS))
    if unknown:
        parser.error(f"--activations: unknown {unknown}; known: {', '.join(ACTIVATIONS)}")
    storage = Storage(args.db)
    avx512_ok, avx512_reason = targets.get("avx512").host_support()
    started = time.monotonic()

    result = {"target": args.target, "host": _host_line(hw), "shapes": shapes,
              "threads": thread_counts, "rounds": args.rounds, "bandwidth": {},
              "bandwidth_by_shape": {}, "rows": []}
    for threads in thread_counts:
        bandwidth.set_threads(threads)
        bw = bandwidth.measure(target, threads, args.bandwidth_mib)
        result["bandwidth"][str(threads)] = bw.to_dict()
        print(f"bandwidth, {threads} thread(s): {bw.gbps:.1f} GB/s (TVM {bw.tvm_gbps:.1f}, "
              f"torch.sum {bw.torch_gbps:.1f})", flush=True)

    probes = {threads: bandwidth.ReadProbe(target, threads, args.bandwidth_mib)
              for threads in thread_counts}
    out_dir = tempfile.mkdtemp(prefix="qcompile-bench-cpu-")
    for shape in shapes:
        k, n = parse_shape(shape)
        kernels = {}
        for bits in bit_widths:
            for group in groups:
                for activations in activation_kinds:
                    if activations == "int8" and bits not in INT8_BITS:
                        continue
                    spec = UniformSpec(k=k, n=n, bits=bits, group_size=group,
                                       int8_activations=activations == "int8")
                    kernel, source = kernel_for(spec, preset, storage, out_dir)
                    runner, error = our_runner(kernel, spec, seed=bits)
                    kernels[(bits, group, activations)] = (spec, runner, error, source,
                                                           kernel.layout)
        peers = peer_runners(k, n, seed=0)
        for threads in thread_counts:
            bandwidth.set_threads(threads)
            runners = {"read_bandwidth": probes[threads], **peers}
            runners.update({f"ours_b{b}_g{g}_{a}": v[1] for (b, g, a), v in kernels.items()})
            medians = interleaved(runners, args.rounds)
            mv_us = medians["torch_mv_fp32"] * 1e6
            int4_us = medians["torch_int4_bf16"] * 1e6
            bw = probes[threads].nbytes / medians["read_bandwidth"] / 1e9
            result["bandwidth_by_shape"].setdefault(shape, {})[str(threads)] = bw
            for (bits, group, activations), (spec, _, error, source, layout) in kernels.items():
                us = medians[f"ours_b{bits}_g{group}_{activations}"] * 1e6
                gbps = FAMILY.bytes_read(spec) / (us * 1e3)
                row = {"shape": shape, "k": k, "n": n, "bits": bits, "group_size": group,
                       "activations": activations, "threads": threads, "median_us": us,
                       "effective_gbps": gbps,
                       "bytes_read": FAMILY.bytes_read(spec),
                       "bandwidth_gbps": bw,
                       "fraction_of_bandwidth": gbps / bw, "torch_mv_fp32_us": mv_us,
                       "torch_int4_bf16_g128_us": int4_us, "speedup_vs_torch_mv": mv_us / us,
                       "speedup_vs_torch_int4": int4_us / us, "max_rel_error": error,
                       "kernel": spec.name(), "source": source, "layout": layout}
                result["rows"].append(row)
                print(f"{shape:>11s} {threads}t {bits}b g{group:<4d} {activations[:4]:4s} "
                      f"{us:9.1f} us "
                      f"{gbps:6.1f} GB/s {gbps / bw:5.0%} of bw   x{mv_us / us:5.2f} vs mv "
                      f"x{int4_us / us:5.2f} vs int4   err {error:.0e}  [{source}]", flush=True)
            print(f"{shape:>11s} {threads}t torch.mv fp32 {mv_us:9.1f} us, torch int4 bf16 g128 "
                  f"{int4_us:9.1f} us, read bandwidth (same rounds) {bw:.1f} GB/s", flush=True)
        del peers, kernels

    result["done_when"] = done_when(result["rows"], args.target,
                                    None if avx512_ok else avx512_reason)
    result["elapsed_s"] = time.monotonic() - started
    for check in result["done_when"]:
        state = {True: "HOLDS", False: "FAILS", None: "n/a"}[check["holds"]]
        values = check["value"] if isinstance(check["value"], list) else [check["value"]]
        value = "" if check["value"] is None else f" ({', '.join(f'{v:.2f}' for v in values)})"
        print(f"[{state}] {check['check']}{value} {check.get('note', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


def _host_line(hw) -> str:
    from targets.host import cpu_model

    return (f"{cpu_model()}, {hw.cores} cores, L1d {hw.l1d_bytes >> 10} KiB, "
            f"L2 {hw.l2_bytes >> 10} KiB, L3 {hw.l3_bytes >> 20} MiB")


if __name__ == "__main__":
    sys.exit(main())
