"""Study: two built CPU kernels of one spec timed side by side, from DRAM in both ways qcompile
knows: TVM's cache flush of every operand but x before each call (how tuning and build time
candidates, ``MeasurePolicy.cold_weights``) and weights rotated through copies past three times
the L3 (how tools/studies/pack_build.py times, as a model's layers run), plus hot.

    python tools/studies/cold_timing_pair.py pack/uniform_b4_g128_k11008_n4096_m1_f32.so \\
        fresh/uniform_b4_g128_k11008_n4096_m1_f32.so --rounds 5

Each round times every kernel each way, in turn, so both see the same minute of a shared host.
Both outputs are checked against the float64 product before anything is timed.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/model.md)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("libraries", nargs=2, help="two kernel libraries (.so) of one spec")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    import qcompile
    from qcompile import _tvm
    from qcompile.kernels import get_family
    from qcompile.measure import COLD_REPEATS
    from qcompile.testing.kernels import relative_error
    from tools.harness.cpu_timing import copies_for, rotating, time_calls

    kernels = [qcompile.load(path) for path in args.libraries]
    spec = kernels[0].spec
    if kernels[1].spec != spec:
        parser.error(f"the libraries hold two specs: {spec.name()} and {kernels[1].spec.name()}")
    family = get_family(spec.family)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((spec.k, spec.n)).astype(np.float32) * 0.02
    quantized = family.quantize(spec, weight)
    tensors = {"qweight": quantized.qweight, "scales": quantized.scales,
               "qzeros": quantized.qzeros}
    x = torch.randn(spec.m, spec.k)
    reference = family.reference(spec, x.double().numpy(), **tensors, g_idx=quantized.g_idx)

    runs = []
    for path, kernel in zip(args.libraries, kernels, strict=True):
        weights = kernel.prepare(**tensors)
        error = relative_error(kernel(x, weights), reference)
        if error > 1e-4:
            raise SystemExit(f"{path}: max relative error {error:.1e} against float64, over 1e-4")
        nbytes = sum(t.numel() * t.element_size() for t in weights.tensors)
        copies = [kernel.prepare(**tensors) for _ in range(copies_for(nbytes))]
        cold = rotating([lambda w=w, kernel=kernel: kernel(x, w) for w in copies])
        module = _tvm.tvm.runtime.load_module(path)
        operands = [_tvm.tvm.runtime.from_dlpack(t) for t in
                    (x, *weights.tensors, torch.empty(spec.m, spec.n))]
        flushed = module.time_evaluator(spec.name(), _tvm.tvm.cpu(), number=1,
                                        repeat=COLD_REPEATS, min_repeat_ms=0,
                                        f_preproc="cache_flush_cpu_non_first_arg")
        hot = module.time_evaluator(spec.name(), _tvm.tvm.cpu(), number=10, repeat=3)
        runs.append({"library": path, "copies": len(copies), "cold": cold, "flushed": flushed,
                     "hot": hot, "operands": operands,
                     "us": {"flush": [], "rotation": [], "hot": []}})

    for _ in range(args.rounds):
        for run in runs:
            run["us"]["rotation"].append(time_calls(run["cold"], run["copies"]) * 1e6)
            run["us"]["flush"].append(
                statistics.median(run["flushed"](*run["operands"]).results) * 1e6)
            run["us"]["hot"].append(statistics.median(run["hot"](*run["operands"]).results) * 1e6)

    rows = []
    for run in runs:
        medians = {way: statistics.median(values) for way, values in run["us"].items()}
        rows.append({"library": run["library"], "copies": run["copies"],
                     **{f"{way}_us": value for way, value in medians.items()},
                     "samples_us": run["us"]})
        print(f"{run['library']}: flush {medians['flush']:.0f} us, rotation "
              f"{medians['rotation']:.0f} us, hot {medians['hot']:.0f} us "
              f"({run['copies']} copies)")
    for way in ("flush", "rotation", "hot"):
        print(f"first / second, {way}: {rows[0][way + '_us'] / rows[1][way + '_us']:.3f}")
    if args.json:
        _Path(args.json).write_text(json.dumps(
            {"study": "cold_timing_pair", "spec": spec.name(), "rounds": args.rounds,
             "command": "python " + " ".join(_sys.argv), "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
