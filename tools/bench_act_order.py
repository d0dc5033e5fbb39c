"""What act_order costs, and where its gather of x should run: fused into the kernel or as a
separate step before it.

One layer shape (default: 4-bit, g=128, 4096x11008, M=1), three ways, timed side by side in
alternating blocks of the same run (medians of the rounds; machine noise hits all alike):

    sequential   the layer without act_order (trivial g_idx): the plain tuned kernel
    separate     act_order: rows reordered once by P = argsort(g_idx) in ``prepare``; each call
                 gathers x[:, P] with torch, then the same plain kernel
    fused        act_order: the same schedule replayed on the ``act_order`` spec, whose kernel
                 reads x[perm[k]] itself (perm operand)

plus the same comparison through ``QuantLinear`` (what a model sees). All three kernels use the
best record of the sequential spec in the database (``qcompile tune`` it first), so the only
difference between them is the gather.

    python tools/bench_act_order.py --db sqlite:////tmp/bench/tuning.sqlite \\
        --json tools/results/act_order_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np
import torch
from bench_uniform import time_calls  # tools/ is sys.path[0] when a tool runs

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, export
from qcompile.formats.gptq import GptqTensors
from qcompile.gptq import GptqLayer, QuantizeConfig
from qcompile.kernels.uniform import UniformSpec
from qcompile.nn import QuantLinear, kernel_cache
from qcompile.quantize.rtn import quantize_rtn
from qcompile.trust.workloads import workload_database
from schedules.variants import compute_for
from tuning_db import Storage


def side_by_side(functions: dict, rounds: int, block_s: float = 0.05) -> dict:
    """Seconds per call of each function in each of ``rounds`` rounds of interleaved blocks
    (~``block_s`` each): {name: [per-round seconds]}."""
    calls = {name: max(3, int(block_s / max(time_calls(fn, 3), 1e-7)))
             for name, fn in functions.items()}
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            times[name].append(time_calls(fn, calls[name]))
    return times


def median(values) -> float:
    return statistics.median(values)


def overhead(times: dict, name: str, base: str) -> float:
    """Median over rounds of ``name``'s time over ``base``'s in the same round, minus 1: robust
    to a machine whose load changes between rounds."""
    return statistics.median(a / b for a, b in zip(times[name], times[base], strict=True)) - 1


def act_order_layer(plain: GptqTensors, rng) -> GptqTensors:
    """The same codes with a scrambled g_idx, as GPTQ's desc_act writes it."""
    k = plain.in_features
    g_idx = (np.arange(k) // plain.group_size)[np.argsort(rng.permutation(k))].astype(np.int32)
    return GptqTensors.from_tensors(qweight=plain.qweight, scales=plain.scales,
                                    qzeros=plain.qzeros, bits=plain.bits,
                                    group_size=plain.group_size, g_idx=g_idx)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=sorted(targets.PRESETS))
    parser.add_argument("--shape", default="4096x11008", help="KxN (default 4096x11008)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1, metavar="M")
    parser.add_argument("--db", default=None, help="tuning database URL")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    k, n = (int(v) for v in args.shape.lower().split("x"))
    spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size, m=args.batch)
    fused_spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size,
                             m=args.batch, act_order=True)
    preset = targets.get(args.target)
    hw = preset.hardware()
    torch.set_num_threads(hw.cores)
    storage = Storage(args.db)
    out = tempfile.mkdtemp(prefix="qcompile-bench-act-order-")
    plain_kernel = qcompile.load(str(build(spec, preset, out, storage=storage).so_path))

    # The fused kernel: the sequential spec's best trace replayed on the act_order workload.
    target = _tvm.Target(preset.tvm_target(hw))
    workload, record = workload_database(storage, spec, target).best(
        _tvm.normalize_mod(compute_for(spec, "cpu")))
    fused_mod = workload_database(storage, fused_spec, target).replay(
        _tvm.normalize_mod(compute_for(fused_spec, "cpu")), record)
    fused_so, _ = export(fused_spec, preset, target, fused_mod, out,
                         {"id": record.id, "replayed_from": spec.name()})
    fused_kernel = qcompile.load(str(fused_so))

    rng = np.random.default_rng(0)
    plain = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32) * 0.02, args.bits,
                         args.group_size)
    scrambled = act_order_layer(plain, rng)

    def tensors(t):
        return dict(qweight=t.qweight, scales=t.scales, qzeros=t.qzeros, g_idx=t.g_idx)

    w_plain = plain_kernel.prepare(**tensors(plain))
    w_separate = plain_kernel.prepare(**tensors(scrambled))
    w_fused = fused_kernel.prepare(**tensors(scrambled))
    x = torch.from_numpy(rng.standard_normal((args.batch, k)).astype(np.float32))
    ref = x.double().numpy() @ scrambled.dequantize().astype(np.float64)
    errors = {}
    for name, y in (("separate", plain_kernel(x, w_separate)), ("fused", fused_kernel(x, w_fused))):
        errors[name] = float(np.abs(y.double().numpy() - ref).max() / np.abs(ref).max())

    permutation = w_separate.extras["perm"]
    kernels = side_by_side({
        "gather_alone": lambda: x.index_select(-1, permutation),
        "sequential": lambda: plain_kernel(x, w_plain),
        "separate": lambda: plain_kernel(x, w_separate),
        "fused": lambda: fused_kernel(x, w_fused),
    }, args.rounds)

    cache = kernel_cache(args.target, args.db)
    config = QuantizeConfig(bits=args.bits, group_size=args.group_size)
    modules = {name: QuantLinear(GptqLayer(name, t, None, config), cache)
               for name, t in (("sequential", plain), ("act_order", scrambled))}
    modules_us = side_by_side({name: (lambda m=m: m(x)) for name, m in modules.items()},
                              args.rounds)

    row = {
        "kernel": spec.name(), "target": preset.name, "threads": torch.get_num_threads(),
        "record_id": record.id, "rounds": args.rounds,
        "kernel_median_us": {name: median(t) * 1e6 for name, t in kernels.items()},
        "act_order_overhead": {name: overhead(kernels, name, "sequential")
                               for name in ("separate", "fused")},
        "fused_over_separate": overhead(kernels, "fused", "separate"),
        "gather_alone_over_sequential": statistics.median(
            a / b for a, b in zip(kernels["gather_alone"], kernels["sequential"], strict=True)),
        "quantlinear_median_us": {name: median(t) * 1e6 for name, t in modules_us.items()},
        "quantlinear_act_order_overhead": overhead(modules_us, "act_order", "sequential"),
        "max_rel_error": errors,
        "load_average": list(os.getloadavg()),
    }
    print(f"{spec.name()} on {preset.name} ({row['threads']} threads), record {record.id}, "
          f"{args.rounds} interleaved rounds")
    for name, us in row["kernel_median_us"].items():
        extra = (f"   act_order {row['act_order_overhead'][name] * 100:+5.1f}%   "
                 f"max rel error {errors[name]:.1e}") if name in errors else ""
        print(f"  kernel {name:11s} median {us:9.1f} us{extra}")
    for name, us in row["quantlinear_median_us"].items():
        print(f"  QuantLinear {name:10s} median {us:9.1f} us")
    print(f"  QuantLinear act_order overhead {row['quantlinear_act_order_overhead'] * 100:+.1f}%")
    print(f"  the gather alone is {row['gather_alone_over_sequential'] * 100:.2f}% of the kernel")
    print(f"  fused vs separate gather {row['fused_over_separate'] * 100:+.1f}% "
          f"(median of per-round ratios; load average {row['load_average'][0]:.1f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(row, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
