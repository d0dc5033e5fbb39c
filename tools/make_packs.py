"""Make record packs on this machine: each model's layer set (as ``qcompile generate`` runs it,
q/k/v and gate/up fused) tuned as one job per batch size (``qcompile.tune.tune_layer_set``, the
trials shared by the layers' calls per token), then packed with ``qcompile db export --pack``
into ``tuning_db/packs/`` (or ``--out-dir``) as ``<model>-m<M>-<target>-<cores>c-<tag>``.

    python tools/make_packs.py --models llama2-7b,llama3-8b,llama2-13b --batches 1,16 \\
        --target avx2 --trials 32

Each pack is tuned into a database of its own (a temporary SQLite file), so a pack holds its
models' workloads only. The pack's records are claims wherever the pack is read: a build times
each once on its own machine before it believes it.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))  # the repository

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

from tools.harness.layer_sets import MODELS, layer_shapes

SHIPPED = Path(__file__).resolve().parents[1] / "tuning_db" / "packs"


def device_tag(preset) -> str:
    """A short name of this machine's device for pack names: the GPU's or CPU's model, its
    first distinctive word (``epyc``, ``xeon``, ``h200``...)."""
    from qcompile.measure import this_device_model

    model = (this_device_model(preset) or "unknown").lower()
    for word in re.findall(r"[a-z0-9]+", model):
        if word not in ("amd", "intel", "nvidia", "r", "tm", "cpu", "processor"):
            return word
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama2-7b", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--batches", default="1", help="activation rows, e.g. 1,16")
    parser.add_argument("--target", default="avx2")
    parser.add_argument("--trials", type=int, default=32, help="trials per layer shape")
    parser.add_argument("--dtype", default=None, help="activation dtype (default: the "
                        "target's: float32 on CPUs, float16 on GPUs)")
    parser.add_argument("--tag", help="the device's name in pack names (default: its model's)")
    parser.add_argument("--out-dir", type=Path, default=SHIPPED)
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (on stderr) while a layer set tunes")
    args = parser.parse_args(argv)

    import targets
    from qcompile.kernels import UniformSpec
    from qcompile.tune import tune_layer_set
    from tuning_db import Storage
    from tuning_db.layers import Layers

    preset = targets.get(args.target)
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    dtype = args.dtype or ("float16" if preset.kind == "cuda" else "float32")
    cores = getattr(preset.hardware(), "cores", None)
    tag = args.tag or device_tag(preset)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="make-packs-") as scratch:
        for model in models:
            for m in (int(v) for v in args.batches.split(",")):
                name = f"{model}-m{m}-{args.target}" + (f"-{cores}c" if cores else "") + \
                    f"-{tag}"
                url = f"sqlite:///{scratch}/{name}.sqlite"
                specs = [UniformSpec(k=k, n=n, m=m, bits=4, group_size=128, dtype=dtype)
                         for k, n in layer_shapes(model)]
                started = time.monotonic()
                summary = tune_layer_set(specs, [1.0] * len(specs), preset,
                                         trials=args.trials * len(specs),
                                         layers=Layers.single(Storage(url)),
                                         progress=not args.quiet)
                print("\n".join(summary.lines()), flush=True)
                out = args.out_dir / f"{name}.jsonl"
                subprocess.run([_sys.executable, "-m", "qcompile.cli", "db", "export", "--db",
                                url, "--pack", name, "--target", args.target, "--out", str(out)],
                               check=True)
                print(f"{name}: tuned in {time.monotonic() - started:.0f} s, wrote {out}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
