"""Prefill crossover: from how many activation rows is "dequantize once + one dense fp32 matmul"
faster than the tuned small-batch kernels?

For each row count M, side by side in interleaved rounds of the same run:

    kernels   QuantLinear's kernel path: the tuned kernel of the smallest tuned M' >= M (x
              zero-padded), beyond 16 rows the M = 16 kernel over chunks of 16
    dense     QuantLinear's prefill path: the weight dequantized in torch on every call, then
              ``x @ W`` (torch's fp32 GEMM)

Both outputs are checked against the float64 product first. The kernels come from the database
(tune M = 1 and M = 16 at least); the crossover is the smallest M where dense wins, which is what
``qcompile.nn.PREFILL_ROWS`` should be on this machine.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from tools.harness import cli, reference, results
from tools.harness.cpu_timing import interleaved, median, paired_ratio
from tools.harness.product import gptq_tensors

ROWS = "1,2,4,8,16,32,64,128,256"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_layer_arguments(parser, rounds=7)
    parser.add_argument("--rows", type=cli.ints, default=ROWS, help="row counts M")


def main(args) -> int:
    import torch

    import targets
    from qcompile.gptq import GptqLayer, QuantizeConfig
    from qcompile.kernels import UniformSpec, get_family
    from qcompile.nn import MAX_KERNEL_ROWS, QuantLinear, kernel_cache

    k, n = args.shape
    preset = targets.get(args.target)
    torch.set_num_threads(preset.hardware().cores)
    rng = np.random.default_rng(0)
    spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size)
    tensors = get_family("uniform").example_tensors(spec, rng)
    config = QuantizeConfig(bits=args.bits, group_size=args.group_size)
    layer = GptqLayer("bench", gptq_tensors(tensors, args.bits, args.group_size), None, config)
    module = QuantLinear(layer, kernel_cache(args.target, args.db), prefill_rows=1 << 30)
    tuned = [m for m in range(1, MAX_KERNEL_ROWS + 1)
             if module.kernels.has_record(module.spec(m))]
    print(f"{module.spec(1).name()} on {preset.name}: tuned M = {tuned}; {args.rounds} rounds")
    rows = []
    for m in args.rows:
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        expected = layer.reference(x)
        errors = {name: reference.check(name, y, expected)
                  for name, y in (("kernels", module(x)), ("dense", module._prefill(x)))}
        samples = interleaved({"kernels": lambda x=x: module(x),
                               "dense": lambda x=x: module._prefill(x)}, args.rounds,
                              block_s=0.2)
        row = {"rows": m, "kernels_median_us": median(samples["kernels"]) * 1e6,
               "dense_median_us": median(samples["dense"]) * 1e6,
               "dense_over_kernels": paired_ratio(samples, "dense", "kernels"),
               "max_rel_error": errors}
        rows.append(row)
        print(f"  M={m:4d}  kernels {row['kernels_median_us']:10.1f} us   dense "
              f"{row['dense_median_us']:10.1f} us   dense/kernels "
              f"{row['dense_over_kernels']:5.2f}", flush=True)
    crossover = next((r["rows"] for r in rows if r["dense_over_kernels"] < 1), None)
    print(f"crossover (dense faster from): M = {crossover}")
    if args.json:
        result = results.header("prefill", "cpu", {k_: v for k_, v in vars(args).items()
                                                   if k_ not in ("func", "command")})
        result.update(kernel=module.spec(1).name(), target=preset.name,
                      threads=torch.get_num_threads(), tuned_m=tuned, rows=rows,
                      crossover_rows=crossover, load_average=list(os.getloadavg()))
        print(f"wrote {results.write(args.json, result)}")
    return 0

