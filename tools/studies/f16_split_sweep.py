"""Time the fp16/bf16 tensor-core kernel (compute_cuda_mma_f16.py) at several K splits on a
GPU, in one run: the rule's choice (``k_split``) against the splits it passes over.

The split is how many warps share one 32-column slice of W (one block), each walking a slice
of K; more warps hide more latency until the blocks no longer fit one wave. ``k_split`` takes
the most that keep one wave by its register plan; this study rebuilds each kernel at each
split of ``--splits`` ("rule": the rule's) and with each count of word buffers
(``--buffers``: the units of words in flight per lane are one fewer, ``WORD_BUFFERS``) and
with each count of shared-memory stages (``--stages``; 0: register buffers; none given: the
rule's, ``stages``),
checks each against the float64 product of its x, and times them as
tools/harness/cuda_timing.py does (CUDA graphs, weights rotating past the L2, interleaved
rounds, medians).

    python tools/studies/f16_split_sweep.py --shapes 8192x28672,4096x4096 --batches 1,16 \\
        --splits rule,2,4,8 --buffers 2,3 --stages 0,3,4 --json split.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8192x28672,28672x8192,4096x4096")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--splits", default="rule,4,8,16",
                        help="K splits to build (warps per 32 columns; rule: k_split's)")
    parser.add_argument("--buffers", default="",
                        help="word buffers per lane to try at every split (WORD_BUFFERS; "
                             "default: the module's for --bits)")
    parser.add_argument("--stages", default="",
                        help="units of words staged in shared memory per warp to try "
                             "(0: the register buffers; default: the rule's, "
                             "compute_cuda_mma_f16.stages)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    import torch

    import qcompile
    import targets
    from qcompile.build import build_untuned
    from qcompile.kernels import UniformSpec, get_family
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module
    from tools.harness import cuda_timing

    family, preset = get_family("uniform"), targets.get("cuda")
    rule_split = kernel_module.k_split
    default_buffers = kernel_module.WORD_BUFFERS[args.bits]
    buffer_counts = [int(v) for v in args.buffers.split(",") if v] or [default_buffers]
    rule_stages = kernel_module.stages
    stage_counts = [int(v) for v in args.stages.split(",") if v] or [None]
    # register buffers matter only without stages
    variants = [(b, 0) for b in buffer_counts if 0 in stage_counts] + [
        (default_buffers, s) for s in stage_counts if s != 0]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            rng = np.random.default_rng(k + n)
            weight = rng.standard_normal((k, n)).astype(np.float32) * 0.02
            for m in (int(v) for v in args.batches.split(",")):
                spec = UniformSpec(k=k, n=n, m=m, bits=args.bits, dtype=args.dtype)
                quantized = family.quantize(spec, weight)
                tensors = {"qweight": quantized.qweight, "scales": quantized.scales,
                           "qzeros": quantized.qzeros, "g_idx": quantized.g_idx}
                x = torch.randn(m, k, device="cuda").to(getattr(torch, args.dtype))
                reference = family.reference(spec, x.double().cpu().numpy(), **tensors)
                timers, splits = [], {}
                for choice, (buffers, stages) in [(v, b) for v in args.splits.split(",")
                                                  for b in variants]:
                    kernel_module.WORD_BUFFERS[args.bits] = buffers
                    if stages is None:                          # the rule's
                        stages = rule_stages(spec)
                    kernel_module.stages = lambda spec, stages=stages: stages
                    split = rule_split(spec) if choice == "rule" else int(choice)
                    if ((split, buffers, stages) in splits.values()
                            or split > kernel_module.units(spec)):
                        continue
                    kernel_module.k_split = lambda spec, split=split: split
                    out = Path(scratch) / f"{spec.name()}_ks{split}_b{buffers}_s{stages}"
                    kernel = qcompile.load(build_untuned(spec, preset, out).so_path)
                    prepared = kernel.prepare(**tensors)
                    y = torch.full((m, n), float("nan"), device="cuda", dtype=x.dtype)
                    kernel.function(x, *prepared.tensors, y)
                    got = y.double().cpu().numpy()
                    error = float(np.abs(got - reference).max() / np.abs(reference).max())
                    label = (f"split {split} stages {stages}" if stages
                             else f"split {split} buffers {buffers}")
                    print(f"{spec.name()} {label}: max rel error {error:.2e}", flush=True)
                    if not error <= (2e-3 if args.dtype == "float16" else 1e-2):
                        raise SystemExit(f"{spec.name()} {label}: error {error:.2e}")
                    copies = cuda_timing.rotating(tuple(prepared.tensors), prepared.nbytes())
                    calls = [lambda w=w, f=kernel.function, x=x, y=y: f(x, *w, y) for w in copies]
                    nbytes = family.bytes_read(spec)
                    name = label + (" (rule)" if choice == "rule" else "")
                    splits[name] = (split, buffers, stages)
                    timers.append(cuda_timing.GraphTimer(name, calls, nbytes))
                kernel_module.WORD_BUFFERS[args.bits] = default_buffers
                kernel_module.stages = rule_stages
                kernel_module.k_split = rule_split
                results = cuda_timing.interleaved(timers, args.rounds)
                for name, result in results.items():
                    rows.append({"k": k, "n": n, "m": m, "bits": args.bits,
                                 "dtype": args.dtype, "split": splits[name][0],
                                 "buffers": splits[name][1], "stages": splits[name][2],
                                 "name": name, **result})
                    print(f"{k}x{n} M={m} {name}: {result['median_us']:.1f} us "
                          f"{result['tbps']:.2f} TB/s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
