"""H200: tune and measure the BCQ (LUT-GEMM) GEMV against fp16 ``torch.nn.functional.linear``,
in one run on the GPU machine.

The workload is the issue's: 3-bit (q = 3 planes) g = 128 BCQ, K = 7168, N = 28672 (OPT-175B's
first FFN layer per the paper's Table 2), M = 1. The weights are random 3-bit GPTQ tensors
converted exactly into BCQ (eq. 5), so one float64 reference checks both. For every mu given,
the kernel is tuned by ``qcompile.tune`` (MetaSchedule over the CUDA space, candidates compiled
by NVRTC and timed on the GPU) into ``--db`` (a local SQLite file), then built from the best
record, loaded through ``qcompile.load`` and timed exactly like tools/bench_cuda.py times its
kernels: CUDA graphs of back-to-back calls, weights rotating among copies worth three L2s,
interleaved rounds, medians; fp16 linear is timed in the same rounds.

    PYTHONPATH=/tmp/tvmsite:$PWD python tools/bench_bcq_cuda.py --db sqlite:////tmp/qc/bcq.sqlite \\
        --mus 4,8 --trials 32 --json $OUT/bcq_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

import qcompile
import targets
from qcompile.build import build, build_untuned
from qcompile.errors import NoRecordError
from qcompile.formats.gptq import quantize_rtn
from qcompile.kernels import BcqSpec, family_of
from qcompile.tune import tune
from tools.bench_cuda import Timed, copies_for, copy_bandwidth
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--db", required=True, metavar="URL", help="local tuning database")
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--n", type=int, default=28672)
    parser.add_argument("--bits", type=int, default=3, help="planes q (default 3)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--mus", default="4,8", help="mu values, each its own workload (4,8)")
    parser.add_argument("--trials", type=int, default=32, help="tuning trials per mu (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_bcq_cuda: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    preset = targets.get(args.target)
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
