"""Tune the uniform family's CUDA kernels on a GPU machine, into a local database, within a time
budget.

Written for a GPU machine that cannot reach the team database and lends its GPU for minutes at a
time: every workload is tuned by ``qcompile.tune`` (MetaSchedule over the CUDA design space,
candidates built by NVRTC and timed on the GPU) into the database given by ``--db``, normally a
SQLite file on that machine. Workloads run in the order given, most important first; one is
started only while the budget leaves time for it (the longest one so far is the estimate), and a
summary line per workload says what was tuned, skipped or failed. Records then travel to the team
database with ``qcompile db export`` there and ``qcompile db import`` here
(docs/design/cuda.md, "Tuning on a GPU machine").

    python tools/studies/tune_cuda.py --db sqlite:////tmp/qc/tuning.sqlite --trials 32 \\
        --budget-s 480 \\
        --shapes 8192x28672,28672x8192,8192x8192,4096x4096 --batches 1,16,4 --json summary.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import sys
import time
import traceback

import targets
from qcompile.cli import parse_shape
from qcompile.kernels import UniformSpec
from qcompile.tune import tune
from tuning_db import Storage

DEFAULT_SHAPES = "8192x28672,28672x8192,8192x8192,4096x4096"
DEFAULT_BATCHES = "1,16,4"


def workloads(shapes: list[tuple[int, int]], batches: list[int], bits: int,
              group_size: int) -> list[UniformSpec]:
    """Specs in priority order: the first shape at every M first, then the next shape."""
    return [UniformSpec(k=k, n=n, bits=bits, group_size=group_size, m=m)
            for k, n in shapes for m in batches]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda", help="CUDA target preset (default: cuda)")
    parser.add_argument("--db", required=True, metavar="URL", help="SQLAlchemy URL (local SQLite)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"KxN list ({DEFAULT_SHAPES})")
    parser.add_argument("--batches", default=DEFAULT_BATCHES, help=f"M list ({DEFAULT_BATCHES})")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--trials", type=int, default=32, help="measured candidates per workload")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="start no workload that the budget cannot fit (default 480 s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the summary as JSON")
    args = parser.parse_args(argv)

    preset = targets.get(args.target)
    if preset.kind != "cuda":
        parser.error(f"--target {args.target} is not a CUDA preset")
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    batches = [int(m) for m in args.batches.split(",")]
    storage = Storage(args.db)
    started = time.monotonic()
    longest = 0.0
    rows = []
    for spec in workloads(shapes, batches, args.bits, args.group_size):
        elapsed = time.monotonic() - started
        if rows and elapsed + longest > args.budget_s:
            rows.append({"name": spec.name(), "status": "skipped", "reason":
                         f"{elapsed:.0f} s used, the longest workload took {longest:.0f} s, "
                         f"budget {args.budget_s:.0f} s"})
            print(f"skip   {spec.name()}: not enough budget left", flush=True)
            continue
        t0 = time.monotonic()
        try:
            summary = tune(spec, preset, trials=args.trials, storage=storage, seed=args.seed,
                           progress=False)
        except Exception as error:  # keep tuning the others; the summary says what failed
            traceback.print_exc()
            rows.append({"name": spec.name(), "status": "failed", "error": str(error)[:500]})
            continue
        took = time.monotonic() - t0
        longest = max(longest, took)
        rows.append({"name": spec.name(), "status": "tuned", "trials": summary.trials,
                     "failed_trials": summary.failed, "best_us": summary.best_us,
                     "gbps": summary.gbps, "record_id": summary.record_id, "seconds": took})
        best = f"{summary.best_us:9.1f} us {summary.gbps:7.0f} GB/s" if summary.best_us else "none"
        print(f"tuned  {spec.name()}: {summary.trials} trials ({summary.failed} failed) in "
              f"{took:.0f} s, best {best}", flush=True)
    total = time.monotonic() - started
    print(f"{sum(r['status'] == 'tuned' for r in rows)} of {len(rows)} workloads tuned in "
          f"{total:.0f} s into {storage.display_url}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"target": preset.name, "database": storage.display_url, "seconds": total,
                       "trials": args.trials, "workloads": rows}, handle, indent=2)
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
