"""Probe: the torch dequantization of the GPU's prefill path
(``qcompile.kernels.uniform.dense_torch.dequantize_on_device``) timed on its own, on the CPU or a
GPU, optionally against the same function of an earlier commit loaded from git in the same
process (``--against COMMIT``). Each output is checked against the numpy reference weight first.

    python tools/studies/dense_dequant_probe.py --shapes 4096x11008 --bits 3,4 --against a87a05d
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository

import argparse
import dataclasses
import importlib.util
import subprocess
import tempfile
import time
from pathlib import Path

MODULE = "qcompile/kernels/uniform/dense_torch.py"


def load_version(commit: str, scratch: Path):
    """dense_torch.py as it was at ``commit``, imported as a module of its own."""
    root = Path(__file__).resolve().parents[2]
    text = subprocess.run(["git", "show", f"{commit}:{MODULE}"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = scratch / f"dense_torch_{commit}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="4096x11008")
    parser.add_argument("--bits", default="3,4")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", metavar="COMMIT", help="also time this commit's version")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from qcompile.kernels import UniformSpec, get_family
    from qcompile.kernels.uniform import dense_torch

    torch.set_num_threads(args.threads)
    family = get_family("uniform")
    with tempfile.TemporaryDirectory() as scratch:
        versions = {"current": dense_torch}
        if args.against:
            versions[args.against] = load_version(args.against, Path(scratch))
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            for bits in (int(b) for b in args.bits.split(",")):
                spec = UniformSpec(k=k, n=n, bits=bits, group_size=128)
                tensors = family.example_tensors(spec, np.random.default_rng(k + bits))
                prepared = family.prepare(spec, **tensors)
                prepared = dataclasses.replace(prepared, tensors=tuple(
                    t.to(args.device) for t in prepared.tensors))
                want = torch.from_numpy(family.reference_weight(spec, **tensors)).half()
                out = torch.empty((k, n), dtype=torch.float16, device=args.device)
                best = {}
                for _ in range(args.repeats):  # the versions alternate
                    for name, module in versions.items():
                        out.zero_()
                        if args.device != "cpu":
                            torch.cuda.synchronize()
                        started = time.perf_counter()
                        module.dequantize_on_device(spec, prepared, torch.float16, out=out)
                        if args.device != "cpu":
                            torch.cuda.synchronize()
                        seconds = time.perf_counter() - started
                        if not torch.equal(out.cpu(), want):
                            raise SystemExit(f"{name} {spec.name()}: not the reference weight")
                        best[name] = min(best.get(name, seconds), seconds)
                print(f"{shape} {bits}-bit to fp16 on {args.device}: " + ", ".join(
                    f"{name} {1e3 * s:.1f} ms" for name, s in best.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
