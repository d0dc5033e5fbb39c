"""A whole model: decode and prefill tokens/s of a GPTQ Llama on qcompile kernels, with
transformers fp32 (the same weights, dequantized) as the peer in the same run.

The model is random (a TinyLlama-1.1B shape by default), quantized by rounding to nearest and
written as a GPTQ checkpoint by ``qcompile.hf.write_gptq`` (``--checkpoint DIR`` keeps it for
the next run). Per round, each engine in turn:

    decode    B sequences (--batches) of a short prompt, then --decode-tokens greedy tokens:
              new tokens after the first, all sequences, per second
    prefill   one prompt of --prompt tokens, one new token: prompt tokens per second

Both engines are checked first: the same greedy tokens for a short prompt. Kernels come from
the database (``qcompile tune --from-gptq DIR --batch 1,4,16 --fused``; untuned otherwise,
which the result records).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tools.harness import cli, results
from tools.harness.cpu_timing import median
from tools.harness.random_gptq import MODELS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(MODELS), default="tinyllama",
                        help="the model's shape (default tinyllama: TinyLlama-1.1B's)")
    parser.add_argument("--checkpoint", metavar="DIR", default=None,
                        help="where the GPTQ checkpoint is (written there when missing)")
    parser.add_argument("--target", default="avx2")
    parser.add_argument("--db", default=None, help="tuning database URL")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--batches", type=cli.ints, default="1,4,16",
                        help="sequences per decode step (default 1,4,16)")
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512, help="prefill prompt tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")


def checkpoint(args) -> Path:
    """The benchmark's GPTQ checkpoint: ``--checkpoint`` if it holds one, else written."""
    import tempfile

    import torch
    import transformers

    from qcompile import hf

    directory = Path(args.checkpoint or tempfile.mkdtemp(prefix=f"qcompile-{args.model}-"))
    if (directory / "config.json").is_file():
        return directory
    config = transformers.LlamaConfig(**MODELS[args.model],
                                      max_position_embeddings=args.prompt + 64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    print(f"writing a random {args.model} model, {args.bits}-bit g{args.group_size}, to "
          f"{directory}", flush=True)
    return hf.write_gptq(model, directory, bits=args.bits, group_size=args.group_size)


def main(args) -> int:
    import torch

    import targets
    from qcompile import hf

    preset = targets.get(args.target)
    torch.set_num_threads(preset.hardware().cores)
    directory = checkpoint(args)
    ours = hf.from_gptq(directory, target=args.target, db=args.db,
                        batch_sizes=[b for b in args.batches if b <= 16])
    engines = {"qcompile": ours, "transformers_fp32": hf.dequantized(directory, torch.float32)}
    report = ours.qcompile
    print(f"{directory} on {preset.name}: {report.specs} kernel specs, "
          f"{len(report.untuned)} untuned; {args.rounds} rounds", flush=True)
    vocabulary = ours.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def prompt(batch: int, length: int) -> torch.Tensor:
        return torch.randint(0, vocabulary, (batch, length), generator=generator)

    check = prompt(1, 8)
    tokens = {name: hf.generate(model, check, 8, min_new_tokens=8).tokens
              for name, model in engines.items()}
    same = torch.equal(*tokens.values())
    print(f"greedy tokens agree: {same}", flush=True)
    decode = {(name, b): [] for name in engines for b in args.batches}
    prefill = {name: [] for name in engines}
    for _ in range(args.rounds):
        for batch in args.batches:
            ids = prompt(batch, 8)
            for name, model in engines.items():
                run = hf.generate(model, ids, args.decode_tokens,
                                  min_new_tokens=args.decode_tokens)
                decode[(name, batch)].append(run.decode_tokens_per_s)
        ids = prompt(1, args.prompt)
        for name, model in engines.items():
            prefill[name].append(hf.generate(model, ids, 1).prefill_tokens_per_s)
    rows = []
    for batch in args.batches:
        row = {"phase": "decode", "batch": batch, **{
            f"{name}_tokens_per_s": median(decode[(name, batch)]) for name in engines}}
        rows.append(row)
    rows.append({"phase": "prefill", "prompt": args.prompt, **{
        f"{name}_tokens_per_s": median(prefill[name]) for name in engines}})
    for row in rows:
        row["qcompile_over_transformers"] = (row["qcompile_tokens_per_s"]
                                             / row["transformers_fp32_tokens_per_s"])
        what = f"decode B={row['batch']:3d}" if row["phase"] == "decode" else \
            f"prefill {row['prompt']} tokens"
        print(f"  {what:20s} qcompile {row['qcompile_tokens_per_s']:9.1f} tokens/s   "
              f"transformers fp32 {row['transformers_fp32_tokens_per_s']:9.1f} tokens/s   "
              f"ratio {row['qcompile_over_transformers']:5.2f}", flush=True)
    if args.json:
        result = results.header("model", "cpu", {k: v for k, v in vars(args).items()
                                                 if k not in ("func", "command")})
        result.update(checkpoint=str(directory), target=preset.name,
                      threads=torch.get_num_threads(), kernel_specs=report.specs,
                      untuned=list(report.untuned), tokens_agree=same, rows=rows,
                      load_average=list(os.getloadavg()))
        print(f"wrote {results.write(args.json, result)}")
    return 0
