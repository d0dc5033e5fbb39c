"""qcompile's benchmarks, one entry: ``python tools/bench.py JOB [options]``.

    kernels     families x target x shapes x batches x activations, with the peers
    prefill     QuantLinear: from how many rows the dense prefill path beats the kernels
    act-order   QuantLinear and kernels: the cost of act_order, fused or separate gather
    model       a GPTQ Llama on qcompile kernels: decode and prefill tokens/s, transformers peer
    model-gpu   the same on a GPU (Llama-2-7B shape): CUDA graphs, fp16 and humming peers, profile

Examples (tools/README.md lists the commands behind every file in tools/results):

    python tools/bench.py kernels --shapes 256x256 --rounds 3 --json /tmp/smoke.json
    python tools/bench.py kernels --preset cpu --json tools/results/kernels_cpu_avx2.json
    python tools/bench.py kernels --preset cuda --db sqlite:////tmp/qc/tuning.sqlite
    python tools/bench.py prefill --db sqlite:////tmp/bench/tuning.sqlite
    python tools/bench.py model --model tiny --batches 1,4 --prompt 64 --rounds 1
    python tools/bench.py model-gpu --layers 2 --rounds 2 --json /tmp/model_gpu_smoke.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# before torch loads: its OpenMP workers must not spin beside our kernels' thread pool
# (qcompile.hf.warn_if_thread_pools_spin)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools.harness

from tools.jobs import act_order, kernels, model, model_gpu, prefill  # noqa: E402

JOBS = {"kernels": kernels, "prefill": prefill, "act-order": act_order, "model": model,
        "model-gpu": model_gpu}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, job in JOBS.items():
        parsers[name] = sub.add_parser(name, help=job.__doc__.splitlines()[0],
                                       description=job.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        job.add_arguments(parsers[name])
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "kernels":  # presets set defaults, so parse its options again
        args = kernels.parse(parsers["kernels"], argv[argv.index("kernels") + 1:])
        args.command = "kernels"
    return JOBS[args.command].main(args)


if __name__ == "__main__":
    sys.exit(main())
