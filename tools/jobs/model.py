"""A whole model: decode and prefill tokens/s of a GPTQ Llama on qcompile kernels, with
transformers fp32 (the same weights, dequantized) and llama.cpp's own ``llama-bench`` (a GGUF
of the same weights, quantized by llama.cpp to ``--llama-cpp``'s types) as peers in the same
run.

The model is random (a TinyLlama-1.1B shape by default), quantized by rounding to nearest and
written as a GPTQ checkpoint by ``qcompile.hf.write_gptq`` (``--checkpoint DIR`` keeps it for
the next run). Per round, each engine in turn:

    decode    B sequences (--batches) of a short prompt, then --decode-tokens greedy tokens:
              new tokens after the first, all sequences, per second; through ``generate()``
              (its loop, masks and stopping checks included), and through a bare loop over a
              static KV cache (tools/harness/decode.py: a forward and an argmax a step, as
              llama-bench decodes), the ``loop`` figures
    prefill   one prompt of --prompt tokens, one new token: prompt tokens per second

Both engines are checked first: the same greedy tokens for a short prompt. Kernels come from
the database (``qcompile tune --from-gptq DIR --batch 1,4,16 --fused``; untuned otherwise,
which the result records). Then torch.profiler says which share of a B = 1 generation (a
one-token prompt, --decode-tokens steps) is spent inside ``qcompile::quant_linear``.

llama.cpp (built on demand: tools/harness/llama_bench.py) runs after our rounds, with the same
threads: llama-bench's batch-1 decode (``-n``) and its prefill of --prompt tokens (``-p``),
averaged over --rounds repetitions; it has no batched decode, so B > 1 rows have no llama.cpp
figure.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from qcompile.gptq import LM_HEAD_BITS
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
    parser.add_argument("--llama-cpp", default="Q4_K_M,Q4_0", metavar="TYPES",
                        help="llama.cpp types to quantize the GGUF to and run with llama-bench "
                             "(comma-separated; 'none' for no llama.cpp peer)")
    parser.add_argument("--lm-head-bits", type=int, choices=LM_HEAD_BITS, default=None,
                        help="our model's lm_head quantized at load (qcompile.hf's "
                             "lm_head_bits; llama.cpp's Q4_K_M keeps it in 6 bits)")
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
                        batch_sizes=[b for b in args.batches if b <= 16],
                        lm_head_bits=args.lm_head_bits)
    engines = {"qcompile": ours, "transformers_fp32": hf.dequantized(directory, torch.float32)}
    report = ours.qcompile
    head = f"{args.lm_head_bits}-bit" if args.lm_head_bits else "float32"
    print(f"{directory} on {preset.name}: {report.specs} kernel specs, "
          f"{len(report.untuned)} untuned, {head} lm_head; {args.rounds} rounds", flush=True)
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
    loop = {(name, b): [] for name in engines for b in args.batches}
    prefill = {name: [] for name in engines}
    for _ in range(args.rounds):
        for batch in args.batches:
            ids = prompt(batch, 8)
            for name, model in engines.items():
                run = hf.generate(model, ids, args.decode_tokens,
                                  min_new_tokens=args.decode_tokens)
                decode[(name, batch)].append(run.decode_tokens_per_s)
                loop[(name, batch)].append(loop_tokens_per_s(model, ids, args.decode_tokens))
        ids = prompt(1, args.prompt)
        for name, model in engines.items():
            prefill[name].append(hf.generate(model, ids, 1).prefill_tokens_per_s)
    share = kernel_share(ours, vocabulary, args.decode_tokens)
    print(f"  B=1 generation: {share['kernel_share']:.0%} of {share['wall_ms']:.0f} ms inside "
          f"qcompile::quant_linear ({share['calls']} calls)", flush=True)
    peer = llama_cpp_rows(args, engines["transformers_fp32"], directory, torch.get_num_threads())
    rows = []
    for batch in args.batches:
        row = {"phase": "decode", "batch": batch, **{
            f"{name}_tokens_per_s": median(decode[(name, batch)]) for name in engines}, **{
            f"{name}_loop_tokens_per_s": median(loop[(name, batch)]) for name in engines}}
        rows.append(row)
    rows.append({"phase": "prefill", "prompt": args.prompt, **{
        f"{name}_tokens_per_s": median(prefill[name]) for name in engines}})
    for kind, figures in peer.get("types", {}).items():
        for row in rows:
            if row["phase"] == "prefill" or row["batch"] == 1:
                tokens_per_s = figures[f"{row['phase']}_tokens_per_s"]
                row[f"llama_cpp_{kind}_tokens_per_s"] = tokens_per_s
                row[f"qcompile_over_llama_cpp_{kind}"] = row["qcompile_tokens_per_s"] / tokens_per_s
                if row["phase"] == "decode":
                    row[f"qcompile_loop_over_llama_cpp_{kind}"] = (
                        row["qcompile_loop_tokens_per_s"] / tokens_per_s)
    for row in rows:
        row["qcompile_over_transformers"] = (row["qcompile_tokens_per_s"]
                                             / row["transformers_fp32_tokens_per_s"])
        what = f"decode B={row['batch']:3d}" if row["phase"] == "decode" else \
            f"prefill {row['prompt']} tokens"
        print(f"  {what:20s} qcompile {row['qcompile_tokens_per_s']:9.1f} tokens/s   "
              f"transformers fp32 {row['transformers_fp32_tokens_per_s']:9.1f} tokens/s   "
              f"ratio {row['qcompile_over_transformers']:5.2f}" + "".join(
                  f"   llama.cpp {kind} {row[f'llama_cpp_{kind}_tokens_per_s']:9.1f} "
                  f"(ours {row[f'qcompile_over_llama_cpp_{kind}']:.2f}x)"
                  for kind in peer.get("types", {}) if f"llama_cpp_{kind}_tokens_per_s" in row),
              flush=True)
    for row in rows:
        if row["phase"] == "decode":
            print(f"  decode B={row['batch']:3d} loop    qcompile "
                  f"{row['qcompile_loop_tokens_per_s']:9.1f} tokens/s   transformers fp32 "
                  f"{row['transformers_fp32_loop_tokens_per_s']:9.1f} tokens/s" + "".join(
                      f"   (ours {row[f'qcompile_loop_over_llama_cpp_{kind}']:.2f}x "
                      f"llama.cpp {kind})" for kind in peer.get("types", {})
                      if f"qcompile_loop_over_llama_cpp_{kind}" in row), flush=True)
    if "unavailable" in peer:
        print(f"  llama.cpp: {peer['unavailable']}", flush=True)
    if args.json:
        result = results.header("model", "cpu", {k: v for k, v in vars(args).items()
                                                 if k not in ("func", "command")})
        result.update(checkpoint=str(directory), target=preset.name,
                      threads=torch.get_num_threads(), kernel_specs=report.specs,
                      untuned=list(report.untuned), tokens_agree=same, rows=rows,
                      kernel_share=share, llama_cpp=peer,
                      load_average=list(os.getloadavg()))
        print(f"wrote {results.write(args.json, result)}")
    return 0


def loop_tokens_per_s(model, prompt, steps: int) -> float:
    """Tokens/s of ``prompt``'s B sequences decoded ``steps`` greedy steps by a bare loop over
    a static KV cache (:class:`tools.harness.decode.Decoder`), after two untimed steps."""
    from tools.harness import decode

    decoder = decode.Decoder(model, prompt.shape[0], prompt.shape[1] + steps + 2)
    decoder.prefill(prompt)
    decoder.warm()
    return prompt.shape[0] / decoder.seconds_per_step(steps)


def kernel_share(model, vocabulary: int, tokens: int) -> dict:
    """The share of a B = 1 greedy generation (a one-token prompt, ``tokens`` new tokens: every
    forward one token long) spent inside ``qcompile::quant_linear`` (torch.profiler's CPU
    time of the operator, its Python wrapper included), against the generation's wall time
    under the profiler."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from qcompile import hf

    ids = torch.randint(0, vocabulary, (1, 1), generator=torch.Generator().manual_seed(1))
    hf.generate(model, ids, tokens, min_new_tokens=tokens)  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        hf.generate(model, ids, tokens, min_new_tokens=tokens)
        wall = time.perf_counter() - started
    ours = [e for e in prof.key_averages() if e.key == "qcompile::quant_linear"]
    inside = sum(e.cpu_time_total for e in ours) / 1e6
    return {"wall_ms": wall * 1e3, "kernel_ms": inside * 1e3, "kernel_share": inside / wall,
            "calls": sum(e.count for e in ours), "forwards": tokens}


def llama_cpp_rows(args, dense_model, directory: Path, threads: int) -> dict:
    """llama-bench on a GGUF of ``dense_model`` (the checkpoint dequantized), quantized to each
    of ``--llama-cpp``'s types: {"types": {type: figures}, "build": where}, or
    {"unavailable": why} when llama.cpp cannot be built here."""
    from tools.harness import llama_bench, llama_cpp

    kinds = [k for k in args.llama_cpp.split(",") if k and k != "none"]
    if not kinds:
        return {}
    try:
        bin_dir = llama_bench.build()
    except llama_cpp.BuildError as why:
        return {"unavailable": str(why)}
    ggufs = directory / "gguf"
    ggufs.mkdir(exist_ok=True)
    source = ggufs / "model-f16.gguf"
    if not source.is_file():
        llama_bench.write_gguf(dense_model, source)
    out = {"build": str(bin_dir), "types": {}}
    for kind in kinds:
        quantized = llama_bench.quantize(bin_dir, source, ggufs / f"model-{kind.lower()}.gguf",
                                         kind, threads)
        figures = llama_bench.run_bench(bin_dir, quantized, threads=threads, prompt=args.prompt,
                                        tokens=max(args.decode_tokens, 32),
                                        repetitions=args.rounds)
        out["types"][kind] = figures
        print(f"  llama.cpp {kind}: decode {figures['decode_tokens_per_s']:.1f} tokens/s, "
              f"prefill {figures['prefill_tokens_per_s']:.1f}", flush=True)
    return out
