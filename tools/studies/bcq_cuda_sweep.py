"""H200: tune and measure the BCQ (LUT-GEMM) GEMV against fp16 ``torch.nn.functional.linear``,
in one run on the GPU machine.

The workload is the issue's: 3-bit (q = 3 planes) g = 128 BCQ, K = 7168, N = 28672 (OPT-175B's
first FFN layer per the paper's Table 2), M = 1. The weights are random 3-bit GPTQ tensors
converted exactly into BCQ (eq. 5), so one float64 reference checks both. For every mu given,
the kernel is tuned by ``qcompile.tune`` (MetaSchedule over the CUDA space, candidates compiled
by NVRTC and timed on the GPU) into ``--db`` (a local SQLite file), then built from the best
record, loaded through ``qcompile.load`` and timed by tools/harness/cuda_timing.py like
kernels: CUDA graphs of back-to-back calls, weights rotating among copies worth three L2s,
interleaved rounds, medians; fp16 linear is timed in the same rounds.

    PYTHONPATH=/tmp/tvmsite:$PWD python tools/studies/bcq_cuda_sweep.py \\
        --db sqlite:////tmp/qc/bcq.sqlite \\
        --mus 4,8 --trials 32 --json $OUT/bcq_h200.json

``--variants grid`` (or a JSON file) sweeps pinned points of the CUDA design space instead of
tuning (no database): every variant is built in a pool of processes (``--workers``), loaded as
it is built, checked against the reference, and timed in interleaved rounds together with fp16
linear; the best per mu is printed and the JSON holds every variant. ``grid`` is
:func:`grid_variants` (the heuristic and its neighbourhood, mu 4 and 8); a file holds a list of
``{"mu": 4, "knobs": {...}, "stage_words": true, "unroll_groups": true, "words_inner": true}``
(``words_inner``, ``sums_first`` optional, false by default). Variants are loaded
until ``--budget-s`` has passed since the start, so a run stays inside its time limit:

    PYTHONPATH=/tmp/tvmsite:$PWD python tools/studies/bcq_cuda_sweep.py --variants grid \\
        --rounds 30 \\
        --json $OUT/bcq_sweep.json --export-best /tmp/bcq_best 2>&1 | tee $OUT/bcq_sweep.log

``--export-best DIR`` copies the fastest variants' builds (and the heuristic's) to
``DIR/<rank>_<variant>/``; ``tools/studies/bcq_ncu_probe.py`` loads them and calls each a few times,
for Nsight Compute (its docstring has the ncu command line).
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.errors import NoRecordError
from qcompile.kernels import BcqSpec, family_of
from qcompile.quantize.rtn import quantize_rtn
from qcompile.tune import tune
from tools.harness.bandwidth import cuda_copy as copy_bandwidth
from tools.harness.cuda_timing import GraphTimer as Timed
from tools.harness.cuda_timing import copies_for, prepare_all
from tuning_db import Storage

TARGET_SPEEDUP = 3.0


def kernel_for(spec: BcqSpec, preset, args, out_dir: Path):
    """(Kernel, origin): tuned now (unless --trials 0), then built from the database's best
    record; the untuned heuristic when there is none."""
    origin = {}
    if args.trials > 0:
        t0 = time.monotonic()
        summary = tune(spec, preset, trials=args.trials, storage=Storage(args.db),
                       seed=args.seed, progress=False)
        origin.update(tune_s=time.monotonic() - t0, trials=summary.trials,
                      failed_trials=summary.failed, tuned_best_us=summary.best_us)
    try:
        result = build(spec, preset, out_dir, storage=Storage(args.db))
        origin.update(source="tuned", record=result.record_id)
    except NoRecordError:
        result = build_untuned(spec, preset, out_dir)
        origin.update(source="untuned heuristic")
    kernel = qcompile.load(result.so_path)
    manifest = json.loads(result.manifest_path.read_text())
    origin["record"] = manifest["record"]
    return kernel, origin


def bench(spec: BcqSpec, kernel, layer, weight: torch.Tensor, x: torch.Tensor, rounds: int,
          copy: dict) -> dict:
    family = family_of(spec)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    reference = (x.double() @ weight.double()).float()
    scale = reference.abs().max().item()
    prepared = kernel.prepare(qweight=layer.qweight, scales=layer.scales, qzeros=layer.qzeros)
    y = torch.full((spec.m, spec.n), float("nan"), device="cuda")
    kernel.function(x, *prepared.tensors, y)
    torch.cuda.synchronize()
    row = {"max_rel_error": (y - reference).abs().max().item() / scale}
    copies = [prepared.tensors] + [tuple(t.clone() for t in prepared.tensors)
                                   for _ in range(copies_for(prepared.nbytes(), l2) - 1)]
    ours = Timed("qcompile_bcq", [lambda w=w: kernel.function(x, *w, y) for w in copies],
                 family.bytes_read(spec))
    w16 = weight.T.contiguous().half()
    x16 = x.half()
    w16_copies = [w16] + [w16.clone() for _ in range(copies_for(w16.nbytes, l2) - 1)]
    fp16 = Timed("fp16_linear", [lambda w=w: torch.nn.functional.linear(x16, w)
                                 for w in w16_copies], 2 * spec.k * spec.n + 2 * x.numel())
    row["fp16_max_rel_error"] = (torch.nn.functional.linear(x16, w16).float() - reference
                                 ).abs().max().item() / scale
    for impl in (ours, fp16):
        impl.prepare()
    for _ in range(rounds):
        ours.sample()
        fp16.sample()
    row["qcompile_bcq"] = ours.result()
    row["fp16_linear"] = fp16.result()
    row["speedup_vs_fp16_linear"] = (row["fp16_linear"]["median_us"]
                                     / row["qcompile_bcq"]["median_us"])
    row["fraction_of_copy_bandwidth"] = row["qcompile_bcq"]["tbps"] / copy["tbps"]
    del copies, w16_copies, prepared
    torch.cuda.empty_cache()
    return row


#: mu = 4 points of the grid besides the heuristic: (threads, cols, groups_per_block,
#: unroll_groups, words_inner), words staged. The first three are the 2026-11-23 H200 sweep's
#: best two (44.4 and 46.0 us) and its heuristic (51.6 us), kept so one run compares them with
#: the words-inner sketch (the loads of a group in flight together) around the new heuristic.
GRID_MU4 = [(128, 4, 2, False, False), (256, 4, 1, True, False), (128, 4, 2, True, False),
            (128, 4, 2, False, True), (128, 4, 4, False, True), (128, 4, 8, False, True),
            (256, 4, 2, False, True), (128, 4, 1, True, True), (128, 4, 4, True, True),
            (256, 4, 1, True, True), (256, 4, 2, True, True), (64, 4, 2, True, True),
            (64, 4, 4, True, True), (128, 2, 2, True, True), (128, 2, 4, True, True),
            (256, 2, 2, True, True)]
#: mu = 8 in the table-per-chunk space (tables of 16 KiB per group: 1 or 2 groups per block):
#: the 2026-11-23 sweep's best, and it with the words inner; built on that space's compute
#: (compute.py's GPU form), not the rotated one the family picks at mu = 8.
GRID_MU8 = [(128, 4, 1, False, False), (128, 4, 1, False, True), (128, 2, 2, True, True)]
#: The rotated-chunk space (mu = 8, one row): (threads, groups_per_block) besides its heuristic.
GRID_ROTATED = [(256, 2), (256, 4), (128, 1), (128, 2), (512, 1), (512, 2)]


def grid_variants(k: int, n: int, q: int, group_size: int, mus: list[int]) -> list[dict]:
    """Per mu: where the rotated-chunk GEMV fits (mu = 8, one row), its heuristic first and
    :data:`GRID_ROTATED`; the table-per-chunk space's heuristic (words staged, groups unrolled,
    words inner where the words fit; first where the rotated kernel does not fit), at mu 4 it
    with ``sums_first``, then :data:`GRID_MU4` / :data:`GRID_MU8` (29 variants at mu 4 and 8 on
    7168x28672). Points that are not candidates for the spec are left out."""
    from qcompile.kernels.bcq.compute_cuda_rotated import unfit_reason
    from schedules.cuda import bcq as cuda_bcq
    from schedules.cuda import bcq_rotated

    hw = targets.get("cuda").hardware()
    points = {4: GRID_MU4, 8: GRID_MU8}
    out = []
    for mu in mus:
        spec = BcqSpec(k=k, n=n, q=q, group_size=group_size, mu=mu)
        if unfit_reason(spec) is None:
            heuristic = bcq_rotated.heuristic_knobs(spec, hw)
            cands = bcq_rotated.knob_candidates(spec, hw)
            out.append({"mu": mu, "rotated": True, "knobs": heuristic, "heuristic": True})
            out += [{"mu": mu, "rotated": True,
                     "knobs": {"threads": threads, "groups_per_block": groups}}
                    for threads, groups in GRID_ROTATED
                    if {"threads": threads, "groups_per_block": groups} != heuristic
                    and threads in cands["threads"] and groups in cands["groups_per_block"]]
        stage = cuda_bcq.can_stage_words(spec)
        heuristic = cuda_bcq.heuristic_knobs(spec, hw)
        chosen = [{"mu": mu, "knobs": heuristic, "stage_words": stage, "unroll_groups": stage,
                   "words_inner": stage, "heuristic": unfit_reason(spec) is not None}]
        if not stage:
            out += chosen
            continue
        if mu == 4:  # and it with the group sums read before the lookups (no mid barrier)
            chosen.append({"mu": mu, "knobs": heuristic, "stage_words": True,
                           "unroll_groups": True, "words_inner": True, "sums_first": True})
        cands = cuda_bcq.knob_candidates(spec, hw, stage_words=True)
        for threads, cols, groups, unrolled, inner in points.get(mu, []):
            knobs = {"threads": threads, "cols": cols, "groups_per_block": groups, "unroll": 16}
            if (knobs == heuristic and unrolled and inner) or not all(
                    v in cands[name] for name, v in knobs.items()):
                continue
            chosen.append({"mu": mu, "knobs": knobs, "stage_words": True,
                           "unroll_groups": unrolled, "words_inner": inner})
        out += chosen
    return out


def _build_variant(job: dict) -> dict:
    """Build one variant (in a worker process): the .so path, or the error."""
    from schedules.cuda import bcq as cuda_bcq
    from schedules.cuda import bcq_rotated
    from tools.harness.variants import build_variant

    if job.get("rotated"):
        return build_variant(job, lambda: BcqSpec(**job["spec"]),
                             lambda sch, spec, hw: bcq_rotated.sketch(sch, spec, hw, job["knobs"]))

    def schedule(sch, spec, hw):
        return cuda_bcq.sketch(sch, spec, hw, job["knobs"], stage_words=job["stage_words"],
                               unroll_groups=job["unroll_groups"],
                               words_inner=job.get("words_inner", False),
                               sums_first=job.get("sums_first", False))

    return build_variant(job, lambda: BcqSpec(**job["spec"]), schedule,
                         variant="bcq_cuda_tables")


def label(v: dict) -> str:
    k = v["knobs"]
    mark = " (heuristic)" if v.get("heuristic") else ""
    if v.get("rotated"):
        return (f"mu={v['mu']} rotated threads={k['threads']} "
                f"groups_per_block={k['groups_per_block']}{mark}")
    sketch = ("staged+unrolled" if v["unroll_groups"] else "staged") if v["stage_words"] \
        else f"in-place unroll {k['unroll']}"
    if v.get("words_inner"):
        sketch += "+inner"
    if v.get("sums_first"):
        sketch += "+sums"
    return (f"mu={v['mu']} threads={k['threads']} cols={k['cols']} "
            f"groups_per_block={k['groups_per_block']} {sketch}{mark}")


def submit_builds(args, pool) -> list:
    """Every variant's build, submitted to ``pool`` (they run while the weights are made)."""
    mus = [int(v) for v in args.mus.split(",")]
    if args.variants == "grid":
        variants = grid_variants(args.k, args.n, args.bits, args.group_size, mus)
    else:
        variants = json.loads(Path(args.variants).read_text())
    root = Path(tempfile.mkdtemp(prefix="qcompile-bcq-sweep-"))
    jobs = [{**v, "spec": {"k": args.k, "n": args.n, "q": args.bits,
                           "group_size": args.group_size, "mu": v["mu"]},
             "dir": str(root / f"v{i}")} for i, v in enumerate(variants)]
    print(f"{len(jobs)} variants, {args.workers} build workers", flush=True)
    return [pool.submit(_build_variant, job) for job in jobs]


def sweep(args, futures: list, layer, weight: torch.Tensor, x: torch.Tensor, copy: dict,
          started: float) -> list[dict]:
    """As each variant's build arrives: load, check and capture it; then time all of them with
    fp16 linear in interleaved rounds."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    reference = (x.double() @ weight.double()).float()
    scale = reference.abs().max().item()
    w16 = weight.T.contiguous().half()
    x16 = x.half()
    w16_copies = [w16] + [w16.clone() for _ in range(copies_for(w16.nbytes, l2) - 1)]
    fp16 = Timed("fp16_linear", [lambda w=w: torch.nn.functional.linear(x16, w)
                                 for w in w16_copies], 2 * args.k * args.n + 2 * x.numel())
    fp16.prepare()
    bcq, prepared, rows, timed = None, {}, [], []  # prepared: the copies, by layout
    for future in as_completed(futures):
        try:
            job = future.result()
        except Exception as failure:  # noqa: BLE001 - a dead worker loses one variant
            rows.append({"error": f"build worker failed: {type(failure).__name__}: {failure}"})
            continue
        row = {k: v for k, v in job.items() if k != "dir"}
        rows.append(row)
        if "error" in job:
            print(f"  build failed: {label(job)}: {job['error']}", flush=True)
            continue
        if time.monotonic() - started > args.budget_s:
            row["error"] = f"skipped: past --budget-s {args.budget_s}"
            continue
        try:
            spec = BcqSpec(**job["spec"])
            kernel = qcompile.load(job["so"])
            if bcq is None:  # the BCQ tensors (GPTQ converted once), the format's layout
                bcq = family_of(spec).prepare(spec, device="cuda", qweight=layer.qweight,
                                              scales=layer.scales, qzeros=layer.qzeros)
            layout = json.dumps(kernel.layout, sort_keys=True)
            if layout not in prepared:  # the operands depend on the layout alone
                weights = kernel.relayout(bcq)
                prepared[layout] = [weights.tensors] + [
                    tuple(t.clone() for t in weights.tensors)
                    for _ in range(copies_for(weights.nbytes(), l2) - 1)]
            copies = prepared[layout]
            y = torch.full((1, args.n), float("nan"), device="cuda")
            kernel.function(x, *copies[0], y)
            torch.cuda.synchronize()
            row["max_rel_error"] = (y - reference).abs().max().item() / scale
            t = Timed(label(job), [lambda w=w, f=kernel.function, y=y: f(x, *w, y)
                                   for w in copies], family_of(spec).bytes_read(spec))
            timed.append((row, t))
            print(f"  [{time.monotonic() - started:4.0f} s] loaded {label(job)}: max rel error "
                  f"{row['max_rel_error']:.1e}", flush=True)
        except Exception as failure:  # noqa: BLE001 - keep the other variants
            row["error"] = f"{type(failure).__name__}: {failure}"[:300]
            print(f"  failed {label(job)}: {row['error']}", flush=True)
    print(f"built and loaded {len(timed)} of {len(futures)} in {time.monotonic() - started:.0f} s;"
          f" timing {args.rounds} rounds", flush=True)
    prepare_all([t for _, t in timed])
    for _ in range(args.rounds):
        fp16.sample()
        for _, t in timed:
            t.sample()
    fp16_us = fp16.result()["median_us"]
    for row, t in timed:
        result = t.result()
        row.update(us=result["median_us"], tbps=result["tbps"],
                   fraction_of_copy_bandwidth=result["tbps"] / copy["tbps"],
                   fp16_linear_us=fp16_us, speedup_vs_fp16_linear=fp16_us / result["median_us"],
                   method=result["method"])
    return rows


def report_sweep(rows: list[dict], args) -> str:
    good = [r for r in rows if "us" in r and r["max_rel_error"] < 1e-4]
    for r in sorted((r for r in rows if "us" in r), key=lambda r: r["us"]):
        print(f"  {r['us']:7.1f} us {r['tbps']:5.2f} TB/s {r['speedup_vs_fp16_linear']:5.2f}x "
              f"err {r['max_rel_error']:.0e}  {label(r)}")
    for mu in sorted({r["mu"] for r in rows if "mu" in r}):
        best = min((r for r in good if r["mu"] == mu), key=lambda r: r["us"], default=None)
        if best:
            print(f"best mu={mu}: {best['us']:.1f} us ({best['speedup_vs_fp16_linear']:.2f}x fp16 "
                  f"linear {best['fp16_linear_us']:.1f} us): {label(best)}")
    best = min(good, key=lambda r: r["us"], default=None)
    if best is None:
        return "FAIL no variant ran correctly"
    ok = best["speedup_vs_fp16_linear"] >= TARGET_SPEEDUP
    return (f"{'PASS' if ok else 'FAIL'} {args.bits}-bit g={args.group_size} {args.k}x{args.n} "
            f"M=1: {best['speedup_vs_fp16_linear']:.2f}x fp16 linear (>= {TARGET_SPEEDUP}) with "
            f"{label(best)}, max rel error {best['max_rel_error']:.1e}")


def slug(v: dict) -> str:
    """A file name for a variant: ``mu4_t128_c4_g2_staged+unrolled+inner``."""
    k = v["knobs"]
    if v.get("rotated"):
        return f"mu{v['mu']}_rotated_t{k['threads']}_g{k['groups_per_block']}"
    sketch = label(v).split(f"groups_per_block={k['groups_per_block']} ")[1]
    sketch = sketch.replace(" (heuristic)", "_heuristic").replace(" ", "")
    return f"mu{v['mu']}_t{k['threads']}_c{k['cols']}_g{k['groups_per_block']}_{sketch}"


def export_best(rows: list[dict], out_dir: str, count: int) -> list[Path]:
    """Copy the ``count`` fastest correct variants' builds (the .so, its manifest, the CUDA
    source and the TensorIR: what ``qcompile.load`` needs) to ``out_dir/<rank>_<slug>/``, for
    tools/studies/bcq_ncu_probe.py to run under Nsight Compute; the heuristic's is added if it is
    not
    among them."""
    good = sorted((r for r in rows if "us" in r and r["max_rel_error"] < 1e-4),
                  key=lambda r: r["us"])
    chosen = good[:count] + [r for r in good[count:] if r.get("heuristic")]
    written = []
    for rank, row in enumerate(chosen, 1):
        target = Path(out_dir) / f"{rank}_{slug(row)}"
        shutil.copytree(Path(row["so"]).parent, target, dirs_exist_ok=True)
        (target / "variant.json").write_text(json.dumps(
            {k: v for k, v in row.items() if k != "so"}, indent=2) + "\n")
        written.append(target / Path(row["so"]).name)
        print(f"exported {written[-1]} ({row['us']:.1f} us)")
    return written


def self_check() -> int:
    """The built-in grid (``--variants grid``): small enough for one call of under 3 minutes,
    the heuristic first per mu (at mu = 8 the rotated kernel's), every point a candidate of its
    space, no duplicates, the previous sweep's best two and its heuristic kept for comparison.
    Needs no GPU (was tests/unit/test_bench_bcq_grid.py: tests never import tools)."""
    from schedules.cuda import bcq as cuda_bcq
    from schedules.cuda import bcq_rotated

    hw = targets.get("cuda").hardware()
    variants = grid_variants(7168, 28672, 3, 128, [4, 8])
    assert len(variants) <= 30
    for mu in (4, 8):
        spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=mu)
        mine = [v for v in variants if v["mu"] == mu]
        first = mine[0]
        assert first["heuristic"] and bool(first.get("rotated")) == (mu == 8)
        space = bcq_rotated if mu == 8 else cuda_bcq
        assert first["knobs"] == space.heuristic_knobs(spec, hw)
        assert sum(bool(v.get("heuristic")) for v in mine) == 1
        for v in mine:
            if v.get("rotated"):
                cands = bcq_rotated.knob_candidates(spec, hw)
                assert all(value in cands[name] for name, value in v["knobs"].items()), v
                continue
            cands = cuda_bcq.knob_candidates(spec, hw, stage_words=v["stage_words"])
            assert all(value in cands[name] for name, value in v["knobs"].items()), v
            assert not v["unroll_groups"] or v["stage_words"]
            assert not v.get("words_inner") or v["stage_words"]
    keys = [(v["mu"], v.get("rotated", False), tuple(v["knobs"].items()),
             v.get("stage_words"), v.get("unroll_groups"), v.get("words_inner", False),
             v.get("sums_first", False)) for v in variants]
    assert len(keys) == len(set(keys))
    labels = {label(v) for v in variants}
    assert {"mu=4 threads=128 cols=4 groups_per_block=2 staged",            # 44.4 us
            "mu=4 threads=256 cols=4 groups_per_block=1 staged+unrolled",   # 46.0 us
            "mu=4 threads=128 cols=4 groups_per_block=2 staged+unrolled",   # 51.6 us
            "mu=4 threads=128 cols=4 groups_per_block=2 staged+unrolled+inner (heuristic)",
            } <= labels
    assert len({slug(v) for v in variants}) == len(variants)
    print(f"self-check: the grid's {len(variants)} variants are valid")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--db", metavar="URL", help="local tuning database (tuning mode)")
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--n", type=int, default=28672)
    parser.add_argument("--bits", type=int, default=3, help="planes q (default 3)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--mus", default="4,8", help="mu values, each its own workload (4,8)")
    parser.add_argument("--trials", type=int, default=32, help="tuning trials per mu (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--variants", metavar="grid|FILE",
                        help="sweep pinned design-space points instead of tuning (see above)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                        help="build processes for --variants")
    parser.add_argument("--budget-s", type=float, default=140.0,
                        help="--variants: load no new variant after this many seconds")
    parser.add_argument("--export-best", metavar="DIR",
                        help="--variants: copy the fastest variants' .so (and the heuristic's) "
                             "to DIR/<rank>_<variant>/ for tools/studies/bcq_ncu_probe.py")
    parser.add_argument("--export-count", type=int, default=3,
                        help="--variants: how many of the fastest --export-best copies (3)")
    parser.add_argument("--self-check", action="store_true",
                        help="check the built-in grid (no GPU needed) and exit")
    args = parser.parse_args(argv)
    if args.self_check:
        return self_check()
    started = time.monotonic()
    if args.variants is None and args.db is None:
        parser.error("--db is required unless --variants is given")
    if not torch.cuda.is_available():
        print("bench_bcq_cuda: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    preset = targets.get(args.target)
    pool = futures = None
    if args.variants is not None:
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
        futures = submit_builds(args, pool)
    rng = np.random.default_rng(0)
    weight_f = rng.standard_normal((args.k, args.n)).astype(np.float32) * 0.02
    layer = quantize_rtn(weight_f, args.bits, args.group_size)
    weight = torch.from_numpy(layer.dequantize()).cuda()
    x = torch.randn(1, args.k, device="cuda")
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {copy['tbps']:.2f} TB/s", flush=True)
    out_dir = Path(tempfile.mkdtemp(prefix="qcompile-bcq-"))
    rows = []

    def write(verdict: str) -> None:  # after every mu, so a run cut short keeps what it measured
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({
                "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "copy_bandwidth": copy, "rounds": args.rounds, "trials": args.trials,
                "workloads": rows, "done_when": verdict}, indent=2) + "\n")

    if args.variants is not None:
        try:
            rows = sweep(args, futures, layer, weight, x, copy, started)
            verdict = report_sweep(rows, args)
            if args.export_best:
                export_best(rows, args.export_best, args.export_count)
        except Exception:
            traceback.print_exc()
            verdict = "FAIL the sweep crashed"
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        print(verdict)
        write(verdict)
        print(f"done in {time.monotonic() - started:.0f} s")
        return 1 if "crashed" in verdict or "no variant" in verdict else 0

    for mu in (int(v) for v in args.mus.split(",")):
        spec = BcqSpec(k=args.k, n=args.n, q=args.bits, group_size=args.group_size, mu=mu)
        row = {"name": spec.name(), "mu": mu}
        try:
            kernel, origin = kernel_for(spec, preset, args, out_dir)
            row["kernel"] = origin
            row.update(bench(spec, kernel, layer, weight, x, args.rounds, copy))
        except Exception as error:  # keep the other mu values' numbers
            traceback.print_exc()
            row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
            rows.append(row)
            write("incomplete")
            continue
        rows.append(row)
        write("incomplete")
        print(f"{spec.name()}: {row['qcompile_bcq']['median_us']:.1f} us "
              f"({row['qcompile_bcq']['tbps']:.2f} TB/s) vs fp16 linear "
              f"{row['fp16_linear']['median_us']:.1f} us: {row['speedup_vs_fp16_linear']:.2f}x, "
              f"max rel error {row['max_rel_error']:.1e} [{origin['source']}]", flush=True)
    good = [r for r in rows if "speedup_vs_fp16_linear" in r]
    best = max(good, key=lambda r: r["speedup_vs_fp16_linear"]) if good else None
    verdict = "FAIL no kernel ran"
    if best:
        ok = best["speedup_vs_fp16_linear"] >= TARGET_SPEEDUP and best["max_rel_error"] < 1e-4
        verdict = (f"{'PASS' if ok else 'FAIL'} {args.bits}-bit g={args.group_size} "
                   f"{args.k}x{args.n} M=1: {best['speedup_vs_fp16_linear']:.2f}x fp16 linear "
                   f"(>= {TARGET_SPEEDUP}) at mu={best['mu']}, max rel error "
                   f"{best['max_rel_error']:.1e}")
    print(verdict)
    write(verdict)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
