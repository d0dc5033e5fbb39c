"""Benchmark a tuned uniform kernel against fp32 ``torch.mv`` on the dequantized weights.

Both run in the same process, in alternating blocks round by round, so machine noise hits both
alike; the table reports medians and their ratio. Each block starts with untimed warm-up calls:
switching kernels leaves the other one's data in the caches, torch's OpenMP threads spinning for
a while after their parallel region, and (on a VM) an idle vCPU that takes time to come back.
The kernel is built from the database's best record (or taken from --so), loaded through
``qcompile.load`` and called as a user would.

    python tools/bench_uniform.py --target avx2 --shape 4096x4096 --bits 4 --group-size 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import qcompile
import targets
from qcompile.build import build
from qcompile.cli import add_db_argument, add_spec_arguments, spec_from_args
from qcompile.kernels import family_of
from tuning_db import Storage

WARMUP_CALLS = 3


def time_calls(fn, calls: int, warmup: int = WARMUP_CALLS) -> float:
    """Seconds per call of ``fn`` over ``calls`` back-to-back calls, after ``warmup`` untimed
    ones. The timing loop of every CPU benchmark in tools/."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=sorted(targets.PRESETS))
    add_spec_arguments(parser)
    add_db_argument(parser)
    parser.add_argument("--so", help="an exported kernel instead of building from the database")
    parser.add_argument("--rounds", type=int, default=25, help="interleaved rounds (default 25)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)

    spec = spec_from_args(args)
    preset = targets.get(args.target)
    hw = preset.hardware()
    torch.set_num_threads(args.threads or hw.cores)
    if args.so:
        kernel = qcompile.load(args.so)
        spec = kernel.spec
    else:
        out = tempfile.mkdtemp(prefix="qcompile-bench-")
        result = build(spec, preset, out, storage=Storage(args.db))
        kernel = qcompile.load(str(result.so_path))
    family = family_of(spec)

    rng = np.random.default_rng(0)
    tensors = family.example_tensors(spec, rng)
    prepared = kernel.prepare(**tensors)
    x = torch.from_numpy(rng.standard_normal(spec.k).astype(np.float32))
    dense = torch.from_numpy(family.reference_weight(spec, **tensors).T.copy())  # [N, K] fp32
    y = kernel(x, prepared)
    reference = family.reference(spec, x.numpy(), **tensors)
    error = float(np.abs(y.numpy() - reference).max() / np.abs(reference).max())

    # Blocks of ~50 ms of each kernel.
    ours_calls = max(3, int(0.05 / max(time_calls(lambda: kernel(x, prepared), 3), 1e-7)))
    mv_calls = max(3, int(0.05 / max(time_calls(lambda: torch.mv(dense, x), 3), 1e-7)))
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(time_calls(lambda: kernel(x, prepared), ours_calls))
        theirs.append(time_calls(lambda: torch.mv(dense, x), mv_calls))
    ours_us = statistics.median(ours) * 1e6
    mv_us = statistics.median(theirs) * 1e6
    gbps = family.bytes_read(spec) / (ours_us * 1e3)
    row = {
        "kernel": spec.name(), "target": preset.name, "threads": torch.get_num_threads(),
        "median_us": ours_us, "effective_gbps": gbps, "torch_mv_fp32_median_us": mv_us,
        "speedup_vs_torch_mv": mv_us / ours_us, "max_rel_error": error,
        "rounds": args.rounds, "calls_per_block": [ours_calls, mv_calls],
    }
    print(f"{row['kernel']} on {preset.name} ({row['threads']} threads), "
          f"{args.rounds} interleaved rounds")
    print(f"  qcompile         median {ours_us:9.1f} us   {gbps:6.1f} GB/s effective   "
          f"max rel error {error:.1e}")
    print(f"  torch.mv fp32    median {mv_us:9.1f} us")
    print(f"  speedup          {row['speedup_vs_torch_mv']:.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(row, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
