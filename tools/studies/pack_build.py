"""Study: a fresh install building Llama-2-7B's layer set from the shipped record pack, against
the same shapes freshly tuned on this host.

Three steps, each a ``qcompile`` command in a cache of its own (``$XDG_CACHE_HOME``), so nothing
is shared between them or with the user's cache:

1. ``qcompile build --target avx2 --shapes ...`` with the packs on (0 trials): its wall time,
   TVM's start included;
2. ``qcompile tune`` of each shape with the pack's budget (``--trials``, 32), packs off, then
   ``qcompile build`` from that database;
3. both sets of libraries loaded in this process, each output checked against the float64
   product first, then timed in interleaved rounds (tools/harness/cpu_timing.py) hot (one copy
   of the weights, from the cache where it fits) and cold (copies rotated past the L3, as a
   model reads them): medians and the pack's time over the fresh one's, paired by round.

    python tools/studies/pack_build.py --trials 32 --rounds 15 --json out.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from tools.harness.layer_sets import layer_shapes

#: Llama-2-7B's fused layer shapes, as ``qcompile generate`` runs them.
SHAPES = [f"{k}x{n}" for k, n in layer_shapes("llama2-7b")]


def qcompile(args: list[str], cache: Path, packs: bool) -> float:
    """Run one ``qcompile`` command with its own cache; its wall seconds."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "QCOMPILE_PACKS": "1" if packs else "0"}
    env.pop("QCOMPILE_DB", None)
    command = [_sys.executable, "-m", "qcompile.cli", *args]
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    print(f"$ qcompile {' '.join(args)}  ({wall:.1f} s)", flush=True)
    if result.returncode:
        raise SystemExit(f"qcompile {args[0]} failed:\n{result.stdout[-2000:]}"
                         f"{result.stderr[-2000:]}")
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--trials", type=int, default=32, help="trials per shape, fresh tune")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    spec_flags = ["--target", "avx2", "--bits", "4", "--group-size", "128"]

    with tempfile.TemporaryDirectory(prefix="pack-build-") as scratch:
        root = Path(scratch)
        pack_wall = qcompile(["build", *spec_flags, "--shapes", args.shapes,
                              "--out", str(root / "pack")], root / "cache-pack", packs=True)
        tune_wall = sum(qcompile(["tune", *spec_flags, "--shape", shape, "--trials",
                                  str(args.trials)], root / "cache-fresh", packs=False)
                        for shape in shapes)
        fresh_build_wall = qcompile(["build", *spec_flags, "--shapes", args.shapes,
                                     "--out", str(root / "fresh")], root / "cache-fresh",
                                    packs=False)
        rows = time_both(shapes, root / "pack", root / "fresh", args.rounds)

    from targets.host import cpu_model

    report = {"study": "pack_build", "cpu": cpu_model(), "threads": 2,
              "command": "python tools/studies/pack_build.py " + " ".join(argv or _sys.argv[1:]),
              "pack_build_wall_s": pack_wall, "fresh_tune_wall_s": tune_wall,
              "fresh_build_wall_s": fresh_build_wall, "trials_per_shape": args.trials,
              "rounds": args.rounds, "rows": rows}
    print(f"build from the pack (fresh cache, 0 trials): {pack_wall:.1f} s; fresh tune "
          f"({args.trials} trials a shape): {tune_wall:.1f} s, then build {fresh_build_wall:.1f} s")
    for row in rows:
        print(f"{row['shape']:>12}: " + "; ".join(
            f"{heat} pack {row[f'pack_{heat}_us']:.1f} us, fresh {row[f'fresh_{heat}_us']:.1f} us,"
            f" pack / fresh {row[f'pack_over_fresh_{heat}']:.3f}" for heat in ("hot", "cold")))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def time_both(shapes: list[str], pack_dir: Path, fresh_dir: Path, rounds: int) -> list[dict]:
    """Each shape's two libraries: checked against the float64 product, then timed in
    interleaved rounds."""
    import numpy as np
    import torch

    import qcompile
    from qcompile.kernels import UniformSpec, get_family
    from tools.harness import cpu_timing

    family = get_family("uniform")
    rows = []
    for shape in shapes:
        k, n = (int(v) for v in shape.split("x"))
        spec = UniformSpec(k=k, n=n, m=1, bits=4, group_size=128)
        tensors = family.example_tensors(spec, np.random.default_rng(k + n))
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(k))
        reference = family.reference(spec, x.double().numpy(), **tensors)
        copies = cpu_timing.copies_for(family.bytes_read(spec))
        runners = {}
        for label, directory in (("pack", pack_dir), ("fresh", fresh_dir)):
            kernel = qcompile.load(directory / f"{spec.name()}.so")
            prepared = [kernel.prepare(**tensors) for _ in range(copies)]
            got = kernel(x, prepared[0]).double().numpy()
            error = float(np.abs(got - reference).max() / np.abs(reference).max())
            if not error <= 1e-4:
                raise SystemExit(f"{label} {spec.name()}: max relative error {error:.2e}")
            calls = [lambda kernel=kernel, w=w, x=x: kernel(x, w) for w in prepared]
            runners[f"{label} hot"] = calls[0]
            runners[f"{label} cold"] = cpu_timing.rotating(calls)
        samples = cpu_timing.interleaved(runners, rounds)
        row = {"shape": shape, "spec": spec.name(), "cold_copies": copies}
        for heat in ("hot", "cold"):
            row[f"pack_{heat}_us"] = cpu_timing.median(samples[f"pack {heat}"]) * 1e6
            row[f"fresh_{heat}_us"] = cpu_timing.median(samples[f"fresh {heat}"]) * 1e6
            row[f"pack_over_fresh_{heat}"] = cpu_timing.paired_ratio(
                samples, f"pack {heat}", f"fresh {heat}")
        rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
