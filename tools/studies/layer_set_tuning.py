"""Study: a model's layer set tuned as one job (``qcompile.tune.tune_layer_set``), against the
same job with 4x the trials.

The layer set is Llama-2-7B's as ``qcompile generate`` runs it (q/k/v and gate/up fused: each
of the four shapes called once per decoder layer, 32 times a token), 4-bit g128, M = 1, float32
x, on this machine's avx2 cores. Each budget tunes into a database of its own from nothing;
the large budget runs every trial (no early stop). The report gives each shape's best, the
layers' time per token (each best times 32), the wall time, and the small budget's time per
token as a share of the large one's.

    python tools/studies/layer_set_tuning.py --trials 32 --scale 4 --json out.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import tempfile
import time

from tools.harness.layer_sets import decoder_layers, layer_shapes

#: Llama-2-7B's fused layer shapes (K, N) and their calls per token.
LLAMA2_7B = [(shape, decoder_layers("llama2-7b")) for shape in layer_shapes("llama2-7b")]


def run_budget(trials_per_spec: int, seed: int, directory: str, stop_flat: bool) -> dict:
    import targets
    from qcompile.kernels import UniformSpec
    from qcompile.tune import FLAT_PATIENCE, tune_layer_set
    from tuning_db import Storage
    from tuning_db.layers import Layers

    specs = [UniformSpec(k=k, n=n, bits=4, group_size=128) for (k, n), _ in LLAMA2_7B]
    weights = [calls for _, calls in LLAMA2_7B]
    storage = Storage(f"sqlite:///{directory}/set-{trials_per_spec}.sqlite")
    started = time.monotonic()
    summary = tune_layer_set(specs, weights, targets.get("avx2"),
                             trials=trials_per_spec * len(specs), layers=Layers.single(storage),
                             seed=seed, progress=False,
                             patience=FLAT_PATIENCE if stop_flat else 1 << 30)
    wall = time.monotonic() - started
    print("\n".join(summary.lines()), flush=True)
    return {"trials_per_spec": trials_per_spec, "wall_s": wall,
            "per_token_us": sum(r.calls * r.best_us for r in summary.rows),
            "rows": [{"spec": r.spec, "calls": r.calls, "trials": r.trials, "best_us": r.best_us,
                      "stopped_flat": r.stopped} for r in summary.rows]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32, help="trials per spec, small budget")
    parser.add_argument("--scale", type=int, default=4, help="the large budget's multiple")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from targets.host import cpu_model

    with tempfile.TemporaryDirectory(prefix="layer-set-") as directory:
        small = run_budget(args.trials, args.seed, directory, stop_flat=True)
        large = run_budget(args.trials * args.scale, args.seed, directory, stop_flat=False)
    share = small["per_token_us"] / large["per_token_us"]
    print(f"\nsmall budget: {small['wall_s']:.0f} s wall, {small['per_token_us']:.0f} us a token; "
          f"{args.scale}x: {large['wall_s']:.0f} s, {large['per_token_us']:.0f} us; the small "
          f"budget's layers take {share:.3f}x the large one's")
    for s, big in zip(small["rows"], large["rows"], strict=True):
        print(f"  {s['spec']:44s} {s['best_us']:9.1f} us vs {big['best_us']:9.1f} us "
              f"({s['best_us'] / big['best_us']:.3f}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": cpu_model(), "date": time.strftime("%Y-%m-%d"),
                       "small": small, "large": large, "per_token_ratio": share}, handle,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
