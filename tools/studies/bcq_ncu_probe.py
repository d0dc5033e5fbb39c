"""Run exported BCQ kernels a few times each, for Nsight Compute (no timing, no reference).

``tools/studies/bcq_cuda_sweep.py --variants grid --export-best DIR`` leaves the fastest
variants' builds
in ``DIR/<rank>_<variant>/``; this loads each ``.so`` there (``qcompile.load``), makes random
BCQ operands of its spec once, and calls it ``--calls`` times: every call is two launches, the
lookup kernel ``bcq_..._kernel`` and the slice sum ``bcq_..._kernel_1``. The order of the
launches is printed, so ncu's report lines map to variants (ncu numbers launches in that order).
Loading JIT-compiles each kernel (NVRTC), outside any launch.

On the GPU machine, after the sweep in the same call::

    ncu --clock-control none -k regex:bcq --launch-count 40 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python tools/studies/bcq_ncu_probe.py /tmp/bcq_best --calls 2 > $OUT/bcq_ncu.txt 2>&1

(ncu flushes the caches before every profiled launch and replays it once per pass, about a
second each: 4 variants x 2 calls x 2 kernels = 16 launches, well inside a minute.)
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import qcompile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="directories with exported kernels (searched "
                                                "recursively for *.so), or .so files")
    parser.add_argument("--calls", type=int, default=2, help="calls per kernel (2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bcq_ncu_probe: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    paths = []
    for given in map(Path, args.dirs):
        paths += sorted(given.rglob("*.so")) if given.is_dir() else [given]
    if not paths:
        print("bcq_ncu_probe: no .so found", file=sys.stderr)
        return 2
    launches = 0
    for path in paths:
        kernel = qcompile.load(path)
        spec = kernel.spec
        tensors = kernel.family.example_tensors(spec, np.random.default_rng(0))
        weights = kernel.prepare(**tensors)
        x = torch.randn(spec.m, spec.k, device="cuda")
        y = torch.empty(spec.m, spec.n, device="cuda")
        for _ in range(args.calls):
            kernel.function(x, *weights.tensors, y)
        torch.cuda.synchronize()
        print(f"launches {launches}..{launches + 2 * args.calls - 1}: {path.parent.name}",
              flush=True)
        launches += 2 * args.calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
