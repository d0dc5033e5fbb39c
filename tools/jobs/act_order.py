"""What act_order costs, and where its gather of x should run: fused into the kernel or as a
separate step before it.

One layer shape (default: 4-bit, g=128, 4096x11008, M=1), three ways, in interleaved rounds:

    sequential   the layer without act_order (trivial g_idx): the plain tuned kernel
    separate     act_order: rows reordered once by P = argsort(g_idx) in ``prepare``; each call
                 gathers x[:, P] with torch, then the same plain kernel
    fused        act_order: the same schedule replayed on the ``act_order`` spec, whose kernel
                 reads x[perm[k]] itself (perm operand)

plus the same comparison through ``QuantLinear`` (what a model sees). All three kernels use the
best record of the sequential spec in the database (``qcompile tune`` it first), so the only
difference between them is the gather. Outputs are checked against the float64 product first.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from tools.harness import cli, reference, results
from tools.harness.cpu_timing import interleaved, median, paired_ratio
from tools.harness.product import gptq_tensors, replay_best, scrambled_g_idx


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_layer_arguments(parser, rounds=25)
    parser.add_argument("--batch", type=int, default=1, metavar="M")


def main(args) -> int:
    import torch

    import qcompile
    import targets
    from qcompile.gptq import GptqLayer, QuantizeConfig
    from qcompile.kernels import UniformSpec, get_family
    from qcompile.nn import QuantLinear, kernel_cache
    from tools.harness.loading import load

    k, n = args.shape
    spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size, m=args.batch)
    fused_spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size,
                             m=args.batch, act_order=True)
    preset = targets.get(args.target)
    torch.set_num_threads(preset.hardware().cores)
    cache = kernel_cache(args.target, args.db)
    plain_kernel, origin = load(spec, args.target, db=args.db)
    if origin["source"] != "tuned record":
        print(f"bench act-order: {spec.name()} has no tuned record; run qcompile tune first")
        return 2
    fused_so, record_id = replay_best(cache.storage, spec, fused_spec, preset,
                                      tempfile.mkdtemp(prefix="qcompile-bench-act-order-"))
    fused_kernel = qcompile.load(str(fused_so))

    rng = np.random.default_rng(0)
    plain = gptq_tensors(get_family("uniform").example_tensors(spec, rng), args.bits,
                         args.group_size)
    scrambled = scrambled_g_idx(plain, rng)

    def tensors(t):
        return dict(qweight=t.qweight, scales=t.scales, qzeros=t.qzeros, g_idx=t.g_idx)

    w_plain = plain_kernel.prepare(**tensors(plain))
    w_separate = plain_kernel.prepare(**tensors(scrambled))
    w_fused = fused_kernel.prepare(**tensors(scrambled))
    x = torch.from_numpy(rng.standard_normal((args.batch, k)).astype(np.float32))
    expected = x.double().numpy() @ scrambled.dequantize().astype(np.float64)
    errors = {name: reference.check(name, y, expected)
              for name, y in (("separate", plain_kernel(x, w_separate)),
                              ("fused", fused_kernel(x, w_fused)))}
    reference.check("sequential", plain_kernel(x, w_plain),
                    x.double().numpy() @ plain.dequantize().astype(np.float64))

    permutation = w_separate.extras["perm"]
    kernels = interleaved({
        "gather_alone": lambda: x.index_select(-1, permutation),
        "sequential": lambda: plain_kernel(x, w_plain),
        "separate": lambda: plain_kernel(x, w_separate),
        "fused": lambda: fused_kernel(x, w_fused),
    }, args.rounds, block_s=0.05)
    config = QuantizeConfig(bits=args.bits, group_size=args.group_size)
    modules = {name: QuantLinear(GptqLayer(name, t, None, config), cache)
               for name, t in (("sequential", plain), ("act_order", scrambled))}
    layers = interleaved({name: (lambda m=m: m(x)) for name, m in modules.items()},
                         args.rounds, block_s=0.05)

    row = {
        "kernel": spec.name(), "record_id": record_id,
        "kernel_median_us": {name: median(t) * 1e6 for name, t in kernels.items()},
        "act_order_overhead": {name: paired_ratio(kernels, name, "sequential") - 1
                               for name in ("separate", "fused")},
        "fused_over_separate": paired_ratio(kernels, "fused", "separate") - 1,
        "gather_alone_over_sequential": paired_ratio(kernels, "gather_alone", "sequential"),
        "quantlinear_median_us": {name: median(t) * 1e6 for name, t in layers.items()},
        "quantlinear_act_order_overhead": paired_ratio(layers, "act_order", "sequential") - 1,
        "max_rel_error": errors,
        "load_average": list(os.getloadavg()),
    }
    print(f"{spec.name()} on {preset.name} ({torch.get_num_threads()} threads), record "
          f"{record_id}, {args.rounds} interleaved rounds")
    for name, us in row["kernel_median_us"].items():
        extra = (f"   act_order {row['act_order_overhead'][name] * 100:+5.1f}%"
                 if name in row["act_order_overhead"] else "")
        print(f"  kernel {name:11s} median {us:9.1f} us{extra}")
    for name, us in row["quantlinear_median_us"].items():
        print(f"  QuantLinear {name:10s} median {us:9.1f} us")
    print(f"  fused vs separate gather {row['fused_over_separate'] * 100:+.1f}%")
    if args.json:
        result = results.header("act-order", "cpu", {k_: v for k_, v in vars(args).items()
                                                     if k_ not in ("func", "command")})
        result.update(target=preset.name, threads=torch.get_num_threads(), rounds=args.rounds,
                      **row)
        print(f"wrote {results.write(args.json, result)}")
    return 0
