"""GPU (H200) run of the mixed 2/4/16 family, in one command: tune, check, time.

1. With ``--tune-trials N``: MetaSchedule tunes every workload over its CUDA design space
   (uniform 4-bit and 2-bit g=128, mixed at every outlier share; the mixed space holds both
   dequantization orders) into ``--db`` (a local SQLite file).
2. Section 5's comparison and the layout sweep: the mixed kernel (0.2% outliers) in each
   order, ``sync`` and ``async``, in both K-lane layouts (schedules/cuda/mixed.py's sketches),
   over a grid of knobs (built in, or ``--variants FILE``: a JSON list of ``{"sketch": ...,
   "knobs": {...}}``); the variants are built in a process pool (``--jobs``) and the best of each
   order is reported.
3. Every kernel is checked against a float64 reference (random valid operands, output poisoned)
   and timed by tools/harness/cuda_timing.py: CUDA graphs of back-to-back calls, weights rotating
   over enough copies to exceed the L2 three times, interleaved rounds, medians.

The summary gives the fused (0.2%) kernel's effective bandwidth (bytes read / time) as a share of
the uniform 4-bit kernel's, the latency at each outlier share relative to none, and sync vs
async.

    python tools/studies/mixed_cuda_sweep.py --db sqlite:////tmp/qc/mixed.sqlite --tune-trials 32 \\
        --shape 8192x28672 --json $OUT/mixed_h200.json

The sweep alone (uniform 4-bit, the mixed heuristic and the grid; no tuning, a few minutes):

    python tools/studies/mixed_cuda_sweep.py --sweep-only --shape 8192x28672 --json $OUT/mixed.json

``--activations float32,int8`` runs every workload and the sweep for each kind of x: ``int8``
takes the dp4a kernels (x rounded to int8 per row and group: uniform/compute_cuda_int8.py,
mixed/compute_cuda_int8.py), checked against the float64 product of the rounded x, and its
bandwidth share compares the int8 kernels with each other (label suffix " x int8").
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

import targets
from qcompile import _tvm
from qcompile.cli import parse_shape
from qcompile.kernels import MixedSpec, UniformSpec, get_family
from qcompile.kernels.layouts import mixed as weight_layout
from schedules.cuda import mixed as cuda_mixed
from schedules.cuda import mixed_int8 as cuda_mixed_int8
from schedules.variants import compute_for
from tools.harness.cuda_timing import GraphTimer as Timed
from tools.harness.cuda_timing import copies_for, prepare_all
from tools.harness.loading import load
from tuning_db import Storage

OUTLIER_SHARES = (0.0, 0.002, 0.005, 0.015)


#: Label suffix of the int8-activation workloads.
INT8 = " x int8"


def workloads(k: int, n: int, m: int, g4: int, int8: bool = False) -> dict[str, object]:
    """{label: spec}: uniform 4- and 2-bit g128, mixed at every outlier share; ``int8``: the
    int8-activation kernels, labels ending in :data:`INT8`."""
    suffix = INT8 if int8 else ""
    specs: dict[str, object] = {
        f"uniform 4-bit g128{suffix}": UniformSpec(k=k, n=n, m=m, bits=4, group_size=128,
                                                   int8_activations=int8),
        f"uniform 2-bit g128{suffix}": UniformSpec(k=k, n=n, m=m, bits=2, group_size=128,
                                                   int8_activations=int8),
    }
    for share in OUTLIER_SHARES:
        specs[f"mixed {share:.1%} outliers{suffix}"] = MixedSpec(
            k=k, n=n, m=m, g4=g4, outlier_share=share, int8_activations=int8)
    return specs


def reference_of(spec, x: np.ndarray, tensors: dict) -> np.ndarray:
    """float64 output of what ``spec``'s kernel computes: x @ W, with x rounded to int8 per
    row and group for int8-activation kernels (the outliers of mixed ones take the float x)."""
    family = get_family(spec.family)
    if not spec.int8_activations:
        return family.reference(spec, x, **tensors)
    if spec.family == "mixed":
        return family.kernel_reference(spec, x, **tensors)
    from tools.harness.product import quantized_activations

    weight = family.reference_weight(spec, **tensors).astype(np.float64)
    return quantized_activations(x, spec.group_size) @ weight


def space_of(spec: MixedSpec):
    """The CUDA design-space module of ``spec`` (float or int8 activations)."""
    return cuda_mixed_int8 if spec.int8_activations else cuda_mixed


#: The built-in sweep: {layout: (k_lanes, n_lanes, load_groups) grids}; every order of
#: schedules/cuda/mixed.py runs each, in both K-lane layouts.
GRID = {
    cuda_mixed.K_WARPS: ((16, 32), (4, 8, 16), (1, 2, 4)),
    "": ((8,), (32,), (1, 4)),
}


def variants_grid(spec: MixedSpec, preset, grid=None) -> list[dict]:
    """[{"sketch", "knobs"}]: every order and layout of ``grid`` (default :data:`GRID`), knob
    values that are not candidates for ``spec`` and blocks over 1024 threads left out, the
    heuristic's own choice first in each order."""
    hw = preset.hardware()
    cands = cuda_mixed.knob_candidates(spec)
    out = []
    for order in cuda_mixed.ORDERS:
        name, knobs = cuda_mixed.heuristic_knobs(spec, hw, order)
        out.append({"sketch": name, "knobs": knobs})
        for suffix, (kls, nls, lgs) in (grid or GRID).items():
            for kl, nl, lg in itertools.product(kls, nls, lgs):
                knobs = {"k_lanes": kl, "n_lanes": nl, "load_groups": lg, "unroll": 64}
                variant = {"sketch": order + suffix, "knobs": knobs}
                if (kl in cands["k_lanes"] and nl in cands["n_lanes"]
                        and lg in cands["load_groups"] and kl * nl <= 1024
                        and variant not in out):
                    out.append(variant)
    return out


def build_variant(spec_json: str, target: str, variant: dict, out_dir: str) -> dict:
    """Compile one variant into ``out_dir`` (a process-pool job): {"so", "seconds"} or
    {"error"}."""
    t0 = time.monotonic()
    try:
        spec = MixedSpec.from_dict(json.loads(spec_json))
        preset = targets.get(target)
        hw = preset.hardware()
        mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
        sch = space_of(spec).sketch(_tvm.Schedule(mod), spec, hw, variant["sketch"],
                                    variant["knobs"])
        lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw)))
        knobs = "_".join(f"{v}" for v in variant["knobs"].values())
        kind = "xi8_" if spec.int8_activations else ""
        so = Path(out_dir) / f"{kind}{variant['sketch'].replace('+', '_')}_{knobs}.so"
        lib.export_library(str(so))
        return {"so": str(so), "seconds": time.monotonic() - t0,
                "ptxas": _ptxas(lib, hw.arch)}
    except Exception as error:  # noqa: BLE001 - a failed variant is reported, not fatal
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[-1][:300]}",
                "seconds": time.monotonic() - t0}


def _ptxas(lib, arch: str) -> dict | None:
    """ptxas's registers and spills for the generated CUDA C (None where that fails)."""
    from qcompile.testing.cuda_emulator import ptxas_report

    try:
        device = next(m for m in lib.mod.imports if m.kind == "cuda")
        for fmt in ("cu", ""):
            source = device.inspect_source(fmt)
            if "__global__" in source:
                return ptxas_report(source, arch)
    except Exception:  # noqa: BLE001 - a report, not a requirement
        return None
    return None


def build_variants(specs: list[MixedSpec], preset, variants: list[dict], out_dir: Path,
                   jobs: int) -> list[dict]:
    """Every variant built, for its spec (``specs[i]`` for variants ``i``), in a pool of
    ``jobs`` processes (spawned: the parent has CUDA)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(build_variant, spec.to_json(), preset.name, v, str(out_dir))
                   for spec, v in zip(specs, variants, strict=True)]
        return [future.result() for future in futures]


def timed_kernel(label, function, spec, x, l2, tensors, kernel=None, reference=None,
                 prepared=None):
    """(Timed, max relative error) of ``function`` on the family's random valid operands,
    prepared by ``kernel`` (a loaded kernel knows its weight layout) or by the family;
    ``reference`` (the float64 x @ W on the GPU) and ``prepared`` are computed when not given."""
    family = get_family(spec.family)
    if prepared is None:
        prepared = (kernel.prepare(**tensors) if kernel is not None
                    else family.prepare(spec, device="cuda", **tensors))
    if reference is None:
        reference = torch.from_numpy(reference_of(spec, x.cpu().numpy(), tensors)).cuda()
    y = torch.full((spec.m, spec.n), float("nan"), device="cuda")
    function(x, *prepared.tensors, y)
    torch.cuda.synchronize()
    error = ((y.double() - reference).abs().max() / reference.abs().max()).item()
    copies = [prepared.tensors] + [tuple(t.clone() for t in prepared.tensors)
                                   for _ in range(copies_for(prepared.nbytes(), l2) - 1)]
    timed = Timed(label, [lambda w=w: function(x, *w, y) for w in copies],
                  family.bytes_read(spec))
    return timed, error


def _suffix(label: str) -> str:
    return INT8 if label.endswith(INT8) else ""


def _summary(rows: dict, suffix: str) -> dict:
    """One kind of x: the fused (0.2%) kernel's and the sweep's best effective bandwidth as
    shares of the uniform 4-bit kernel's (same kind of x), outlier costs, sync vs async."""
    four = rows["uniform 4-bit g128" + suffix]
    fused = rows["mixed 0.2% outliers" + suffix]
    ours = [r for r in rows.values() if r.get("order") and _suffix(r["kernel"]) == suffix]
    best = {order: min((r for r in ours if r["order"] == order), key=lambda r: r["median_us"])
            for order in cuda_mixed.ORDERS if any(r["order"] == order for r in ours)}

    def described(row):
        return {"sketch": row["sketch"], "knobs": row["knobs"], "ptxas": row["ptxas"],
                "median_us": row["median_us"],
                "effective_gbps": row["effective_gbps"],
                "vs_uniform4_bandwidth": row["effective_gbps"] / four["effective_gbps"]}

    none = rows.get("mixed 0.0% outliers" + suffix)
    return {
        "uniform4_gbps": four["effective_gbps"],
        "uniform4_us": four["median_us"],
        "fused_vs_uniform4_bandwidth": fused["effective_gbps"] / four["effective_gbps"],
        "fused_vs_uniform4_latency": fused["median_us"] / four["median_us"],
        "outlier_slowdown": ({label: row["median_us"] / none["median_us"]
                              for label, row in rows.items() if label.startswith("mixed")
                              and "outliers" in label and _suffix(label) == suffix}
                             if none else None),
        **{f"{order}_best": described(row) for order, row in best.items()},
        "best_vs_uniform4_bandwidth": max(
            (r["effective_gbps"] for r in best.values()), default=0) / four["effective_gbps"],
        "async_speedup_over_sync": (best["sync"]["median_us"] / best["async"]["median_us"]
                                    if len(best) == 2 else None),
    }


def self_check() -> int:
    """The sweep's grid holds the heuristic of each order first and only candidate knobs; its
    variants build in a process pool, a non-candidate knob failing with the reason. Needs no GPU
    (was a test in tests/cpu/test_mixed_cuda.py: tests never import tools)."""
    preset = targets.get("cuda")
    hw = preset.hardware()
    spec = MixedSpec(k=8192, n=28672)
    variants = variants_grid(spec, preset)
    cands = cuda_mixed.knob_candidates(spec)
    for order in cuda_mixed.ORDERS:
        mine = [v for v in variants if cuda_mixed.split_sketch(v["sketch"])[0] == order]
        name, knobs = cuda_mixed.heuristic_knobs(spec, hw, order)
        assert mine[0] == {"sketch": name, "knobs": knobs}, mine[0]
        assert {v["sketch"] for v in mine} == {order, order + cuda_mixed.K_WARPS}
    assert all(v["knobs"][k] in cands[k] for v in variants for k in cands)
    assert len(variants) == len({str(v) for v in variants}) <= 48  # a few minutes on the GPU
    small = MixedSpec(k=1024, n=256)
    knobs = {"k_lanes": 4, "n_lanes": 8, "load_groups": 1, "unroll": 64}
    chosen = [{"sketch": "sync+k_warps", "knobs": {**knobs, "load_groups": 4}},
              {"sketch": "async", "knobs": {**knobs, "k_lanes": 3}}]
    built = build_variants([small, small], preset, chosen,
                           Path(tempfile.mkdtemp(prefix="qcompile-mixed-check-")), jobs=2)
    assert Path(built[0]["so"]).is_file(), built[0]
    assert "k_lanes=3 is not a candidate" in built[1]["error"], built[1]
    print(f"self-check: {len(variants)} grid variants valid; the pool builds and reports")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--db", metavar="URL", help="tuning database (tuned records, and where "
                                                    "--tune-trials writes)")
    parser.add_argument("--tune-trials", type=int, default=0,
                        help="tune every workload first with this many trials (default 0)")
    parser.add_argument("--shape", type=parse_shape, default=parse_shape("8192x28672"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--g4", type=int, default=64)
    parser.add_argument("--sweep-only", action="store_true",
                        help="time only uniform 4-bit, the mixed 0.2%% heuristic and the sweep")
    parser.add_argument("--variants", metavar="FILE",
                        help='JSON list of {"sketch": ..., "knobs": {...}} to sweep instead of '
                             "the built-in grid")
    for knob in ("k-lanes", "n-lanes", "load-groups"):
        parser.add_argument(f"--sweep-{knob}", metavar="V,V,...",
                            help=f"{knob} values of the grid (both layouts; default: the "
                                 "built-in GRID)")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes building the sweep's variants")
    parser.add_argument("--activations", default="float32",
                        help="comma list of float32, int8: the kinds of x to run (default "
                             "float32)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--self-check", action="store_true",
                        help="check the built-in grid and the build pool (no GPU) and exit")
    args = parser.parse_args(argv)
    if args.self_check:
        return self_check()
    preset = targets.get(args.target)
    if preset.kind != "cuda" or not torch.cuda.is_available():
        parser.error("this tool runs on a GPU machine with a CUDA preset")
    storage = Storage(args.db) if args.db else None
    k, n = args.shape
    kinds = args.activations.split(",")
    if not kinds or set(kinds) - {"float32", "int8"}:
        parser.error(f"--activations takes float32 and/or int8; got {args.activations!r}")
    suffixes = [INT8 if kind == "int8" else "" for kind in kinds]
    specs = {}
    for kind in kinds:
        specs.update(workloads(k, n, args.batch, args.g4, kind == "int8"))
    if args.sweep_only:
        specs = {label + suffix: specs[label + suffix] for suffix in suffixes
                 for label in ("uniform 4-bit g128", "mixed 0.2% outliers")}
    started = time.monotonic()
    sweep_specs = {suffix: specs["mixed 0.2% outliers" + suffix] for suffix in suffixes}
    if args.variants:
        listed = json.loads(Path(args.variants).read_text())
        variants = [{**v, "activations": kind} for kind in kinds for v in listed]
    else:
        grid = {suffix: tuple(
            [int(v) for v in override.split(",")] if override else values
            for override, values in zip((args.sweep_k_lanes, args.sweep_n_lanes,
                                         args.sweep_load_groups), knobs, strict=True))
            for suffix, knobs in GRID.items()}
        variants = [{**v, "activations": kind}
                    for kind, suffix in zip(kinds, suffixes, strict=True)
                    for v in variants_grid(sweep_specs[suffix], preset, grid)]
    variant_specs = [sweep_specs[INT8 if v["activations"] == "int8" else ""] for v in variants]
    out_dir = Path(tempfile.mkdtemp(prefix="qcompile-mixed-"))
    built = build_variants(variant_specs, preset, variants, out_dir / "variants", args.jobs)
    print(f"built {sum('so' in b for b in built)}/{len(built)} variants in "
          f"{time.monotonic() - started:.0f} s ({args.jobs} processes)", flush=True)
    tuning = []
    if args.tune_trials:
        from qcompile.tune import tune

        if storage is None:
            parser.error("--tune-trials needs --db")
        for label, spec in specs.items():
            t0 = time.monotonic()
            summary = tune(spec, preset, trials=args.tune_trials, storage=storage,
                           progress=False)
            tuning.append({"kernel": label, "trials": summary.trials,
                           "failed": summary.failed, "best_us": summary.best_us,
                           "seconds": time.monotonic() - t0})
            print(f"tuned {label}: {summary.trials} trials, best {summary.best_us} us",
                  flush=True)

    rng = np.random.default_rng(0)
    x = torch.randn(args.batch, k, device="cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    timed, rows = [], {}
    family = get_family("mixed")
    # per kind of x: the sweep's operands (in the layout its kernels read) and reference
    sweep = {}
    for suffix, spec in sweep_specs.items():
        tensors = family.example_tensors(spec, rng)
        layout = weight_layout.plane_words() if spec.int8_activations else None
        sweep[suffix] = {
            "tensors": tensors,
            "reference": torch.from_numpy(reference_of(spec, x.cpu().numpy(), tensors)).cuda(),
            "prepared": family.prepare(spec, device="cuda", layout=layout, **tensors)}
    for label, spec in specs.items():
        swept = sweep[_suffix(label)] if spec == sweep_specs[_suffix(label)] else None
        tensors = (swept["tensors"] if swept
                   else get_family(spec.family).example_tensors(spec, rng))
        kernel, origin = load(spec, preset.name, db=args.db)
        t, error = timed_kernel(label, kernel.function, spec, x, l2, tensors, kernel,
                                reference=swept["reference"] if swept else None)
        timed.append(t)
        rows[label] = {"kernel": label, "spec": spec.name(), "origin": origin,
                       "max_rel_error": error}
    print(f"baselines ready at {time.monotonic() - started:.0f} s", flush=True)
    failed = []
    for variant, result, spec in zip(variants, built, variant_specs, strict=True):
        suffix = INT8 if spec.int8_activations else ""
        knobs = variant["knobs"]
        label = (f"{variant['sketch']} k{knobs['k_lanes']} n{knobs['n_lanes']} "
                 f"lg{knobs['load_groups']} u{knobs['unroll']}{suffix}")
        row = {"kernel": label, "order": cuda_mixed.split_sketch(variant["sketch"])[0],
               "activations": variant["activations"],
               "sketch": variant["sketch"], "knobs": knobs,
               "build_seconds": result["seconds"], "ptxas": result.get("ptxas")}
        try:
            if "error" in result:
                raise RuntimeError(result["error"])
            function = _tvm.tvm.runtime.load_module(result["so"])[spec.name()]
            t, error = timed_kernel(label, function, spec, x, l2, sweep[suffix]["tensors"],
                                    reference=sweep[suffix]["reference"],
                                    prepared=sweep[suffix]["prepared"])
        except Exception as problem:  # noqa: BLE001 - report the variant, go on
            failed.append({**row, "error": str(problem)[:300]})
            print(f"  {label}: FAILED {str(problem)[:200]}", flush=True)
            continue
        if not error < 1e-4:
            failed.append({**row, "error": f"max relative error {error:.2e}"})
            print(f"  {label}: WRONG (max relative error {error:.2e})", flush=True)
            continue
        timed.append(t)
        rows[label] = {**row, "max_rel_error": error}
    print(f"{len(rows)} kernels loaded and checked at {time.monotonic() - started:.0f} s",
          flush=True)
    prepare_all(timed)
    for _ in range(args.rounds):
        for t in timed:
            t.sample()
    for t in timed:
        rows[t.name].update(t.result())
        rows[t.name]["effective_gbps"] = t.bytes_read / (rows[t.name]["median_us"] * 1e3)

    summary = {kind: _summary(rows, suffix) for kind, suffix in zip(kinds, suffixes,
                                                                     strict=True)}
    summary.update(variants=len(variants), variants_failed=len(failed),
                   max_rel_error=max(r["max_rel_error"] for r in rows.values()),
                   seconds=time.monotonic() - started)
    for row in rows.values():
        registers = (row.get("ptxas") or {}).get("registers", "")
        print(f"  {row['kernel']:52s} {row['median_us']:9.2f} us {row['effective_gbps']:8.0f} "
              f"GB/s  err {row['max_rel_error']:.1e}  regs {registers}")
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(0), "shape": [k, n],
                       "batch": args.batch, "rounds": args.rounds, "tuning": tuning,
                       "rows": list(rows.values()), "failed": failed, "summary": summary},
                      handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
