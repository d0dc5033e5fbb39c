"""Prefill crossover: from how many activation rows is "dequantize once + one dense fp32 matmul"
faster than the tuned small-batch kernels?

For each row count M, side by side in alternating blocks of the same run:

    kernels   QuantLinear's kernel path: the tuned kernel of the smallest tuned M' >= M (x
              zero-padded), beyond 16 rows the M = 16 kernel over chunks of 16
    dense     QuantLinear's prefill path: the weight dequantized in torch on every call, then
              ``x @ W`` (torch's fp32 GEMM)

The kernels come from the database (tune M = 1 and M = 16 at least, more M if you like); the
crossover is the smallest M where dense wins, which is what ``qcompile.nn.PREFILL_ROWS`` should
be on this machine.

    python tools/bench_prefill.py --db sqlite:////tmp/bench/tuning.sqlite \\
        --json tools/results/prefill_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np
import torch

import targets
from qcompile.gptq import GptqLayer, QuantizeConfig
from qcompile.nn import MAX_KERNEL_ROWS, QuantLinear, kernel_cache
from qcompile.quantize.rtn import quantize_rtn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_act_order import overhead, side_by_side  # noqa: E402  (tools/ is not a package)

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=sorted(targets.PRESETS))
    parser.add_argument("--shape", default="4096x11008", help="KxN (default 4096x11008)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)),
                        help="comma-separated row counts M")
    parser.add_argument("--db", default=None, help="tuning database URL")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    k, n = (int(v) for v in args.shape.lower().split("x"))
    preset = targets.get(args.target)
    torch.set_num_threads(preset.hardware().cores)
    rng = np.random.default_rng(0)
    tensors = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32) * 0.02, args.bits,
                           args.group_size)
    layer = GptqLayer("bench", tensors, None, QuantizeConfig(bits=args.bits,
                                                             group_size=args.group_size))
    module = QuantLinear(layer, kernel_cache(args.target, args.db), prefill_rows=1 << 30)
    tuned = [m for m in range(1, MAX_KERNEL_ROWS + 1)
             if module.kernels.has_record(module.spec(m))]
    print(f"{module.spec(1).name()} on {preset.name}: tuned M = {tuned}; {args.rounds} rounds")
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
        ref = layer.reference(x)
        errors = {name: float(np.abs(y.double().numpy() - ref).max() / np.abs(ref).max())
                  for name, y in (("kernels", module(x)), ("dense", module._prefill(x)))}
        times = side_by_side({"kernels": lambda x=x: module(x),
                              "dense": lambda x=x: module._prefill(x)},
                             args.rounds, block_s=0.2)
        row = {"rows": rows,
               "kernels_median_us": statistics.median(times["kernels"]) * 1e6,
               "dense_median_us": statistics.median(times["dense"]) * 1e6,
               "dense_over_kernels": overhead(times, "dense", "kernels") + 1,
               "max_rel_error": errors}
        results.append(row)
        print(f"  M={rows:4d}  kernels {row['kernels_median_us']:10.1f} us   dense "
              f"{row['dense_median_us']:10.1f} us   dense/kernels "
              f"{row['dense_over_kernels']:5.2f}", flush=True)
    crossover = next((r["rows"] for r in results if r["dense_over_kernels"] < 1), None)
    print(f"crossover (dense faster from): M = {crossover}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"kernel": module.spec(1).name(), "target": preset.name,
                       "threads": torch.get_num_threads(), "tuned_m": tuned,
                       "rounds": args.rounds, "results": results, "crossover_rows": crossover,
                       "load_average": list(os.getloadavg())}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
