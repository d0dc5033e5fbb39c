"""Search efficiency: best latency against trials, QIGen-guided design space vs MetaSchedule's
default generator, same workload, budget, seed, builder, runner and cost model.

guided
    our space: on CPUs (schedules/cpu/uniform.py) eq. 4 micro-kernels as sketches, the tiled
    weight layout, knobs seeded by eq. 5; on CUDA (schedules/cuda/uniform.py, float32 x: the
    variant with a space to search) the GEMV's block shape, K split and unroll as knobs around
    the heuristic point (``schedules.space_generator``).
default
    ``PostOrderApply`` with MetaSchedule's own rules, postprocessors and mutators for the target
    (multi-level tiling, parallelize/vectorize/unroll, random compute location...).

Each uses its production search settings: ours what ``qcompile tune`` uses (population 64,
schedules.search_strategy), the default MetaSchedule's own (population 512). Builder, runner,
cost model (XGBoost), budget and seed are the same.

Each trial's measured latency is recorded in measurement order; the curve is the best so far.
The check (issue 4): the guided space reaches within 10% of its final best at trial t_g; the
default needs t_d trials to reach that same latency (or never does); it holds if t_g <= t_d / 3.

    python tools/studies/search_efficiency.py --shape 4096x4096 --trials 64 \\
        --json se.json --plot se.png
    python tools/studies/search_efficiency.py --target cuda --shape 4096x11008 ...   # on a GPU
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import targets
from qcompile import _tvm
from qcompile.cli import parse_shape
from qcompile.kernels import UniformSpec, get_family
from qcompile.measure import MeasurePolicy
from schedules import search_strategy, space_generator
from schedules.variants import compute_for
from targets.host import usable_cores

FAMILY = get_family("uniform")


@_tvm.derived_object
class Curve(_tvm.ms.measure_callback.PyMeasureCallback):
    """Latency (us, None for a failed candidate) of every measured candidate, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.latencies: list[float | None] = []
        self.times: list[float] = []
        self.started = time.monotonic()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        for built, ran in zip(builder_results, runner_results, strict=True):
            ok = not built.error_msg and not ran.error_msg and ran.run_secs
            secs = [float(s) for s in ran.run_secs] if ok else None
            self.latencies.append(sum(secs) / len(secs) * 1e6 if secs else None)
            self.times.append(time.monotonic() - self.started)


def best_so_far(latencies: list[float | None]) -> list[float | None]:
    out, best = [], None
    for value in latencies:
        if value is not None and (best is None or value < best):
            best = value
        out.append(best)
    return out


def first_reaching(curve: list[float | None], level: float) -> int | None:
    """1-based trial at which ``curve`` first is <= ``level``; None if never."""
    return next((i + 1 for i, v in enumerate(curve) if v is not None and v <= level), None)


def tune_curve(spec, preset, generator, trials: int, seed: int, per_iter: int) -> dict:
    """Tune ``spec`` with ``generator`` ("guided" or "default"); the measured curve."""
    hw = preset.hardware()
    target = _tvm.Target(preset.tvm_target(hw))
    mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
    if generator == "guided":
        space = space_generator(spec, preset.kind, hw)
        strategy = search_strategy(spec, preset.kind)  # what qcompile tune uses
    else:
        space = _tvm.ms.space_generator.PostOrderApply()
        strategy = "evolutionary"  # MetaSchedule's defaults, sized for its large space
    curve = Curve()
    # builds use every core here; a CPU kernel runs on the target's cores (TVM_NUM_THREADS)
    cores = getattr(hw, "cores", None) or usable_cores()
    policy = MeasurePolicy.for_target(preset.kind, build_workers=usable_cores())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"qcompile-se-{generator}-") as work_dir:
        context = _tvm.ms.TuneContext(
            mod=mod, target=target, space_generator=space, search_strategy=strategy,
            task_name=f"{spec.name()}-{generator}", rand_state=seed, num_threads=cores,
            logger=_tvm.ms.logging.get_logger(f"qcompile.se.{generator}"),
        ).clone()
        _tvm.ms.tune.tune_tasks(
            tasks=[context], task_weights=[1.0], work_dir=work_dir, max_trials_global=trials,
            num_trials_per_iter=per_iter, builder=policy.builder(), runner=policy.runner(),
            database=_tvm.ms.database.MemoryDatabase(), cost_model="xgb",
            measure_callbacks=[curve, _tvm.ms.measure_callback.AddToDatabase(),
                               _tvm.ms.measure_callback.RemoveBuildArtifact(),
                               _tvm.ms.measure_callback.UpdateCostModel()],
            task_scheduler="round-robin",
        )
    best = best_so_far(curve.latencies)
    return {"generator": generator, "latencies_us": curve.latencies, "best_so_far_us": best,
            "seconds_at_trial": curve.times, "elapsed_s": time.monotonic() - started,
            "failed": sum(v is None for v in curve.latencies),
            "final_best_us": next((v for v in reversed(best) if v is not None), None)}


def verdict(guided: dict, default: dict) -> dict:
    """The issue's check on two curves."""
    final = guided["final_best_us"]
    if final is None:
        return {"holds": False, "reason": "the guided search measured no valid candidate"}
    t_g = first_reaching(guided["best_so_far_us"], 1.1 * final)
    level = guided["best_so_far_us"][t_g - 1]
    t_d = first_reaching(default["best_so_far_us"], level)
    holds = t_d is None or t_g <= t_d / 3
    return {"guided_final_best_us": final, "guided_trials_to_within_10pct": t_g,
            "latency_at_that_trial_us": level, "default_trials_to_same_latency": t_d,
            "default_final_best_us": default["final_best_us"], "holds": holds,
            "rule": "t_g <= t_d / 3, or the default never reaches the latency"}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # best so far against trials (left) and against the tuner's wall time (right)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    check = result["check"]
    for ax, by_time in zip(axes, (False, True), strict=True):
        for run in result["runs"]:
            points = [(run["seconds_at_trial"][i] if by_time else i + 1, v)
                      for i, v in enumerate(run["best_so_far_us"]) if v is not None]
            ax.step([x for x, _ in points], [y for _, y in points], where="post",
                    label=f"{run['generator']} (best {points[-1][1]:.0f} us)" if points
                    else run["generator"])
        if check.get("guided_final_best_us"):
            ax.axhline(1.1 * check["guided_final_best_us"], color="grey", linestyle="--",
                       linewidth=0.8, label="guided final best + 10%")
        ax.set_yscale("log")
        ax.set_xlabel("tuning wall time (s)" if by_time else "trials (measured candidates)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("best latency so far (us, log)")
    fig.suptitle(f"{result['kernel']} @{result['target']}, seed {result['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="avx2", choices=["avx2", "avx512", "cuda"])
    parser.add_argument("--shape", type=parse_shape, default=parse_shape("4096x4096"))
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--trials", type=int, default=64, help="budget per space (default 64)")
    parser.add_argument("--per-iter", type=int, default=16, help="candidates per iteration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    parser.add_argument("--replot", metavar="JSON", help="only plot a --json of an earlier run "
                        "(a GPU machine without matplotlib writes the JSON; plot it here)")
    args = parser.parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), args.plot or
             str(Path(args.replot).with_suffix(".png")))
        return 0

    preset = targets.get(args.target)
    _tvm.quiet_meta_schedule()
    k, n = args.shape
    spec = UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size)
    runs = []
    for generator in ("guided", "default"):
        run = tune_curve(spec, preset, generator, args.trials, args.seed, args.per_iter)
        runs.append(run)
        print(f"{generator:8s} {len(run['latencies_us'])} trials in {run['elapsed_s']:.0f} s, "
              f"{run['failed']} failed, best {run['final_best_us']} us", flush=True)
    result = {"kernel": spec.name(), "target": args.target, "trials": args.trials,
              "seed": args.seed, "runs": runs, "check": verdict(runs[0], runs[1])}
    check = result["check"]
    print(json.dumps(check, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
