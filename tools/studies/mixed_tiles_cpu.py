"""Latency of the fused mixed 2/4/16 kernel over the outlier share, against our uniform 2-bit
and 4-bit kernels, and the effective bandwidth (bytes read / time) of fused vs uniform 4-bit.

CPU (default, ``--target avx2``): every kernel is its best record from ``--db`` when the
database has one, else the fastest of its family's untuned heuristic and a small sweep of fixed
register tiles (``--tiles``); those are then timed in interleaved rounds (medians, and the
fused/uniform ratio within each round).

``--activations float32,int8`` adds, in the same interleaved rounds, the int8-activation
kernels (``int8_activations=True``: x rounded per group, vpmaddubsw) of the fused kernel (0.2%
outliers) and of the uniform 4-bit kernel, and reports the fused kernel's effective bandwidth
as a share of the uniform 4-bit one's like for like (int8 / int8) and int8 fused against the
float32 uniform 4-bit kernel. An int8 kernel without a record is the faster of its untuned
heuristic and a few fixed points of its space (t_u, n_blk around the seeds).

The GPU run (tuning, the sync/async comparison, CUDA-graph timing) is
tools/studies/mixed_cuda_sweep.py, for the GPU machine.

    python tools/studies/mixed_tiles_cpu.py --target avx2 --shape 8192x28672 --json out.json
    python tools/studies/mixed_tiles_cpu.py --target avx2 --shape 8192x28672 \\
        --activations float32,int8
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import statistics
import sys
import tempfile

import numpy as np
import torch

import targets
from qcompile import _tvm
from qcompile.kernels import MixedSpec, UniformSpec, get_family
from qcompile.tensors import kernel_ready
from schedules.variants import compute_for
from tools.harness import results
from tools.harness.cpu_timing import time_calls

OUTLIER_SHARES = (0.0, 0.002, 0.005, 0.015)
#: The fused kernel's outlier share the issue's bandwidth goal names.
FUSED_SHARE = 0.002
DEFAULT_TILES = ((1, 4, 1), (1, 4, 2), (2, 4, 2), (1, 8, 1), (4, 2, 2))
ACTIVATIONS = ("float32", "int8")
#: Tiles per task tried around an int8 plan's seed (when they are candidates).
INT8_N_BLKS = (2, 8)


def _specs(k: int, n: int, m: int, group: int, g4: int, share4: float,
           activations=("float32",)) -> dict[str, object]:
    """Label -> spec. float32: uniform 4- and 2-bit and the mixed kernel at every outlier share
    (the labels of the float-only runs); int8: uniform 4-bit and the fused kernel, labels
    suffixed " int8"."""
    specs: dict[str, object] = {}
    if "float32" in activations:
        specs[f"uniform 4-bit g{group}"] = UniformSpec(k=k, n=n, m=m, bits=4, group_size=group)
        specs[f"uniform 2-bit g{group}"] = UniformSpec(k=k, n=n, m=m, bits=2, group_size=group)
        for share in OUTLIER_SHARES:
            specs[f"mixed {share:.1%} outliers"] = MixedSpec(k=k, n=n, m=m, g4=g4,
                                                             four_bit_share=share4,
                                                             outlier_share=share)
    if "int8" in activations:
        specs[f"uniform 4-bit g{group} int8"] = UniformSpec(
            k=k, n=n, m=m, bits=4, group_size=group, int8_activations=True)
        specs[f"mixed {FUSED_SHARE:.1%} outliers int8"] = MixedSpec(
            k=k, n=n, m=m, g4=g4, four_bit_share=share4, outlier_share=FUSED_SHARE,
            int8_activations=True)
    return specs


def _int8_space(spec):
    """The int8-activation design-space module of ``spec``'s family."""
    from schedules.cpu import mixed_int8, uniform_int8

    return mixed_int8 if spec.family == "mixed" else uniform_int8


def _int8_points(spec, hw) -> list[dict]:
    """Fixed points of an int8 space: each plan's seed, and with n_blk in :data:`INT8_N_BLKS`."""
    points = []
    for plan in _int8_space(spec).plans(spec, hw):
        seed = plan.seed_tiles()
        points.append(seed)
        points += [{**seed, "n_blk": v} for v in INT8_N_BLKS
                   if v in plan.n_blk.values and v != seed["n_blk"]]
    return points


def _int8_layout(spec, t_u: int):
    """The n_tiled layout of an int8 point of ``t_u`` vector tiles, or None (mixed: a tile that
    is not whole g2 groups keeps the format's layout)."""
    tile_n = t_u * 8
    if spec.family == "mixed" and tile_n % spec.g2:
        return None
    return {"kind": "n_tiled", "tile_n": tile_n}


def _cpu_candidates(spec, preset, hw, tiles, storage, out_dir) -> list[tuple]:
    """[(function, how, kernel or None, layout)] for ``spec``: the database's best record if
    there is one; else the family's untuned heuristic (each family's with its tiled weight
    layout) and one kernel per fixed tile of ``tiles`` (mixed: in the n_tiled layout of its
    accumulator tile, uniform: GPTQ's layout). A loaded kernel comes with its own ``prepare``
    (layouts); the caller keeps the fastest candidate."""
    import qcompile
    from qcompile.build import build, build_untuned
    from qcompile.errors import NoRecordError
    from schedules.cpu import mixed as cpu_mixed
    from schedules.cpu import uniform as cpu_uniform

    if storage is not None:
        try:
            kernel = qcompile.load(build(spec, preset, out_dir, storage=storage).so_path)
            return [(kernel.function, "tuned record", kernel, kernel.layout)]
        except NoRecordError:
            pass
    kernel = qcompile.load(build_untuned(spec, preset, out_dir).so_path)
    candidates = [(kernel.function, "untuned heuristic", kernel, kernel.layout)]
    mod = _tvm.normalize_mod(compute_for(spec, "cpu"))
    target = _tvm.Target(preset.tvm_target(hw))
    if spec.int8_activations:
        space = _int8_space(spec)
        for point in _int8_points(spec, hw):
            sch = _tvm.Schedule(mod)
            layout = _int8_layout(spec, point["t_u"])
            if layout is not None:
                sch = space.with_layout(sch, spec, point["t_u"])
            sch = space.register_tile(sch, spec, hw, point)
            lib = _tvm.tvm.compile(sch.mod, target=target)
            candidates.append((lib[spec.name()], "int8 " + " ".join(
                f"{k}={v}" for k, v in sorted(point.items())), None, layout))
        return candidates
    sketch = cpu_mixed.register_tile if spec.family == "mixed" else cpu_uniform.register_tile
    seen = set()
    for blk, reg, *rest in tiles:
        chosen = {"n_blk": blk, "n_reg": reg}
        if spec.family == "mixed" and rest:
            chosen["g_unroll"] = rest[0]
        key = tuple(sorted(chosen.items()))
        if key in seen:
            continue
        seen.add(key)
        sch = _tvm.Schedule(mod)
        layout = None
        if spec.family == "mixed" and reg in cpu_mixed.tile_widths(spec, hw):
            tile_n = reg * cpu_mixed.vector_lanes(spec, hw)
            sch = cpu_mixed.with_layout(sch, spec, tile_n)
            layout = {"kind": "n_tiled", "tile_n": tile_n}
        sch = sketch(sch, spec, hw, chosen)
        lib = _tvm.tvm.compile(sch.mod, target=target)
        candidates.append((lib[spec.name()], "tiles " + " ".join(f"{k}={v}" for k, v in key)
                           + (f" n_tiled {layout['tile_n']}" if layout else ""), None, layout))
    return candidates


def bench_cpu(args) -> dict:
    preset = targets.get(args.target)
    hw = preset.hardware()
    torch.set_num_threads(hw.cores)
    storage = None
    if args.db:
        from tuning_db import Storage

        storage = Storage(args.db)
    k, n = args.shape
    specs = _specs(k, n, args.batch, args.group_size, args.g4, args.four_bit_share,
                   args.activations)
    rng = np.random.default_rng(0)
    x = kernel_ready(torch.from_numpy(rng.standard_normal((args.batch, k)).astype(np.float32)))
    chosen = {}
    out_dir = tempfile.mkdtemp(prefix="qcompile-bench-mixed-")
    for label, spec in specs.items():
        family = get_family(spec.family)
        tensors = family.example_tensors(spec, rng)
        y = torch.empty((args.batch, n), dtype=torch.float32)
        best = None
        for function, desc, kernel, layout in _cpu_candidates(spec, preset, hw, args.tiles,
                                                              storage, out_dir):
            if kernel is not None:
                prepared = kernel.prepare(**tensors)
            elif layout is not None:
                prepared = family.prepare(spec, **tensors, layout=layout)
            else:
                prepared = family.prepare(spec, **tensors)
            seconds = min(time_calls(lambda f=function, p=prepared, o=y: f(x, *p.tensors, o),
                                     3, warmup=2)
                          for _ in range(3))
            if best is None or seconds < best[0]:
                best = (seconds, function, desc, prepared)
        chosen[label] = (spec, best[3], y, best[1], best[2])
        print(f"  {label:28s} {best[0] * 1e6:10.1f} us  ({best[2]})", file=sys.stderr)
    samples = {label: [] for label in chosen}
    for _ in range(args.rounds):
        for label, (_, prepared, y, function, _) in chosen.items():
            samples[label].append(time_calls(
                lambda f=function, p=prepared, o=y: f(x, *p.tensors, o),
                                        args.calls, warmup=2))
    rows = []
    for label, (spec, _, _, _, desc) in chosen.items():
        median = statistics.median(samples[label])
        nbytes = get_family(spec.family).bytes_read(spec)
        activations = "int8" if getattr(spec, "int8_activations", False) else "float32"
        rows.append({"kernel": label, "spec": spec.name(), "activations": activations,
                     "schedule": desc, "median_us": median * 1e6, "bytes": nbytes,
                     "effective_gbps": nbytes / median / 1e9,
                     "rounds_us": [t * 1e6 for t in samples[label]]})
    return {"target": preset.name, "threads": hw.cores, "shape": [k, n], "batch": args.batch,
            "activations": list(args.activations), "rounds": args.rounds,
            "calls_per_round": args.calls, "rows": rows}


def _bandwidth_share(fused: dict, base: dict) -> dict:
    """``fused``'s effective bandwidth as a share of ``base``'s: from the medians, and within
    each round (both kernels a few ms apart), then the median and range over rounds: robust to
    load that drifts between rounds."""
    paired = [(fused["bytes"] / f) / (base["bytes"] / u)
              for f, u in zip(fused["rounds_us"], base["rounds_us"], strict=True)]
    return {"medians": fused["effective_gbps"] / base["effective_gbps"],
            "paired": statistics.median(paired), "paired_range": [min(paired), max(paired)]}


def summarise(report: dict) -> dict:
    """Ratios the issue asks for: fused (0.2%) vs uniform 4-bit bandwidth, latency by share;
    with int8 rows, the same bandwidth share int8 vs int8 and int8 fused vs float32 uniform."""
    rows = {row["kernel"]: row for row in report["rows"]}

    def find(prefix: str, activations: str):
        return next((row for label, row in rows.items() if label.startswith(prefix)
                     and row.get("activations", "float32") == activations), None)

    fused_label = f"mixed {FUSED_SHARE:.1%} outliers"
    summary: dict = {}
    four, fused = find("uniform 4-bit", "float32"), rows.get(fused_label)
    if four is not None and fused is not None:
        two, base = find("uniform 2-bit", "float32"), rows[f"mixed {0.0:.1%} outliers"]
        share = _bandwidth_share(fused, four)
        summary.update({
            "fused_vs_uniform4_bandwidth": share["medians"],
            "fused_vs_uniform4_bandwidth_paired": share["paired"],
            "fused_vs_uniform4_bandwidth_paired_range": share["paired_range"],
            "fused_vs_uniform4_latency": fused["median_us"] / four["median_us"],
            "fused_vs_uniform2_latency": fused["median_us"] / two["median_us"],
            "outlier_slowdown": {label: row["median_us"] / base["median_us"]
                                 for label, row in rows.items()
                                 if label.startswith("mixed")
                                 and row.get("activations", "float32") == "float32"},
        })
    four8, fused8 = find("uniform 4-bit", "int8"), rows.get(f"{fused_label} int8")
    if four8 is not None and fused8 is not None:
        summary["fused_int8_vs_uniform4_int8_bandwidth"] = _bandwidth_share(fused8, four8)
        summary["fused_int8_vs_uniform4_int8_latency"] = (fused8["median_us"]
                                                          / four8["median_us"])
    if four is not None and fused8 is not None:
        summary["fused_int8_vs_uniform4_float_bandwidth"] = _bandwidth_share(fused8, four)
    if fused is not None and fused8 is not None:
        summary["fused_int8_speedup_over_float"] = fused["median_us"] / fused8["median_us"]
    return summary


def _share_line(what: str, share: dict) -> str:
    return (f"  {what}: {share['medians']:.1%} (medians); per round: median "
            f"{share['paired']:.1%}, range {share['paired_range'][0]:.1%}.."
            f"{share['paired_range'][1]:.1%}")


def _activations(text: str) -> tuple[str, ...]:
    kinds = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in kinds if a not in ACTIVATIONS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown activations {unknown or [text]}; known: "
                                         f"{', '.join(ACTIVATIONS)}")
    return kinds


def main(argv=None) -> int:
    from qcompile.cli import add_db_argument, parse_shape

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=sorted(targets.PRESETS))
    parser.add_argument("--shape", type=parse_shape, default=parse_shape("8192x28672"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=128,
                        help="group size of the uniform kernels (default 128)")
    parser.add_argument("--g4", type=int, default=64)
    parser.add_argument("--four-bit-share", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5, help="calls per kernel per round")
    parser.add_argument("--tiles", type=lambda s: tuple(tuple(int(v) for v in t.split("x"))
                                                        for t in s.split(",")),
                        default=DEFAULT_TILES,
                        help="CPU: n_blk x n_reg x g_unroll list (g_unroll: mixed only), "
                             "e.g. 1x4x2,2x4x1")
    parser.add_argument("--activations", type=_activations, default=("float32",),
                        help="float32 and/or int8 (the integer dot-product kernels of the "
                             "fused 0.2%% and uniform 4-bit kernels), e.g. float32,int8 "
                             "(default float32)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    add_db_argument(parser)
    args = parser.parse_args(argv)
    report = bench_cpu(args)
    report["summary"] = summarise(report)
    print(f"{report['shape'][0]}x{report['shape'][1]}, M={report['batch']}, {report['target']} "
          f"({report['threads']} threads), {report['rounds']} interleaved rounds")
    for row in report["rows"]:
        print(f"  {row['kernel']:28s} {row['median_us']:10.1f} us  {row['effective_gbps']:6.1f} "
              f"GB/s  {row['bytes'] / 2**20:8.1f} MiB  {row['schedule']}")
    s = report["summary"]
    if "fused_vs_uniform4_bandwidth" in s:
        print(_share_line("fused (0.2%) / uniform 4-bit effective bandwidth", {
            "medians": s["fused_vs_uniform4_bandwidth"],
            "paired": s["fused_vs_uniform4_bandwidth_paired"],
            "paired_range": s["fused_vs_uniform4_bandwidth_paired_range"]}))
        print("  outlier slowdown vs 0%: " + ", ".join(
            f"{label.split()[1]} {v:.3f}" for label, v in s["outlier_slowdown"].items()))
    if "fused_int8_vs_uniform4_int8_bandwidth" in s:
        print(_share_line("int8 x: fused (0.2%) / uniform 4-bit effective bandwidth",
                          s["fused_int8_vs_uniform4_int8_bandwidth"]))
    if "fused_int8_vs_uniform4_float_bandwidth" in s:
        print(_share_line("fused int8 x / uniform 4-bit float32 x effective bandwidth",
                          s["fused_int8_vs_uniform4_float_bandwidth"]))
    if "fused_int8_speedup_over_float" in s:
        print(f"  fused: float32 x / int8 x latency: {s['fused_int8_speedup_over_float']:.2f}x")
    if args.json:
        results.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
