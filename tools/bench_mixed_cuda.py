"""GPU (H200) run of the mixed 2/4/16 family, in one command: tune, check, time.

1. With ``--tune-trials N``: MetaSchedule tunes every workload over its CUDA design space
   (uniform 4-bit and 2-bit g=128, mixed at every outlier share; the mixed space holds both
   dequantization orders) into ``--db`` (a local SQLite file).
2. Section 5's comparison: the mixed kernel (0.2% outliers) in each order, ``sync`` and
   ``async``, over the same grid of knobs (``--sweep-k-lanes`` x ``--sweep-n-lanes``); the best
   of each order is reported.
3. Every kernel is checked against a float64 reference (random valid operands, output poisoned)
   and timed like tools/bench_cuda.py: CUDA graphs of back-to-back calls, weights rotating over
   enough copies to exceed the L2 three times, interleaved rounds, medians.

The summary gives the fused (0.2%) kernel's effective bandwidth (bytes read / time) as a share of
the uniform 4-bit kernel's, the latency at each outlier share relative to none, and sync vs
async.

    python tools/bench_mixed_cuda.py --db sqlite:////tmp/qc/mixed.sqlite --tune-trials 32 \\
        --shape 8192x28672 --json $OUT/mixed_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_cuda import Timed, copies_for

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, build_untuned
from qcompile.cli import parse_shape
from qcompile.errors import NoRecordError
from qcompile.kernels import MixedSpec, UniformSpec, get_family
from schedules.cuda import mixed as cuda_mixed
from tuning_db import Storage

OUTLIER_SHARES = (0.0, 0.002, 0.005, 0.015)


def workloads(k: int, n: int, m: int, g4: int) -> dict[str, object]:
    specs: dict[str, object] = {
        "uniform 4-bit g128": UniformSpec(k=k, n=n, m=m, bits=4, group_size=128),
        "uniform 2-bit g128": UniformSpec(k=k, n=n, m=m, bits=2, group_size=128),
    }
    for share in OUTLIER_SHARES:
        specs[f"mixed {share:.1%} outliers"] = MixedSpec(k=k, n=n, m=m, g4=g4,
                                                         outlier_share=share)
    return specs


def load_kernel(spec, preset, storage, out_dir: Path):
    """(qcompile Kernel, origin): the database's best record, else the untuned heuristic."""
    if storage is not None:
        try:
            result = build(spec, preset, out_dir, storage=storage)
            return qcompile.load(result.so_path), {
                "source": "tuned", "record": result.record_id, "tuned_us": result.tuned_us}
        except NoRecordError:
            pass
    result = build_untuned(spec, preset, out_dir)
    return qcompile.load(result.so_path), {"source": "untuned heuristic"}


def order_functions(spec: MixedSpec, preset, k_lanes: list[int], n_lanes: list[int]):
    """{order: [(function, knobs)]} over the knob grid (candidates that do not apply skipped)."""
    hw = preset.hardware()
    target = _tvm.Target(preset.tvm_target(hw))
    cands = cuda_mixed.knob_candidates(spec)
    mod = _tvm.normalize_mod(get_family("mixed").compute_for(spec, "cuda"))
    out = {}
    for order in cuda_mixed.ORDERS:
        out[order] = []
        for kl in [v for v in k_lanes if v in cands["k_lanes"]]:
            for nl in [v for v in n_lanes if v in cands["n_lanes"]]:
                if kl * nl > 1024:
                    continue
                knobs = {"k_lanes": kl, "n_lanes": nl, "unroll": 64}
                sch = cuda_mixed.sketch(_tvm.Schedule(mod), spec, hw, order, knobs)
                lib = _tvm.tvm.compile(sch.mod, target=target)
                out[order].append((lib[spec.name()], knobs))
    return out


def timed_kernel(label, function, spec, x, l2, tensors, kernel=None):
    """(Timed, max relative error) of ``function`` on the family's random valid operands,
    prepared by ``kernel`` (a loaded kernel knows its weight layout) or by the family."""
    family = get_family(spec.family)
    prepared = (kernel.prepare(**tensors) if kernel is not None
                else family.prepare(spec, device="cuda", **tensors))
    reference = torch.from_numpy(family.reference(spec, x.cpu().numpy(), **tensors)).cuda()
    y = torch.full((spec.m, spec.n), float("nan"), device="cuda")
    function(x, *prepared.tensors, y)
    torch.cuda.synchronize()
    error = ((y.double() - reference).abs().max() / reference.abs().max()).item()
    copies = [prepared.tensors] + [tuple(t.clone() for t in prepared.tensors)
                                   for _ in range(copies_for(prepared.nbytes(), l2) - 1)]
    timed = Timed(label, [lambda w=w: function(x, *w, y) for w in copies],
                  family.bytes_read(spec))
    return timed, error


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--db", metavar="URL", help="tuning database (tuned records, and where "
                                                    "--tune-trials writes)")
    parser.add_argument("--tune-trials", type=int, default=0,
                        help="tune every workload first with this many trials (default 0)")
    parser.add_argument("--shape", type=parse_shape, default=parse_shape("8192x28672"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--g4", type=int, default=64)
    parser.add_argument("--sweep-k-lanes", default="2,4,8,16")
    parser.add_argument("--sweep-n-lanes", default="8,16,32,64")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    preset = targets.get(args.target)
    if preset.kind != "cuda" or not torch.cuda.is_available():
        parser.error("this tool runs on a GPU machine with a CUDA preset")
    storage = Storage(args.db) if args.db else None
    k, n = args.shape
    specs = workloads(k, n, args.batch, args.g4)
    tuning = []
    if args.tune_trials:
        from qcompile.tune import tune

        if storage is None:
            parser.error("--tune-trials needs --db")
        for label, spec in specs.items():
            t0 = time.monotonic()
            summary = tune(spec, preset, trials=args.tune_trials, storage=storage,
                           progress=False)
            tuning.append({"kernel": label, "trials": summary.trials,
                           "failed": summary.failed, "best_us": summary.best_us,
                           "seconds": time.monotonic() - t0})
            print(f"tuned {label}: {summary.trials} trials, best {summary.best_us} us",
                  flush=True)

    rng = np.random.default_rng(0)
    x = torch.randn(args.batch, k, device="cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out_dir = Path(tempfile.mkdtemp(prefix="qcompile-mixed-"))
    timed, rows = [], {}
    for label, spec in specs.items():
        tensors = get_family(spec.family).example_tensors(spec, rng)
        kernel, origin = load_kernel(spec, preset, storage, out_dir)
        t, error = timed_kernel(label, kernel.function, spec, x, l2, tensors, kernel)
        timed.append(t)
        rows[label] = {"kernel": label, "spec": spec.name(), "origin": origin,
                       "max_rel_error": error}
    sweep_spec = specs["mixed 0.2% outliers"]
    sweep_tensors = get_family("mixed").example_tensors(sweep_spec, rng)
    grid = order_functions(sweep_spec, preset, [int(v) for v in args.sweep_k_lanes.split(",")],
                           [int(v) for v in args.sweep_n_lanes.split(",")])
    for order, functions in grid.items():
        for function, knobs in functions:
            label = f"mixed 0.2% {order} k{knobs['k_lanes']} n{knobs['n_lanes']}"
            t, error = timed_kernel(label, function, sweep_spec, x, l2, sweep_tensors)
            timed.append(t)
            rows[label] = {"kernel": label, "order": order, "knobs": knobs,
                           "max_rel_error": error}
    for t in timed:
        t.prepare()
    for _ in range(args.rounds):
        for t in timed:
            t.sample()
    for t in timed:
        rows[t.name].update(t.result())
        rows[t.name]["effective_gbps"] = t.bytes_read / (rows[t.name]["median_us"] * 1e3)

    four = rows["uniform 4-bit g128"]
    fused = rows["mixed 0.2% outliers"]
    best = {order: min((r for r in rows.values() if r.get("order") == order),
                       key=lambda r: r["median_us"]) for order in cuda_mixed.ORDERS}
    summary = {
        "fused_vs_uniform4_bandwidth": fused["effective_gbps"] / four["effective_gbps"],
        "fused_vs_uniform4_latency": fused["median_us"] / four["median_us"],
        "outlier_slowdown": {label: rows[label]["median_us"] / rows["mixed 0.0% outliers"][
            "median_us"] for label in rows if label.startswith("mixed") and "outliers" in label},
        "sync_best": {"median_us": best["sync"]["median_us"], "knobs": best["sync"]["knobs"]},
        "async_best": {"median_us": best["async"]["median_us"], "knobs": best["async"]["knobs"]},
        "async_speedup_over_sync": best["sync"]["median_us"] / best["async"]["median_us"],
        "max_rel_error": max(r["max_rel_error"] for r in rows.values()),
    }
    for row in rows.values():
        print(f"  {row['kernel']:34s} {row['median_us']:9.2f} us {row['effective_gbps']:8.0f} "
              f"GB/s  err {row['max_rel_error']:.1e}")
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(0), "shape": [k, n],
                       "batch": args.batch, "rounds": args.rounds, "tuning": tuning,
                       "rows": list(rows.values()), "summary": summary}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
