"""The kernel benchmark: families x target x shapes x batches x activations, with the peers.

For every workload (a spec: family, K x N, M, bits or planes, group size, activations, and mu or
outlier share), the kernel comes through the kernel cache (the database's best record, else a
prebuilt ``--so-dir`` library, else the untuned heuristic; ``--tune-trials`` tunes what has no
record first); its output is checked against the float64 reference before anything is timed,
and so is every peer's. Then, per (K x N, M):

CPU   ours, the peers and the read-bandwidth probe in interleaved rounds of ~30 ms blocks (every
      implementation once per round, for each ``--threads``), medians;
GPU   ours and the peers as CUDA graphs of back-to-back calls, weights rotating past the L2,
      interleaved rounds, medians; the copy bandwidth once.

Rows give the median, the effective bandwidth (every byte the kernel must read) and its share of
the measured bandwidth, each peer's median and the speedup over it (ratio of medians, and the
median of per-round ratios on the CPU), and the errors. ``--preset`` sets the defaults of a past
study (tools/README.md lists them); explicit options override it.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np

from tools.harness import bandwidth as bw
from tools.harness import cli, cuda_timing, llama_cpp, peers, reference, results
from tools.harness.cpu_timing import interleaved, median, paired_ratio
from tools.harness.loading import load
from tools.harness.weights import WeightCache

FAMILIES = ("uniform", "bcq", "mixed")
#: float32 x, int8 x (the integer dot-product kernels), and x as models hand it to the GPU.
ACTIVATIONS = ("float32", "int8", "float16", "bfloat16")
CPU_SHAPES = "4096x4096,4096x11008,11008x4096,8192x28672"
CUDA_SHAPES = "4096x4096,8192x8192,8192x28672,28672x8192"
OUTLIER_SHARES = "0,0.002,0.005,0.015"

#: Defaults of past studies (the scripts they replace: tools/README.md).
PRESETS = {
    "cpu": dict(family="uniform", target="avx2", shapes=CPU_SHAPES, bits="2,3,4",
                group_sizes="128,-1", threads="1,2", activations="float32,int8", rounds=7),
    "cuda": dict(family="uniform", target="cuda", shapes=CUDA_SHAPES, batches="1,4,16",
                 bits="4", group_sizes="128", rounds=15),
    "cuda-f16": dict(family="uniform", target="cuda", shapes=CUDA_SHAPES,
                     batches="1,2,4,8,16", bits="4", group_sizes="128",
                     activations="float16,bfloat16", rounds=15),
    "bcq-cpu": dict(family="uniform,bcq", target="avx2", shapes="4096x11008,8192x28672",
                    bits="2,3,4", group_sizes="128", threads="2", rounds=9),
    "bcq-cuda": dict(family="bcq", target="cuda", shapes="7168x28672", bits="3", mus="4,8",
                     group_sizes="128", rounds=15),
    "mixed-cpu": dict(family="uniform,mixed", target="avx2", shapes="8192x28672", bits="2,4",
                      group_sizes="128", outlier_shares=OUTLIER_SHARES, rounds=9),
    "mixed-cuda": dict(family="uniform,mixed", target="cuda", shapes="8192x28672", bits="2,4",
                       group_sizes="128", outlier_shares=OUTLIER_SHARES, rounds=15),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="defaults of a past study (explicit options override them)")
    parser.add_argument("--family", default="uniform", type=cli.choices(*FAMILIES),
                        help="kernel families, comma-separated (default uniform)")
    parser.add_argument("--target", default="avx2", help="target preset (avx2, avx512, cuda...)")
    parser.add_argument("--shapes", default="4096x4096", type=cli.shapes, help="KxN,KxN,...")
    parser.add_argument("--batches", default="1", type=cli.ints, help="activation rows M list")
    parser.add_argument("--bits", default="4", type=cli.ints,
                        help="weight bits (uniform) or planes q (bcq)")
    parser.add_argument("--group-sizes", default="128", type=cli.ints,
                        help="group sizes (-1: one group per column)")
    parser.add_argument("--activations", default="float32", type=cli.choices(*ACTIVATIONS),
                        help="float32, int8 (the integer dot-product kernels), float16, "
                             "bfloat16 (x as the model hands it)")
    parser.add_argument("--mus", default="8", type=cli.ints, help="bcq: table widths mu")
    parser.add_argument("--outlier-shares", default="0.002", type=cli.floats,
                        help="mixed: fp16 outlier shares")
    parser.add_argument("--g4", type=int, default=64, help="mixed: 4-bit group size")
    parser.add_argument("--four-bit-share", type=float, default=0.25,
                        help="mixed: share of 4-bit columns")
    parser.add_argument("--peers", default=None,
                        help="comma list, or 'none' (default: every peer of the device: "
                             f"CPU {','.join(peers.CPU_PEERS)}; GPU {','.join(peers.CUDA_PEERS)})")
    parser.add_argument("--llama-types", default=None,
                        type=cli.choices(*llama_cpp.GGML_TYPES),
                        help="ggml types of the llama.cpp peer, comma-separated (default: those "
                             "of --bits: 2 q2_K, 3 q3_K, 4 q4_0,q4_K, 8 q8_0)")
    parser.add_argument("--threads", default=None, type=cli.ints,
                        help="CPU thread counts (default: the preset's cores)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--bandwidth-mib", type=int, default=1024,
                        help="CPU read-probe buffer (0: no bandwidth column)")
    parser.add_argument("--db", help="tuning database URL (default: $QCOMPILE_DB or the cache)")
    parser.add_argument("--so-dir", help="prebuilt kernels (<name>.so + manifest) to use first")
    parser.add_argument("--tune-trials", type=int, default=0,
                        help="tune workloads without a record first, this many trials")
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--plot", metavar="PATH", help="PNG of the speedups (needs matplotlib)")


def parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parse ``argv`` with the defaults of ``--preset`` when one is named."""
    first, _ = parser.parse_known_args(argv)
    if first.preset:
        parser.set_defaults(**PRESETS[first.preset])
    return parser.parse_args(argv)


def workloads(args) -> tuple[list, list[str]]:
    """(specs, skipped lines): every combination the options name that is a valid spec."""
    from qcompile.errors import SpecError
    from qcompile.kernels import BcqSpec, MixedSpec, UniformSpec

    specs, skipped = [], []
    for family, (k, n), m, activations in itertools.product(
            args.family, args.shapes, args.batches, args.activations):
        int8 = activations == "int8"
        dtype = activations if activations in ("float16", "bfloat16") else "float32"
        if family == "uniform":
            makers = [(UniformSpec, dict(k=k, n=n, m=m, bits=b, group_size=g, dtype=dtype,
                                         int8_activations=int8))
                      for b, g in itertools.product(args.bits, args.group_sizes)]
        elif family == "bcq":
            if int8:
                skipped.append(f"bcq {k}x{n}: no int8-activation kernels")
                continue
            makers = [(BcqSpec, dict(k=k, n=n, m=m, q=q, group_size=g, mu=mu))
                      for q, g, mu in itertools.product(args.bits, args.group_sizes, args.mus)]
        else:
            makers = [(MixedSpec, dict(k=k, n=n, m=m, g4=args.g4,
                                       four_bit_share=args.four_bit_share, outlier_share=s,
                                       int8_activations=int8))
                      for s in args.outlier_shares]
        for spec_type, fields in makers:
            try:
                spec = spec_type(**fields)
            except SpecError as why:
                skipped.append(f"{family} {k}x{n} M={m} {activations}: {why}")
                continue
            if spec not in specs:
                specs.append(spec)
    return specs, skipped


def _workload(spec) -> tuple[int, int, int]:
    return spec.k, spec.n, spec.m


def _by_workload(specs: list) -> list:
    """``specs`` grouped by (K, N, M), in the order given otherwise: peers are per workload."""
    return sorted(specs, key=lambda s: list(dict.fromkeys(map(_workload, specs))).index(
        _workload(s)))


def _activations(spec) -> str:
    return "int8" if getattr(spec, "int8_activations", False) else spec.dtype


def _ours(spec, args, x_np, weights, device: str):
    """(timed call or GPU calls, bytes read, row) of our kernel for ``spec``, checked;
    ``weights``: the benchmark's :class:`~tools.harness.weights.WeightCache`."""
    import torch

    from qcompile.kernels import family_of
    from tools.harness.product import kernel_ready

    family = family_of(spec)
    kernel, origin = load(spec, args.target, db=args.db, so_dir=args.so_dir,
                          tune_trials=args.tune_trials)
    shared = weights.get(spec)
    tensors = shared.tensors
    prepared = shared.prepared(kernel)
    x = torch.from_numpy(x_np).to(getattr(torch, spec.dtype))
    x = x.cuda() if device == "cuda" else kernel_ready(x)
    y = torch.full((spec.m, spec.n), float("nan"), device=x.device, dtype=x.dtype)
    kernel.function(x, *prepared.tensors, y)
    if device == "cuda":
        torch.cuda.synchronize()
    row = {"kernel": spec.name(), "family": spec.family, "k": spec.k, "n": spec.n, "m": spec.m,
           "activations": _activations(spec), "origin": origin, "layout": kernel.layout,
           "bytes_read": family.bytes_read(spec)}
    expected = reference.expected(spec, x_np, tensors, shared)
    row["max_rel_error"] = reference.check(spec.name(), y, expected, spec.dtype)
    if row["activations"] == "int8":  # the price of rounding x
        row["max_rel_error_vs_float_x"] = reference.rel_error(y, shared.product(x_np))
    if device == "cuda":
        copies = cuda_timing.rotating(tuple(prepared.tensors), prepared.nbytes())
        calls = [lambda w=w: kernel.function(x, *w, y) for w in copies]
    else:
        args_ = (x, *prepared.tensors, y)
        calls = [lambda: kernel.function(*args_)]
    return calls, row, shared.float32()


def _peers(args, weight_kn: np.ndarray, x_np: np.ndarray, device: str):
    """(checked peers, {name: why not}) at this workload."""
    import torch

    names = (list(peers.CUDA_PEERS if device == "cuda" else peers.CPU_PEERS)
             if args.peers is None else
             [] if args.peers == "none" else [p.strip() for p in args.peers.split(",")])
    weight, x = torch.from_numpy(weight_kn), torch.from_numpy(x_np)
    if device == "cuda":
        weight, x = weight.cuda(), x.cuda()
    llama_types = args.llama_types or llama_cpp.default_types(args.bits)
    made, unavailable = peers.make(names, device, weight, x, llama_types=llama_types)
    checked = []
    for peer in made:
        try:
            peer.error = reference.check(peer.name, peer.output(), peer.expected, peer.precision)
            checked.append(peer)
        except reference.ReferenceMismatch as why:
            unavailable[peer.name] = f"wrong output, not timed: {why}"
    return checked, unavailable


def run_cpu(args, specs) -> dict:
    import targets
    from tools.harness.product import tvm_target

    preset = targets.get(args.target)
    threads = args.threads or [preset.hardware().cores]
    probes = ({t: bw.read_probe(tvm_target(preset), t, args.bandwidth_mib) for t in threads}
              if args.bandwidth_mib else {})
    rows, unavailable, details = [], {}, {}
    rng = np.random.default_rng(0)
    weights = WeightCache("cpu")
    for (k, _, m), group in itertools.groupby(_by_workload(specs), key=_workload):
        group = list(group)
        x_np = rng.standard_normal((m, k)).astype(np.float32)
        ours = {}
        for spec in group:
            calls, row, weight = _ours(spec, args, x_np, weights, "cpu")
            ours[spec.name()] = (calls[0], row)
        checked, why_not = _peers(args, weight, x_np, "cpu")
        unavailable.update(why_not)
        details.update({p.name: p.detail for p in checked if p.detail})
        for t in threads:
            bw.set_threads(t)
            for p in checked:
                if p.set_threads:  # a peer with threads of its own runs with as many as ours
                    p.set_threads(t)
            runners = {name: call for name, (call, _) in ours.items()}
            runners.update({f"peer:{p.name}": p.call for p in checked})
            if t in probes:
                runners["read_bandwidth"] = probes[t]
            samples = interleaved(runners, args.rounds)
            read_gbps = (probes[t].nbytes / median(samples["read_bandwidth"]) / 1e9
                         if t in probes else None)
            for name, (_, base) in ours.items():
                us = median(samples[name]) * 1e6
                row = {**base, "threads": t, "median_us": us,
                       "effective_gbps": base["bytes_read"] / (us * 1e3),
                       "read_bandwidth_gbps": read_gbps}
                if read_gbps:
                    row["fraction_of_bandwidth"] = row["effective_gbps"] / read_gbps
                for p in checked:
                    peer_us = median(samples[f"peer:{p.name}"]) * 1e6
                    row[f"{p.name}_us"] = peer_us
                    row[f"{p.name}_max_rel_error"] = p.error
                    row[f"speedup_vs_{p.name}"] = peer_us / us
                    row[f"speedup_vs_{p.name}_paired"] = paired_ratio(
                        samples, f"peer:{p.name}", name)
                rows.append(row)
                print(_line(row, [p.name for p in checked]), flush=True)
    return {"rows": rows, "peers_unavailable": unavailable, "peers_detail": details}


def run_cuda(args, specs) -> dict:
    import torch

    copy = bw.cuda_copy()
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {copy['tbps']:.2f} TB/s", flush=True)
    rows, unavailable = [], {}
    rng = np.random.default_rng(0)
    weights = WeightCache("cuda")
    for (k, _, m), group in itertools.groupby(_by_workload(specs), key=_workload):
        group = list(group)
        # x on a grid of 1/32: fp16 and bf16 hold it exactly, so every implementation (ours
        # in each activation dtype, and the peers) multiplies the same x
        x_np = (np.round(rng.standard_normal((m, k)) * 32) / 32).astype(np.float32)
        timers, base = [], {}
        for spec in group:
            calls, row, weight = _ours(spec, args, x_np, weights, "cuda")
            timers.append(cuda_timing.GraphTimer(spec.name(), calls, row["bytes_read"]))
            base[spec.name()] = row
        checked, why_not = _peers(args, weight, x_np, "cuda")
        unavailable.update(why_not)
        timers += [cuda_timing.GraphTimer(f"peer:{p.name}", p.rotating_calls or [p.call],
                                          p.bytes_read) for p in checked]
        timed = cuda_timing.interleaved(timers, args.rounds)
        for name, row in base.items():
            ours = timed[name]
            row = {**row, **ours, "copy_bandwidth_tbps": copy["tbps"],
                   "fraction_of_copy_bandwidth": ours["tbps"] / copy["tbps"]}
            for p in checked:
                peer = timed[f"peer:{p.name}"]
                row[f"{p.name}_us"] = peer["median_us"]
                row[f"{p.name}_max_rel_error"] = p.error
                row[f"speedup_vs_{p.name}"] = peer["median_us"] / ours["median_us"]
            rows.append(row)
            print(_line(row, [p.name for p in checked]), flush=True)
        del timers, checked
        torch.cuda.empty_cache()
    return {"rows": rows, "copy_bandwidth": copy, "peers_unavailable": unavailable}


def _line(row: dict, peer_names: list[str]) -> str:
    share = row.get("fraction_of_bandwidth", row.get("fraction_of_copy_bandwidth"))
    text = (f"{row['kernel']:44s} {row.get('threads', '') and str(row['threads']) + 't'} "
            f"{row['median_us']:9.1f} us {row.get('effective_gbps', row.get('tbps', 0) * 1e3):7.1f}"
            f" GB/s" + (f" {share:4.0%} of bw" if share else "") +
            f"  err {row['max_rel_error']:.0e}")
    for name in peer_names:
        text += f" | x{row[f'speedup_vs_{name}']:.2f} vs {name}"
    return text + f"  [{row['origin']['source']}]"


def plot(result: dict, path: str) -> None:
    """Bars of the speedup over each peer, one group per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = sorted({key[len("speedup_vs_"):] for r in rows for key in r
                    if key.startswith("speedup_vs_") and not key.endswith("_paired")})
    xs = np.arange(len(rows))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.6), 4.8))
    for i, name in enumerate(names):
        ax.bar(xs + i * width, [r.get(f"speedup_vs_{name}", 0) for r in rows], width,
               label=f"vs {name}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(xs + width * (len(names) - 1) / 2,
                  [f"{r['kernel']}" + (f"\n{r['threads']}t" if "threads" in r else "")
                   for r in rows], rotation=90, fontsize=6)
    ax.set_ylabel("speedup of qcompile (x)")
    ax.set_title(result["device"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args) -> int:
    import targets

    preset = targets.get(args.target)
    device = "cuda" if preset.kind == "cuda" else "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench kernels: no CUDA GPU visible to torch", file=sys.stderr)
            return 2
    else:
        supported, why = preset.host_support()
        if not supported:
            print(f"bench kernels: target {args.target} cannot run here: {why}", file=sys.stderr)
            return 2
    specs, skipped = workloads(args)
    for line in skipped:
        print(f"skipped: {line}", file=sys.stderr)
    if not specs:
        print("bench kernels: no valid workload", file=sys.stderr)
        return 2
    started = time.monotonic()
    params = {key: value for key, value in vars(args).items() if key not in ("func", "command")}
    result = results.header("kernels", device, params)
    try:
        measured = run_cuda(args, specs) if device == "cuda" else run_cpu(args, specs)
    except reference.ReferenceMismatch as wrong:
        print(f"bench kernels: {wrong}", file=sys.stderr)
        return 1
    result.update(target=preset.name, skipped=skipped, seconds=time.monotonic() - started,
                  **measured)
    for name, detail in measured.get("peers_detail", {}).items():
        print(f"peer {name}: {detail}")
    for name, why in measured["peers_unavailable"].items():
        print(f"peer {name}: {why}")
    if args.json:
        print(f"wrote {results.write(args.json, result)}")
    if args.plot:
        plot(result, args.plot)
    return 0
