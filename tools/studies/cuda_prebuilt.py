"""CUDA kernels exported on a machine without a GPU, then loaded and checked on one.

    python tools/studies/cuda_prebuilt.py build DIR     # here, no GPU: export kernels into DIR
    python tools/studies/cuda_prebuilt.py check DIR     # on the GPU machine: load each, compare

``build`` exports the uniform family's CUDA kernels for every bit width, a few group sizes and
M = 1, 4, 16, with float and int8 activations (the best record of ``--db`` when it has one,
else the untuned heuristic schedule), each as ``<name>.so`` with its manifest, CUDA source and
scheduled TensorIR. ``check`` loads every ``.so`` in DIR through ``qcompile.load`` (the GPU
machine JIT-compiles the embedded CUDA C for its own GPU), runs it on random GPTQ weights and
activations as torch CUDA tensors, and compares with the float64 reference (for int8-activation
kernels, the product of the int8-rounded x they multiply); it prints a line per kernel and exits
1 if any fails.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import targets
from qcompile.kernels import UniformSpec

#: (K, N, bits, group size, M, int8 activations): every bit width, both layouts, every M, the
#: three int8 kernels (M = 1: the one-row GEMV, 2688x1024 with lanes past its last group;
#: 4096x4096 M = 16: tensor cores; 3 bits: dp4a); few, since loading each JIT-compiles it
#: (1-2 s) on the GPU machine.
KERNELS = [(4096, 4096, 4, 128, 1, False), (4096, 4096, 4, 128, 4, False),
           (4096, 4096, 4, 128, 16, False), (1024, 768, 2, 64, 4, False),
           (1024, 768, 3, 128, 16, False), (1024, 768, 8, 32, 1, False),
           (2048, 512, 4, -1, 4, False),
           (8192, 28672, 4, 128, 1, True), (4096, 4096, 4, 128, 1, True),
           (4096, 4096, 4, 128, 16, True), (1024, 768, 3, 64, 4, True),
           (2688, 1024, 4, 128, 1, True)]


def build_all(out: Path, db: str | None, target: str) -> int:
    from qcompile.build import build, build_untuned
    from qcompile.errors import NoRecordError
    from tuning_db import Storage

    preset = targets.get(target)
    storage = Storage(db) if db else None
    for k, n, bits, group_size, m, int8 in KERNELS:
        spec = UniformSpec(k=k, n=n, bits=bits, group_size=group_size, m=m,
                           int8_activations=int8)
        started = time.monotonic()
        source = "untuned"
        try:
            if storage is None:
                raise NoRecordError("no database given")
            result = build(spec, preset, out, storage=storage)
            source = f"record {result.record_id}"
        except NoRecordError:
            result = build_untuned(spec, preset, out)
        print(f"built {result.so_path.name} ({source}) in {time.monotonic() - started:.1f} s")
    return 0


def check_all(directory: Path) -> int:
    import torch

    import qcompile
    from qcompile.kernels import family_of
    from tools.harness.product import quantized_activations

    failures = 0
    libraries = sorted(directory.glob("*.so"))
    if not libraries:
        print(f"no kernels in {directory}", file=sys.stderr)
        return 1
    for so in libraries:
        started = time.monotonic()
        try:
            kernel = qcompile.load(so)
            spec = kernel.spec
            family = family_of(spec)
            rng = np.random.default_rng(len(so.name))
            tensors = family.example_tensors(spec, rng)
            weights = kernel.prepare(**tensors)
            x = torch.randn(spec.m, spec.k, device="cuda").to(getattr(torch, spec.dtype))
            y = kernel(x, weights)
            torch.cuda.synchronize()
            x_used = x.float().cpu().numpy()
            if spec.int8_activations:  # what the kernel multiplies: x rounded to int8
                x_used = quantized_activations(x_used, spec.group_size)
            reference = family.reference(spec, x_used, **tensors)
            got = y.float().cpu().numpy()
            error = float(np.abs(got - reference).max() / np.abs(reference).max())
            ok = bool(np.isfinite(got).all()) and error < 1e-4
        except Exception as failure:  # report every kernel, then fail
            ok, error = False, float("nan")
            print(f"FAIL {so.name}: {type(failure).__name__}: {failure}")
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {so.name}: max rel error {error:.1e} "
              f"({time.monotonic() - started:.1f} s with load and JIT)")
    print(f"{len(libraries) - failures} of {len(libraries)} prebuilt kernels correct")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="export kernels into DIR (no GPU needed)")
    p.add_argument("dir", type=Path)
    p.add_argument("--db", help="tuning database: use its best records where it has them")
    p.add_argument("--target", default="cuda")
    p = sub.add_parser("check", help="load and check every kernel in DIR on this GPU")
    p.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        return build_all(args.dir, args.db, args.target)
    return check_all(args.dir)


if __name__ == "__main__":
    sys.exit(main())
