"""The ``qcompile`` command line.

    qcompile targets                               presets, and which this host supports
    qcompile tune  --target avx2 [spec] [--trials N] [--db URL]
    qcompile tune  --target avx2 --from-gptq DIR [--batch M[,M...]] [--fused] [--trials N]
    qcompile generate --from-gptq DIR --target avx2 --prompt-tokens 1,2,3 | --prompt TEXT
                   [--max-new-tokens N] [--db URL]     (a GPTQ Llama on qcompile kernels)
    qcompile build --target avx2 [spec] [--db URL] --out DIR
    qcompile tune  --target avx2 [spec] --rpc-tracker HOST:PORT --rpc-key KEY   (measure remotely)
    qcompile rpc-server --tracker HOST:PORT --key KEY [--host H] [--port P] [--name NAME]
    qcompile quantize --family mixed [spec] --weight W.npy --calibration X.npy --out W.npz
    qcompile db info|ls|best|export|import|prune|merge|upgrade|check [--db URL]  (cli_db.py)

--db URL names a shared team database (PostgreSQL, MySQL/MariaDB, SQLite): tune and build read
it first, then the local one; --db-readonly writes new records to the local one instead.

Spec flags: --family (uniform), --bits (4), --group-size (128; -1 = whole column),
--shape KxN (4096x4096), --batch M (1), --dtype (float32); mixed: --g1, --g2, --g4,
--four-bit-share, --outlier-share.

Light: every argument is checked before TVM loads (seconds), so the commands import the
modules that load it (tune, build) inside their functions, tqdm (a tenth of a second) only
when a tuning run starts, and ``generate`` imports ``qcompile.hf`` (torch, transformers:
seconds) only when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

# torch's OpenMP workers must not spin beside the kernels' own thread pool (qcompile.hf's
# warn_if_thread_pools_spin says why); read once, when torch first loads, so set before that
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

import targets
from qcompile import gptq
from qcompile.cli_args import (
    OneLineParser,
    add_debug_flag,
    check_output_dir,
    check_output_file,
    existing_file,
    port_number,
    positive_int,
    positive_ints,
    run_command,
    token_ids,
    tracker_address,
)
from qcompile.cli_db import add_db_argument, add_db_commands, add_layer_arguments, open_layers
from qcompile.errors import FormatError, SpecError, UsageError
from qcompile.kernels import FAMILIES, family_of, get_family
from qcompile.kernels.base import KernelSpec
from qcompile.measure import MeasurePolicy, RemoteDevices
from targets.host import usable_cores
from targets.isa import require_build_host, require_tune_host

DEFAULT_SHAPE = "4096x4096"
DEFAULT_TRIALS = 64

#: ``qcompile --help``'s description (plain text: argparse prints it as it is).
DESCRIPTION = ("Tune, build and load quantized LLM kernels: an autotuning compiler built on "
               "Apache TVM, with a tuning database a team can share.")

#: When this command started (``time.monotonic()``): the tuning summary's time counts from here.
STARTED = time.monotonic()


def parse_shape(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"shape must look like KxN (e.g. 4096x11008); got {text!r}")
    return int(match.group(1)), int(match.group(2))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``KxN,KxN,...``: distinct shapes, in order."""
    shapes = [parse_shape(part) for part in text.split(",") if part.strip()]
    if not shapes:
        raise argparse.ArgumentTypeError(f"shapes must look like KxN,KxN (e.g. "
                                         f"4096x4096,4096x11008); got {text!r}")
    return list(dict.fromkeys(shapes))


def add_spec_arguments(parser: argparse.ArgumentParser, batches: bool = False) -> None:
    """The spec flags; ``batches``: ``--batch`` takes a list (tune --from-gptq's M values)."""
    group = parser.add_argument_group("kernel spec")
    group.add_argument("--family", default="uniform", choices=sorted(FAMILIES),
                       help="kernel family (default: uniform)")
    group.add_argument("--bits", type=int, default=4, help="weight bits: 2, 3, 4 or 8 (default 4)")
    group.add_argument("--group-size", type=int, default=128,
                       help="rows of K per scale/zero group; -1 = whole column (default 128)")
    group.add_argument("--shape", type=parse_shape, default=parse_shape(DEFAULT_SHAPE),
                       metavar="KxN", help=f"in x out features (default {DEFAULT_SHAPE})")
    if batches:
        group.add_argument("--batch", type=positive_ints, default=(1,), metavar="M",
                           help="activation rows per call (default 1: GEMV); with --from-gptq "
                                "a list, e.g. 1,16")
    else:
        group.add_argument("--batch", type=positive_int, default=1, metavar="M",
                           help="activation rows per call (default 1: GEMV)")
    group.add_argument("--dtype", default="float32", help="activation dtype (default float32)")
    for family in FAMILIES.values():
        family.add_cli_arguments(group)


def spec_from_args(args: argparse.Namespace) -> KernelSpec:
    """The one spec the flags name (``tune``'s ``--batch`` list must then hold one M)."""
    k, n = args.shape
    if isinstance(args.batch, tuple | list):
        if len(args.batch) > 1:
            raise UsageError(f"--batch {','.join(map(str, args.batch))}: one spec has one M; "
                             "a list is for --from-gptq")
        args = argparse.Namespace(**{**vars(args), "batch": args.batch[0]})
    return get_family(args.family).spec_from_cli(args, k=k, n=n)


def cmd_targets(args: argparse.Namespace) -> int:
    rows = []
    for preset in targets.PRESETS.values():
        supported, reason = preset.host_support()
        hw = preset.hardware(override=args.hw) if preset.kind == "cpu" else preset.hardware()
        rows.append({
            "name": preset.name, "supported": supported, "reason": reason,
            "description": preset.description, "tvm_target": preset.tvm_target(hw),
            "hardware": hw.to_dict(),
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        mark = "yes" if row["supported"] else "no "
        print(f"{row['name']:8s} host: {mark}  {row['description']}")
        print(f"{'':8s} tvm target {json.dumps(row['tvm_target'])}")
        print(f"{'':8s} {_hardware_line(row['hardware'])}")
        print(f"{'':8s} {row['reason']}")
    return 0


def _hardware_line(hw: dict) -> str:
    if "arch" in hw:  # a GPU model
        return (f"{hw['arch']}, {hw['sm_count']} SMs, {hw['shared_memory_per_block_bytes'] >> 10} "
                f"KiB shared memory per block, L2 {hw['l2_bytes'] >> 20} MiB, "
                f"{hw['memory_bandwidth_gbps']:.0f} GB/s peak")
    return (f"L1d {hw['l1d_bytes'] >> 10} KiB, L2 {hw['l2_bytes'] >> 10} KiB, "
            f"L3 {hw['l3_bytes'] >> 20} MiB, {hw['vector_registers']} x {hw['vector_bits']}-bit "
            f"vector registers, {hw['cores']} cores (QIGen: gamma={hw['l1d_bytes'] * 8} bits, "
            f"eta={hw['vector_registers']})")


def measure_policy(args: argparse.Namespace):
    """``--rpc-tracker`` and ``--rpc-key`` as a MeasurePolicy (None: measure here, as before);
    a lone one of the two is a usage error."""
    if (args.rpc_tracker is None) != (args.rpc_key is None):
        raise UsageError("--rpc-tracker HOST:PORT and --rpc-key KEY go together: give both to "
                         "measure on the tracker's servers, or neither to measure here")
    if args.rpc_tracker is None:
        return None
    host, port = args.rpc_tracker
    remote = RemoteDevices(host, port, args.rpc_key, session_timeout_s=args.rpc_timeout)
    return MeasurePolicy.for_target(targets.get(args.target).kind,
                                    build_workers=usable_cores(), remote=remote)


def cmd_tune(args: argparse.Namespace) -> int:
    policy = measure_policy(args)
    if policy is None:  # measured here: refused before TVM loads (remote: the servers' CPUs)
        require_tune_host(targets.get(args.target))
    if args.from_gptq:
        return tune_checkpoint(args)
    if args.fused:
        raise UsageError("--fused tunes a checkpoint's fused layers: give --from-gptq DIR")
    spec = spec_from_args(args)  # every rule of the spec, before TVM loads (seconds)
    preset = targets.get(args.target)
    layers = open_layers(args)
    from qcompile.progress import TuneProgress  # tqdm: only a tuning run pays for it

    with TuneProgress(args.trials, f"{spec.name()} @{preset.name}", started=STARTED,
                      enabled=not args.quiet, phase="starting TVM") as progress:
        from qcompile.tune import tune  # loads TVM (seconds): the bar shows it

        summary = tune(spec, preset, trials=args.trials, layers=layers, seed=args.seed,
                       progress=progress, force=args.force, policy=policy)
    print("\n".join(summary.lines()))
    return 0 if summary.best_us is not None else 1


def add_lm_head_argument(parser) -> None:
    parser.add_argument("--lm-head-bits", type=int, choices=gptq.LM_HEAD_BITS, default=None,
                        help="quantize the dense lm_head to 8 or 4 bits at load (round to "
                             "nearest, groups of 128) and run it on a qcompile kernel "
                             "(default: dense, exact)")


def tune_checkpoint(args: argparse.Namespace) -> int:
    """``qcompile tune --from-gptq DIR``: every distinct layer shape of a checkpoint, once."""
    from qcompile.progress import TuneProgress  # tqdm: only a tuning run pays for it

    preset = targets.get(args.target)
    db_layers = open_layers(args)
    layers = gptq.load(args.from_gptq)
    count = f"{len(layers)} GPTQ layers"
    if args.fused:  # the shapes qcompile generate (qcompile.hf) runs
        layers = gptq.fuse_shared_inputs(layers)
        count += f" ({len(layers)} with q/k/v and gate/up fused)"
    int8 = getattr(args, "int8_activations", False)
    specs = [spec for m in args.batch
             for spec in gptq.distinct_specs(layers, m=m, dtype=args.dtype, int8_activations=int8)]
    if args.lm_head_bits is not None:  # the quantized lm_head of qcompile generate
        heads = [gptq.lm_head_spec(args.from_gptq, args.lm_head_bits, m, args.dtype)
                 for m in args.batch]
        specs = [(s, names + ["lm_head"] if s in heads else names) for s, names in specs]
        specs += [(head, ["lm_head"]) for head in heads if head not in {s for s, _ in specs}]
    print(f"{args.from_gptq}: {count}, {len(specs)} distinct kernel specs "
          f"(M={','.join(map(str, args.batch))}, {args.dtype})", flush=True)
    policy = measure_policy(args)
    if len(specs) > 1 and policy is None and all(
            family_of(s).measure_arguments(s) is None for s, _ in specs):
        return tune_layer_set_job(args, preset, db_layers, specs)
    failed = 0
    started = STARTED  # the first run's time counts TVM's start-up
    for index, (spec, names) in enumerate(specs, 1):
        shared = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        print(f"[{index}/{len(specs)}] {spec.name()}: {shared}", flush=True)
        with TuneProgress(args.trials, f"{spec.name()} @{preset.name}", started=started,
                          enabled=not args.quiet, phase="starting TVM") as progress:
            from qcompile.tune import tune  # loads TVM once (seconds): the bar shows it

            summary = tune(spec, preset, trials=args.trials, layers=db_layers, seed=args.seed,
                           progress=progress, force=args.force, policy=measure_policy(args))
        started = None
        print("\n".join(summary.lines()))
        failed += summary.best_us is None
    return 1 if failed else 0


def tune_layer_set_job(args: argparse.Namespace, preset, db_layers, specs) -> int:
    """A checkpoint's distinct specs as one job: ``--trials`` per spec on average, shared by
    how often the model calls each (its layers) and how much each still gains."""
    from qcompile.progress import TuneProgress  # tqdm: only a tuning run pays for it

    total = args.trials * len(specs)
    print(f"tuning them as one job: {total} trials shared by the {len(specs)} specs, weighted "
          "by their layers; a spec stops early when its best stops moving", flush=True)
    with TuneProgress(total, f"{len(specs)} specs @{preset.name}", started=STARTED,
                      enabled=not args.quiet, phase="starting TVM") as progress:
        from qcompile.tune import tune_layer_set  # loads TVM (seconds): the bar shows it

        summary = tune_layer_set([s for s, _ in specs], [len(names) for _, names in specs],
                                 preset, trials=total, layers=db_layers, seed=args.seed,
                                 progress=progress, force=args.force)
    print("\n".join(summary.lines()))
    return 1 if any(row.best_us is None for row in summary.rows) else 0


def cmd_generate(args: argparse.Namespace) -> int:
    """``qcompile generate``: greedy tokens from a GPTQ checkpoint on qcompile kernels, with
    prefill and decode tokens/s (qcompile/hf.py)."""
    preset = targets.get(args.target)
    supported, reason = preset.host_support()
    if not supported:
        raise UsageError(f"target {preset.name!r} cannot run on this host: {reason}")
    directory = Path(args.from_gptq)
    if not directory.is_dir():
        raise FormatError(f"--from-gptq {directory}: no checkpoint directory there")
    gptq.read_config(directory)  # bits and group size, before torch and TVM load
    if args.prompt is not None and not (directory / "tokenizer.json").is_file():
        raise UsageError(f"--prompt needs a tokenizer in {directory} (tokenizer.json); give "
                         "token ids instead: --prompt-tokens 1,2,3")
    try:
        from qcompile import hf  # torch and transformers: seconds
    except ModuleNotFoundError as error:
        if error.name not in ("transformers", "tokenizers"):
            raise
        raise UsageError(f"qcompile generate needs {error.name}: pip install "
                         "'qcompile[model]'") from None
    import torch  # loaded by qcompile.hf already

    vocabulary = hf.model_config(directory).vocab_size
    tokenizer = None
    if args.prompt is not None:
        from transformers import AutoTokenizer  # loaded by qcompile.hf already

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        ids = tokenizer(args.prompt)["input_ids"]
    else:
        ids = args.prompt_tokens
    outside = [i for i in ids if i >= vocabulary]
    if outside:
        raise UsageError(f"token {outside[0]} is outside the vocabulary of {directory} "
                         f"(ids 0..{vocabulary - 1})")
    if not ids:
        raise UsageError(f"the prompt {args.prompt!r} has no tokens")
    with warnings.catch_warnings():  # the report below says it in one line
        warnings.simplefilter("ignore")
        model = hf.from_gptq(directory, target=args.target, db=args.db, dtype=args.dtype,
                             on_missing=args.on_missing, tune_trials=args.trials,
                             fuse=not args.no_fuse, int8_activations=args.int8_activations,
                             lm_head_bits=args.lm_head_bits)
        report = model.qcompile
        hf.generate(model, torch.tensor([ids[:1]]), 1)  # untimed: first calls' set-up costs
        result = hf.generate(model, torch.tensor([ids]), args.max_new_tokens)
    tokens = result.tokens[0].tolist()
    print(f"prompt: {len(ids)} tokens: {' '.join(map(str, ids))}")
    print(f"generated: {len(tokens)} tokens: {' '.join(map(str, tokens))}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(tokens)}")
    print(f"prefill: {result.prompt_tokens} tokens in {result.prefill_s:.3f} s = "
          f"{result.prefill_tokens_per_s:.1f} tokens/s")
    decode = result.decode_tokens_per_s
    print(f"decode: {len(tokens) - 1} tokens in {result.decode_s:.3f} s = "
          + (f"{decode:.1f} tokens/s" if decode is not None else "n/a (one new token)"))
    tuned = report.specs - len(report.untuned)
    print(f"kernels: {report.specs} specs on {preset.name}, {tuned} tuned"
          + (f", {len(report.untuned)} untuned; tune them once with: {report.command}"
             if report.untuned else ""))
    return 0


def cmd_rpc_server(args: argparse.Namespace) -> int:
    """``qcompile rpc-server``: TVM's RPC server, registered with a tracker, that tells tuners
    which device it is (qcompile/remote.py)."""
    from qcompile.remote import serve  # TVM loads when it serves

    serve(args.tracker, args.key, host_name=args.host, port=args.port, name=args.name)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    shapes = args.shapes or [args.shape]
    # every spec's rules first (seconds), then one TVM start for all of them
    specs = [spec_from_args(argparse.Namespace(**{**vars(args), "shape": shape}))
             for shape in shapes]
    preset = targets.get(args.target)
    require_build_host(preset, args.for_another_host)  # before TVM loads
    check_output_dir(args.out)
    layers = open_layers(args, packs=True, names=[spec.name() for spec in specs])
    from qcompile.build import build_set  # loads TVM (seconds)

    sources = {}  # where a record may come from -> how to say it
    if layers.packs is not None:
        from qcompile.trust.packs import packs_dir  # light CLI: SQLAlchemy on use

        sources[layers.packs.display_url] = f"a record pack in {packs_dir()} (qcompile db packs)"
    # the specs' claims are timed in one batch: one pool of build workers, one runner
    for result in build_set(specs, preset, args.out, layers=layers,
                            for_another_host=args.for_another_host):
        print(f"built {result.so_path} from record {result.record_id}: {result.how}; "
              f"manifest {result.manifest_path}")
        if result.source:
            print(f"  0 trials: the record comes from {sources.get(result.source, result.source)}")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    """``qcompile quantize``: float weights + calibration data -> the family's arrays (.npz)."""
    spec = spec_from_args(args)
    family = get_family(spec.family)
    if spec.family != "mixed":  # the .npz and report written below are the mixed format's
        raise SpecError(f"family {spec.family!r} has no quantizer; quantize supports: mixed")
    if not (args.calibration or args.hessian):
        raise UsageError("quantize needs calibration data: give --calibration NPY (activations "
                         "[S, K]) or --hessian NPY ([K, K])")
    check_output_file(args.out)
    weight = _load_npy(args.weight, "--weight")
    calibration = _load_npy(args.calibration, "--calibration") if args.calibration else None
    hessian = _load_npy(args.hessian, "--hessian") if args.hessian else None
    result = family.quantize(spec, weight, calibration=calibration, hessian=hessian)
    np.savez(args.out, **result.tensors.operands())
    report = result.report()
    print(json.dumps(report, indent=2) if args.json else
          f"{spec.name()}: {report['average_bits']:.3f} bits per weight (eq. 10: "
          f"{report['eq10_bits']:.3f}), {report['four_bit_groups']} of {report['groups']} groups "
          f"4-bit, {report['outliers']} outliers, weight error {report['weight_error']:.4f}, "
          f"calibration output error {report['output_error']:.3e}; wrote {args.out}")
    return 0


def _load_npy(path: str, flag: str):
    """A .npy array (never a pickle); an unreadable file is a FormatError naming the flag."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        reason = str(error).split(". ")[0]  # numpy's first sentence says it
        raise FormatError(f"{flag} {path} is not a .npy array: {reason}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiu":
        kind = array.dtype if isinstance(array, np.ndarray) else "several arrays (.npz)"
        raise FormatError(f"{flag} {path} must hold a numeric array; it holds {kind}")
    return array


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="qcompile", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("targets", help="list target presets and which this host supports")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--hw", metavar="K=V,...",
                   help="override the detected CPU model, e.g. l1d=48K,l2=2M,l3=32M,cores=8 "
                        "(also $QCOMPILE_HW)")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("tune", help="tune a kernel spec for a target into the database")
    p.add_argument("--target", required=True, choices=sorted(targets.PRESETS))
    add_spec_arguments(p, batches=True)
    p.add_argument("--trials", type=positive_int, default=DEFAULT_TRIALS,
                   help=f"candidates to build and measure (default {DEFAULT_TRIALS})")
    p.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--from-gptq", metavar="DIR", default=None,
                   help="tune every distinct layer shape of this GPTQ checkpoint (bits, group "
                        "size and shapes come from it; --batch and --dtype still apply)")
    p.add_argument("--fused", action="store_true",
                   help="with --from-gptq: tune the shapes qcompile generate runs, q/k/v and "
                        "gate/up fused into one layer each")
    add_lm_head_argument(p)
    add_db_argument(p)
    add_layer_arguments(p)
    p.add_argument("--force", action="store_true",
                   help="tune even when the databases already hold enough records (default: "
                        "reuse them, 0 trials)")
    remote = p.add_argument_group("remote measurement (TVM RPC)")
    remote.add_argument("--rpc-tracker", type=tracker_address, metavar="HOST:PORT", default=None,
                        help="build here, measure on the servers registered with this TVM RPC "
                             "tracker (started with qcompile rpc-server)")
    remote.add_argument("--rpc-key", metavar="KEY", default=None,
                        help="the servers' key at the tracker (with --rpc-tracker)")
    remote.add_argument("--rpc-timeout", type=positive_int, default=120, metavar="S",
                        help="seconds one remote measuring session may last (default 120)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("generate", help="generate tokens with a GPTQ Llama-family checkpoint on "
                                        "qcompile kernels; prints tokens/s")
    p.add_argument("--from-gptq", required=True, metavar="DIR",
                   help="the checkpoint: config.json, quantize config, safetensors")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-tokens", type=token_ids, metavar="IDS",
                        help="the prompt as token ids, e.g. 1,2,3")
    prompt.add_argument("--prompt", metavar="TEXT",
                        help="the prompt as text (needs a tokenizer in DIR)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N",
                   help="tokens to generate (default 32; fewer if the model ends the text)")
    p.add_argument("--target", required=True, choices=sorted(targets.PRESETS),
                   help="a CPU preset runs the model on the CPU, a CUDA preset on the GPU")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                   help="activation dtype (default float32; a GPU model wants float16 or "
                        "bfloat16, which take its tensor cores)")
    p.add_argument("--int8-activations", action="store_true",
                   help="integer dot-product kernels for 2/3/4-bit layers (x rounded to int8)")
    p.add_argument("--on-missing", default="untuned", choices=("untuned", "error", "tune"),
                   help="a kernel without a tuned record: build it untuned (default), stop "
                        "with the command that tunes it, or tune it now (--trials)")
    p.add_argument("--trials", type=positive_int, default=DEFAULT_TRIALS,
                   help=f"candidates per kernel with --on-missing tune (default {DEFAULT_TRIALS})")
    p.add_argument("--no-fuse", action="store_true",
                   help="run q/k/v and gate/up as separate kernels")
    add_lm_head_argument(p)
    add_db_argument(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("rpc-server", help="serve this machine's device to tuners through a TVM "
                                          "RPC tracker (qcompile tune --rpc-tracker)")
    p.add_argument("--tracker", required=True, type=tracker_address, metavar="HOST:PORT",
                   help="the TVM RPC tracker to register with")
    p.add_argument("--key", required=True, help="the device key tuners ask for (--rpc-key)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=9090,
                   help="first port to try; the next free one below PORT+100 is taken "
                        "(default 9090)")
    p.add_argument("--name", default=None,
                   help="the host name records measured here carry (default: "
                        "$QCOMPILE_RPC_SERVER_NAME, else this host's)")
    p.set_defaults(func=cmd_rpc_server)

    p = sub.add_parser("build", help="compile the best record into DIR/<name>.so + manifest")
    p.add_argument("--target", required=True, choices=sorted(targets.PRESETS))
    add_spec_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="KxN,KxN,...",
                   help="build several shapes with the other spec flags, in one process (a "
                        "model's layer set: TVM starts once); instead of --shape")
    p.add_argument("--for-another-host", action="store_true",
                   help="build for a CPU target whose instructions this host lacks (the "
                        "library is for a host that has them; default: refuse)")
    add_db_argument(p)
    add_layer_arguments(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("quantize", help="quantize float weights with calibration data into a "
                                        "family's arrays (.npz for Kernel.prepare(**arrays))")
    add_spec_arguments(p)
    p.add_argument("--weight", required=True, metavar="NPY", type=existing_file,
                   help="float weight [K, N] (.npy)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--calibration", metavar="NPY", type=existing_file,
                      help="calibration activations [S, K] (.npy)")
    data.add_argument("--hessian", metavar="NPY", type=existing_file,
                      help="or the Hessian [K, K] (.npy)")
    p.add_argument("--out", required=True, metavar="NPZ", help="where the arrays go")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("db", help="look after the tuning database (qcompile db -h)")
    add_db_commands(p.add_subparsers(dest="db_command", required=True))
    add_debug_flag(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``qcompile``: a user error is one line on stderr and exit status 2 (qcompile/
    cli_args.py); ``--debug`` or ``QCOMPILE_DEBUG=1`` adds the traceback."""
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
