"""CPU: the BCQ table-lookup kernel (LUT-GEMM) against our uniform kernel at the same bits.

For each shape and bit width, both families are compiled from a few fixed points of their
design spaces (the same for every workload, listed in ``UNIFORM_CONFIGS`` / ``BCQ_CONFIGS``),
screened once, and the fastest of each is then timed in interleaved rounds (so machine noise
hits both alike); the table gives medians and the ratio. Weights are random (any bit pattern is
a valid code or sign plane); outputs of the first 64 columns are checked against float64
references. Alongside: each kernel's effective bandwidth (every byte it must read), the
machine's copy bandwidth with the same threads, and the instructions of each kernel's hot loop
per weight (read from its generated assembly: the loop body's instructions divided by the
weights one trip covers), which is what decides the race when neither is memory-bound.

    python tools/studies/bcq_vs_uniform_cpu.py --shapes 4096x11008,8192x28672 --bits 2,3,4 \\
        --threads 2 \\
        --json tools/results/bcq_cpu.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

import numpy as np


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2")
    parser.add_argument("--shapes", default="4096x11008,8192x28672")
    parser.add_argument("--bits", default="2,3,4")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--json", metavar="PATH")
    return parser.parse_args(argv)


ARGS = _parse_args(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None:  # TVM's thread pool reads this when it starts
    os.environ["TVM_NUM_THREADS"] = str(ARGS.threads)

import torch  # noqa: E402

import targets  # noqa: E402
from qcompile import _tvm  # noqa: E402
from qcompile.cli import parse_shape  # noqa: E402
from qcompile.formats import bitpack  # noqa: E402
from qcompile.formats.bcq import unpack_planes  # noqa: E402
from qcompile.kernels import BcqSpec, UniformSpec, get_family  # noqa: E402
from schedules.cpu import bcq as cpu_bcq  # noqa: E402
from schedules.cpu import uniform as cpu_uniform  # noqa: E402
from schedules.variants import compute_for  # noqa: E402
from tools.harness.bandwidth import cpu_copy  # noqa: E402

UNIFORM = get_family("uniform")
BCQ = get_family("bcq")

#: (label, sketch, tiles) for the uniform family.
UNIFORM_CONFIGS = [
    ("register_tile nb4 nr4", cpu_uniform.register_tile, {"n_blk": 4, "n_reg": 4}),
    ("k_blocked nb8 nr4 g4", cpu_uniform.k_blocked, {"n_blk": 8, "n_reg": 4, "g_in": 4}),
]
#: (label, mu, sketch, tiles) for the BCQ family.
BCQ_CONFIGS = [
    ("vector_lookup mu8 nb4 nr2", 8, cpu_bcq.vector_lookup, {"n_blk": 4, "n_reg": 2}),
    ("k_blocked mu8 nb8 nr2 g1", 8, cpu_bcq.k_blocked, {"n_blk": 8, "n_reg": 2, "g_in": 1}),
    ("vector_lookup mu4 nb4 nr2", 4, cpu_bcq.vector_lookup, {"n_blk": 4, "n_reg": 2}),
]
CHECK_COLUMNS = 64


def compile_kernel(family, spec, sketch, tiles, preset):
    hw = preset.hardware()
    sch = sketch(_tvm.Schedule(compute_for(spec, "cpu")), spec, hw, tiles)
    lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw)))
    return lib


def hot_loop(asm: str) -> list[str]:
    """Instructions of the kernel's inner loop: among the innermost loops (a label up to a
    backward jump to it, enclosing no other such loop) that do vector work, the longest."""
    lines = [line.strip() for line in asm.splitlines()]
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\.LBB\w+:", line)}
    loops = []
    for i, line in enumerate(lines):
        match = re.match(r"j\w+\s+(\.LBB\w+)", line)
        if match and labels.get(match.group(1), i + 1) <= i:
            loops.append((labels[match.group(1)], i))
    innermost = [(a, b) for a, b in loops
                 if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    best: list[str] = []
    for a, b in innermost:
        body = [item for item in lines[a + 1 : b + 1]
                if item and not item.startswith((".", "#")) and not item.endswith(":")]
        if any(item.startswith("v") for item in body) and len(body) > len(best):
            best = body
    return best


def loop_profile(asm: str, weights_per_trip: int) -> dict:
    body = hot_loop(asm)
    ops = [item.split()[0] for item in body]
    count = {name: sum(op.startswith(name) for op in ops)
             for name in ("vpextrd", "vinsertps", "vpgatherdd", "vgatherdps", "vfmadd",
                          "vcvtdq2ps", "vaddps", "vpand", "vpsrld", "vmovss")}
    return {"instructions": len(body), "weights_per_trip": weights_per_trip,
            "instructions_per_weight": len(body) / weights_per_trip,
            "counts": {k: v for k, v in count.items() if v}}


def uniform_weights_per_trip(spec: UniformSpec, tiles: dict, lanes: int) -> int:
    # one trip of the words loop: the word's fields times the register tile's columns
    return cpu_uniform.fields_per_word(spec.bits) * tiles["n_reg"] * lanes


def bcq_weights_per_trip(spec: BcqSpec, tiles: dict, lanes: int) -> int:
    # one trip of the chunk loop: per_word chunks of mu rows, every plane, the tile's columns
    return cpu_bcq.chunks_per_word(spec) * spec.mu * tiles["n_reg"] * lanes


def random_uniform(spec: UniformSpec, rng) -> dict:
    rows = bitpack.packed_length(spec.k, spec.bits)
    qweight = rng.integers(0, 1 << 32, size=(rows, spec.n), dtype=np.uint64).astype(
        np.uint32).view(np.int32)
    qzeros = rng.integers(0, 1 << 32, size=(spec.groups, bitpack.packed_length(
        spec.n, spec.bits)), dtype=np.uint64).astype(np.uint32).view(np.int32)
    scales = (0.005 + 0.01 * rng.random((spec.groups, spec.n))).astype(np.float16)
    return {"qweight": qweight, "scales": scales, "qzeros": qzeros}


def uniform_reference(spec: UniformSpec, tensors: dict, x: np.ndarray, cols: int) -> np.ndarray:
    from qcompile.formats.gptq import unpack_zeros

    words = bitpack.packed_length(cols, spec.bits)
    codes = bitpack.unpack(tensors["qweight"][:, :cols], spec.bits, spec.k).astype(np.float64)
    zeros = unpack_zeros(tensors["qzeros"][:, :words], spec.bits, cols, "v1").astype(np.float64)
    scales = tensors["scales"][:, :cols].astype(np.float64)
    g = np.arange(spec.k) // spec.group_size
    return x.astype(np.float64) @ (scales[g] * (codes - zeros[g]))


def bcq_reference(spec: BcqSpec, tensors: dict, x: np.ndarray, cols: int) -> np.ndarray:
    signs = unpack_planes(np.ascontiguousarray(tensors["planes"][:, :, :cols])).astype(np.float64)
    g = np.arange(spec.k) // spec.group_size
    alpha = tensors["alpha"][:, :, :cols].astype(np.float64)[g]          # [K, q, cols]
    weight = np.einsum("kic,ikc->kc", alpha, signs) + tensors["z"][:, :cols].astype(
        np.float64)[g]
    return x.astype(np.float64) @ weight


class Candidate:
    def __init__(self, label, family, spec, lib, tensors, profile):
        self.label, self.family, self.spec, self.profile = label, family, spec, profile
        self.function = lib[spec.name()]
        self.timer = lib.mod.time_evaluator(spec.name(), _tvm.tvm.cpu(), number=3, repeat=1)
        prepared = family.prepare(spec, **tensors)
        self.args = prepared.tensors
        self.y = torch.empty((1, spec.n))

    def run(self, x):
        self.function(x, *self.args, self.y)
        return self.y[0]

    def seconds(self, x) -> float:
        return self.timer(x, *self.args, self.y).mean


def workload(k: int, n: int, bits: int, preset, args, rng) -> dict:
    lanes = preset.hardware().fp32_lanes
    x_np = rng.standard_normal((1, k)).astype(np.float32)
    x = torch.from_numpy(x_np)
    row = {"k": k, "n": n, "bits": bits, "group_size": args.group_size}
    contenders = {}
    for family_name, configs in (("uniform", UNIFORM_CONFIGS), ("bcq", BCQ_CONFIGS)):
        screened = []
        tensors = None
        for config in configs:
            if family_name == "uniform":
                label, sketch, tiles = config
                spec = UniformSpec(k=k, n=n, bits=bits, group_size=args.group_size)
                tensors = tensors or random_uniform(spec, rng)
                per_trip = uniform_weights_per_trip(spec, tiles, lanes)
                family = UNIFORM
            else:
                label, mu, sketch, tiles = config
                spec = BcqSpec(k=k, n=n, q=bits, group_size=args.group_size, mu=mu)
                tensors = tensors or BCQ.example_tensors(spec, rng)
                per_trip = bcq_weights_per_trip(spec, tiles, lanes)
                family = BCQ
            lib = compile_kernel(family, spec, sketch, tiles, preset)
            profile = loop_profile(lib.mod.inspect_source("asm"), per_trip)
            cand = Candidate(label, family, spec, lib, tensors, profile)
            y = cand.run(x).numpy()[:CHECK_COLUMNS]
            reference = (uniform_reference if family_name == "uniform" else bcq_reference)(
                spec, tensors, x_np, CHECK_COLUMNS)[0]
            error = float(np.abs(y - reference).max() / np.abs(reference).max())
            screen = min(cand.seconds(x) for _ in range(2))
            screened.append((screen, cand, error))
            print(f"  {family_name:7s} {label:28s} screen {screen * 1e6:9.0f} us  "
                  f"{profile['instructions_per_weight']:.3f} instr/weight  err {error:.1e}",
                  flush=True)
        screen, best, error = min(screened, key=lambda item: item[0])
        contenders[family_name] = best
        row[family_name] = {"config": best.label, "spec": best.spec.name(),
                            "max_rel_error_first_cols": error, "hot_loop": best.profile,
                            "screened_us": {c.label: s * 1e6 for s, c, _ in screened}}
        # keep only the winner's weights alive
        for _, cand, _ in screened:
            if cand is not best:
                cand.args = None
    samples = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, cand in contenders.items():
            samples[name].append(cand.seconds(x))
    for name, cand in contenders.items():
        us = statistics.median(samples[name]) * 1e6
        nbytes = cand.family.bytes_read(cand.spec)
        row[name].update(median_us=us, bytes_read=nbytes, effective_gbps=nbytes / (us * 1e3))
    row["lut_speedup_vs_uniform"] = row["uniform"]["median_us"] / row["bcq"]["median_us"]
    return row


def main() -> int:
    args = ARGS
    preset = targets.get(args.target)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    copy = cpu_copy(args.threads)["gbps"]
    print(f"{args.target}, {args.threads} threads: copy bandwidth {copy:.1f} GB/s "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        k, n = parse_shape(shape)
        for bits in (int(b) for b in args.bits.split(",")):
            print(f"{k}x{n} {bits}-bit g{args.group_size}:", flush=True)
            row = workload(k, n, bits, preset, args, rng)
            rows.append(row)
            u, b = row["uniform"], row["bcq"]
            print(f"  => uniform {u['median_us']:9.0f} us {u['effective_gbps']:5.1f} GB/s | "
                  f"LUT {b['median_us']:9.0f} us {b['effective_gbps']:5.1f} GB/s | "
                  f"LUT speedup {row['lut_speedup_vs_uniform']:.2f}x | instr/weight "
                  f"{u['hot_loop']['instructions_per_weight']:.3f} vs "
                  f"{b['hot_loop']['instructions_per_weight']:.3f}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "target": args.target, "threads": args.threads, "rounds": args.rounds,
            "copy_bandwidth_gbps": copy, "load_average": os.getloadavg(),
            "workloads": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
