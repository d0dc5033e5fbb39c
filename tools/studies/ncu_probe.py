"""Build untuned uniform CUDA kernels and call each a few times, for Nsight Compute (no timing,
no reference check: tools/bench.py does those).

On the GPU machine::

    ncu --clock-control none -k regex:uniform --launch-count 8 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python tools/studies/ncu_probe.py --shape 8192x28672 --m 1,16 --dtype float16 \\
        > $OUT/ncu.txt 2>&1

The order of the launches is printed, so ncu's report lines map to kernels. Building happens
before any launch, so ncu's kernel filter sees only the GEMMs.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository

import argparse
import sys
import tempfile

import numpy as np
import torch

import qcompile
import targets
from qcompile.build import build_untuned
from qcompile.kernels import UniformSpec, get_family


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="KxN, e.g. 8192x28672")
    parser.add_argument("--m", default="1", help="rows, comma-separated (1)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--calls", type=int, default=2, help="calls per kernel (2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_probe: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    k, n = (int(v) for v in args.shape.lower().split("x"))
    family = get_family("uniform")
    preset = targets.get("cuda")
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for m in (int(v) for v in args.m.split(",")):
            spec = UniformSpec(k=k, n=n, m=m, bits=args.bits, group_size=args.group_size,
                               dtype=args.dtype)
            kernel = qcompile.load(build_untuned(spec, preset, directory).so_path)
            weights = kernel.prepare(**family.example_tensors(spec, np.random.default_rng(0)))
            x = torch.randn(m, k, device="cuda").to(getattr(torch, args.dtype))
            y = torch.empty(m, n, device="cuda", dtype=x.dtype)
            runs.append((spec, kernel, x, weights, y))
        torch.cuda.synchronize()
        launches = 0
        for spec, kernel, x, weights, y in runs:
            for _ in range(args.calls):
                kernel.function(x, *weights.tensors, y)
            torch.cuda.synchronize()
            print(f"launches {launches}..{launches + args.calls - 1}: {spec.name()}", flush=True)
            launches += args.calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
