"""Time chosen points of the uniform family's CUDA design space on a GPU, in one run: the
untuned heuristic against hand-picked sketches and knobs, per shape and M.

What ``tools/studies/tune_cuda.py`` does by sampling, this does by enumeration, for the decisions
behind
the heuristic (``schedules.cuda.uniform.heuristic_knobs``): every variant is built with its knobs
pinned (``uniform.sketch(..., fixed=knobs)``) in a pool of processes, each ``.so`` compiled for
this GPU as it is built, then each is checked against the float64 reference and timed the way
tools/harness/cuda_timing.py times (CUDA graphs of back-to-back calls over weight copies that exceed
the L2 three times, medians of interleaved rounds).

    python tools/studies/sweep_cuda.py --json sweep.json
    python tools/studies/sweep_cuda.py --shapes 8192x28672 --batches 1 --variants variants.json

``--activations int8`` sweeps the int8-activation kernels (schedules/cuda/uniform_int8.py)
instead, checked against the product of the int8-rounded x.

``--variants`` takes a JSON list of ``{"sketch": ..., "knobs": {...}}``, each with an optional
``"m"`` (then only for that M; else for every shape and M where the knobs are candidates);
without it the built-in list below is used.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SHAPES = "8192x28672,28672x8192,8192x8192,4096x4096"
BATCHES = "1,4,16"


def builtin_variants(m: int) -> list[dict]:
    """Hand-picked points around the heuristic for a given M (the heuristic is added first)."""
    kw = "+k_warps"

    def knobs(k_lanes, n_lanes, m_lanes, load_words, n_vecs=1, unroll=64):
        return dict(k_lanes=k_lanes, n_lanes=n_lanes, n_vecs=n_vecs, m_lanes=m_lanes,
                    load_words=load_words, unroll=unroll)

    if m == 1:
        out = [{"sketch": "x_registers" + kw, "knobs": knobs(k, n, 1, lw)}
               for n, k in ((8, 32), (16, 16), (32, 8)) for lw in (4, 8)]
        out += [{"sketch": "x_block" + kw, "knobs": knobs(32, 8, 1, 8)},
                {"sketch": "x_chunk" + kw, "knobs": knobs(32, 8, 1, 8)},
                {"sketch": "x_registers" + kw, "knobs": knobs(16, 8, 1, 4, n_vecs=2)},
                # the best the sampled space found before +k_warps (75 us at 8192x28672)
                {"sketch": "x_block", "knobs": knobs(16, 32, 1, 4, n_vecs=2, unroll=512)}]
        return out
    out = []
    for m_lanes in sorted({1, 2, max(1, m // 4)}):
        rows = m // m_lanes
        k_lanes = min(32, 256 // (8 * m_lanes))
        out += [{"sketch": "x_registers" + kw, "knobs": knobs(k_lanes, 8, m_lanes, lw, nv)}
                for lw in (1, 2, 4) for nv in (1, 2) if rows * lw * 8 <= 64 * nv]
        # x in shared memory per group step: no x registers, so more loads in flight.
        chunk_lanes = max(v for v in (1, 2, 4, 8, 16) if m * v * 128 * 4 <= 48 * 1024)
        out += [{"sketch": "x_chunk" + kw, "knobs": knobs(chunk_lanes, n, m_lanes, lw)}
                for n, lw in ((32, 2), (8, 8))]
    return out


def int8_variants(m: int) -> list[dict]:
    """Hand-picked points of the int8 space (schedules/cuda/uniform_int8.py) for a given M."""
    def knobs(k_lanes, n_lanes, load_words, m_lanes=1, n_vecs=1, unroll=64):
        return dict(k_lanes=k_lanes, n_lanes=n_lanes, n_vecs=n_vecs, m_lanes=m_lanes,
                    load_words=load_words, unroll=unroll)

    m_lanes = max(1, m // 4)
    out = []
    for stage in ("x_block", "x_registers", "x_chunk"):
        out += [{"sketch": stage, "knobs": knobs(k, n, lw, m_lanes)}
                for n, k in ((8, 32), (16, 16), (32, 8)) for lw in (2, 4, 8)]
    out += [{"sketch": "x_block", "knobs": knobs(16, 8, 4, m_lanes, n_vecs=2)},
            {"sketch": "x_block", "knobs": knobs(32, 8, 4, m_lanes, unroll=512)}]
    return out


def _space(spec):
    """The design-space module of ``spec``: the float or the int8-activation one."""
    from schedules.cuda import uniform, uniform_int8

    return uniform_int8 if spec.int8_activations else uniform


def _build(job: dict) -> dict:
    """Build one variant (in a worker process): the .so path, or the error."""
    from qcompile.kernels import UniformSpec
    from tools.harness.variants import build_variant

    def schedule(sch, spec, hw):
        space = _space(spec)
        if job["sketch"] == "heuristic":
            return space.heuristic_schedule(sch, spec, hw)
        return space.sketch(sch, spec, hw, job["sketch"], job["knobs"])

    # the dp4a variant even where the family would take tensor cores
    return build_variant(job, lambda: UniformSpec(**job["spec"]), schedule,
                         "uniform_cuda_int8_dp4a" if job["spec"].get("int8_activations")
                         else None)


def jobs_for(shapes, batches, variants, root: Path, int8: bool = False) -> list[dict]:
    """Every (shape, M, variant) whose knobs are candidates there, the heuristic first."""
    from qcompile.kernels import UniformSpec

    jobs = []
    builtin = int8_variants if int8 else builtin_variants
    for k, n in shapes:
        for m in batches:
            spec = UniformSpec(k=k, n=n, m=m, int8_activations=int8)
            uniform = _space(spec)
            cands = uniform.knob_candidates(spec)
            name, knobs = uniform.heuristic_knobs(spec, _hw())
            chosen = [{"sketch": "heuristic", "knobs": {"sketch": name, "knobs": knobs}}]
            sketches = uniform.sketches_for(spec, _hw())
            for v in variants if variants is not None else builtin(m):
                if v.get("m", m) != m:
                    continue
                if v["sketch"] in sketches and all(
                        value in cands[name] for name, value in v["knobs"].items()):
                    chosen.append(v)
            for i, v in enumerate(chosen):
                jobs.append({"spec": {"k": k, "n": n, "m": m, "int8_activations": int8},
                             "sketch": v["sketch"],
                             "knobs": v["knobs"], "dir": str(root / f"k{k}n{n}m{m}v{i}")})
    return jobs


def _hw():
    import targets

    return targets.get("cuda").hardware()


def time_all(built: list[dict], rounds: int) -> list[dict]:
    """Check and time every built variant; weights shared by the variants of one spec."""
    import numpy as np
    import torch

    import qcompile
    from qcompile.kernels import UniformSpec, family_of
    from tools.harness.cuda_timing import GraphTimer as Timed
    from tools.harness.cuda_timing import copies_for, prepare_all
    from tools.harness.product import quantized_activations
    from tools.harness.reference import dense_weight

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rng = np.random.default_rng(0)
    results = []
    by_spec: dict[tuple, list[dict]] = {}
    for job in built:
        by_spec.setdefault(tuple(job["spec"].values()), []).append(job)
    for (k, n, m, int8), jobs in by_spec.items():
        spec = UniformSpec(k=k, n=n, m=m, int8_activations=int8)
        family = family_of(spec)
        tensors = family.example_tensors(spec, rng)
        weight = torch.from_numpy(dense_weight(spec, tensors)).cuda()
        x = torch.randn(m, k, device="cuda")
        x_used = x
        if int8:  # what the kernel multiplies: x rounded to int8 per row and group
            rounded = quantized_activations(x.cpu().numpy(), spec.group_size)
            x_used = torch.from_numpy(rounded).cuda()
        reference = (x_used.double() @ weight.double()).float()
        scale = reference.abs().max().item()
        prepared = None
        impls = []
        for job in jobs:
            if "error" in job:
                results.append(job)
                continue
            try:
                kernel = qcompile.load(job["so"])
                if prepared is None:
                    prepared = kernel.prepare(**tensors)
                    copies = [prepared.tensors] + [
                        tuple(t.clone() for t in prepared.tensors)
                        for _ in range(copies_for(prepared.nbytes(), l2) - 1)]
                y = torch.full((m, n), float("nan"), device="cuda")
                kernel.function(x, *prepared.tensors, y)
                error = (y - reference).abs().max().item() / scale
                timed = Timed(job["sketch"], [lambda w=w, f=kernel.function, x=x, y=y: f(x, *w, y)
                                              for w in copies], family.bytes_read(spec))
                impls.append((job, timed, error))
            except Exception as failure:  # noqa: BLE001
                results.append({**job, "error": f"{type(failure).__name__}: {failure}"[:300]})
        prepare_all([timed for _, timed, _ in impls])
        for _ in range(rounds):
            for _, timed, _ in impls:
                timed.sample()
        for job, timed, error in impls:
            r = timed.result()
            results.append({**job, "us": r["median_us"], "tbps": r["tbps"],
                            "max_rel_error": error})
        key = {"k": k, "n": n, "m": m, "int8_activations": int8}
        best = min((r for r in results if r.get("spec") == key and "us" in r),
                   key=lambda r: r["us"], default=None)
        for r in results:
            if r.get("spec") == key and "us" in r:
                mark = "*" if r is best else " "
                print(f"{mark} {k}x{n} M={m:<2d} {r['us']:8.1f} us {r['tbps']:5.2f} TB/s "
                      f"err {r['max_rel_error']:.0e} {r['sketch']} {r['knobs']}", flush=True)
        del impls, prepared, weight
        torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--batches", default=BATCHES)
    parser.add_argument("--variants", help="JSON file: a list of {sketch, knobs}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--activations", choices=("float32", "int8"), default="float32")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    from qcompile.cli import parse_shape

    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    variants = json.loads(Path(args.variants).read_text()) if args.variants else None
    root = Path(tempfile.mkdtemp(prefix="qcompile-sweep-"))
    started = time.monotonic()
    jobs = jobs_for(shapes, batches, variants, root, args.activations == "int8")
    import multiprocessing

    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        built = list(pool.map(_build, jobs))
    failed = [b for b in built if "error" in b]
    print(f"built {len(built) - len(failed)} of {len(built)} variants in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    for b in failed:
        print(f"  build failed: {b['spec']} {b['sketch']} {b['knobs']}: {b['error']}")
    try:
        results = time_all(built, args.rounds)
    except Exception:
        traceback.print_exc()
        results = built
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": time.monotonic() - started,
                                               "results": results}, indent=1) + "\n")
    print(f"sweep done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
