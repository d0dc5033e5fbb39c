"""Study: CPU kernels timed with their weights in the caches (one copy, called again and again,
as MetaSchedule timed candidates before ``MeasurePolicy.cold_weights``) and from DRAM (copies
rotated past the L3, as a model's layers run), for the kernels of a database and the untuned
ones, in interleaved rounds (tools/harness/cpu_timing.py).

    python tools/studies/cold_weights_cpu.py --db sqlite:////tmp/tl.sqlite \\
        --shapes 2048x11264,5632x2048,2048x2560,2048x2048

Shapes default to TinyLlama-1.1B's fused layers (4-bit g128, M = 1, float32 x). Each output is
checked against the float64 product before anything is timed.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/model.md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the database whose records are built")
    parser.add_argument("--shapes", default="2048x11264,5632x2048,2048x2560,2048x2048")
    parser.add_argument("--target", default="avx2")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    import qcompile
    import targets
    from qcompile.build import build_untuned
    from qcompile.kernels import UniformSpec, get_family
    from qcompile.testing.kernels import relative_error
    from tools.harness.cpu_timing import copies_for, interleaved, median, rotating

    preset = targets.get(args.target)
    torch.set_num_threads(preset.hardware().cores)
    family = get_family("uniform")
    scratch = Path(tempfile.mkdtemp(prefix="cold-weights-"))
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        spec = UniformSpec(k=k, n=n, m=1, bits=4, group_size=128)
        tensors = family.example_tensors(spec, np.random.default_rng(k + n))
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(0))
        reference = family.reference(spec, x.double().numpy(), **tensors)
        tuned_dir = scratch / f"{shape}-tuned"
        subprocess.run([_sys.executable, "-m", "qcompile.cli", "build", "--target", args.target,
                        "--shape", shape, "--out", str(tuned_dir), "--db", args.db], check=True,
                       capture_output=True)
        kernels = {"tuned": qcompile.load(next(tuned_dir.glob("*.so"))),
                   "untuned": qcompile.load(build_untuned(spec, preset,
                                                          scratch / f"{shape}-untuned").so_path)}
        nbytes = family.bytes_read(spec)
        copies = copies_for(nbytes)
        runners = {}
        for name, kernel in kernels.items():
            prepared = [kernel.prepare(**tensors) for _ in range(copies)]
            y = torch.empty(1, n)
            kernel.function(x, *prepared[0].tensors, y)
            error = relative_error(y, reference)
            if not error < 1e-5:
                raise SystemExit(f"{shape} {name}: max relative error {error:.1e}")
            runners[f"{name} hot"] = (lambda f=kernel.function, w=prepared[0].tensors, x=x,
                                      y=y: f(x, *w, y))
            runners[f"{name} cold"] = rotating(
                [lambda f=kernel.function, w=p.tensors, x=x, y=y: f(x, *w, y) for p in prepared])
        seconds = interleaved(runners, args.rounds)
        print(f"{shape} ({nbytes / 1e6:.1f} MB, {copies} copies cold): " + ", ".join(
            f"{name} {median(v) * 1e6:.0f} us ({nbytes / median(v) / 1e9:.1f} GB/s)"
            for name, v in seconds.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
