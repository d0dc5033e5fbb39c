"""A whole model on the GPU: decode tokens/s at batch 1, 4 and 16 and prefill tokens/s of a
512-token prompt for a GPTQ Llama of Llama-2-7B's shape, on qcompile's kernels and on its peers
in the same run, and where a decode step's time goes.

The checkpoint is random, in the real GPTQ format (4-bit g128 by default; ``--bits 4,3,2``),
written by ``qcompile.gptq.save`` into ``--checkpoint-dir`` on the machine that runs the job
(tools/harness/random_gptq.py; reused by the next run). Engines (tools/harness/models.py):

    qcompile        ``qcompile.hf.from_gptq(target="cuda", dtype="float16")``: our kernels
                    (untuned unless ``--db`` has records), q/k/v and gate/up fused
    transformers    transformers' model with the same weights dequantized to fp16
    humming         humming-kernels' GPTQ layers, fused as vLLM fuses them (where installed)

Every engine decodes over a transformers StaticCache, one CUDA graph per decode step (forward,
greedy token written back; tools/harness/decode.py), ``graph`` mode; the engines of
``--compile`` also run ``compiled``: ``torch.compile`` (inductor, fullgraph) of the forward,
captured the same way, which is what ``mode="reduce-overhead"`` does (its own cudagraphs would
nest inside ours). Before anything is timed, each engine's logits are checked against the
float64 model of the same checkpoint: a prompt's (prefill) and the first decode step's of each
batch (through the captured graph). Then, in ``--rounds`` interleaved rounds, medians of:

    decode    B sequences after a --decode-prompt of 32 tokens: --decode-tokens steps timed
              with CUDA events; tokens/s = B * steps / seconds
    prefill   one --prompt of 512 tokens, eager, no cache, the last position's logits;
              qcompile twice: its dense prefill path (default) and its M = 16 kernels

and a torch.profiler breakdown of our decode steps (``--profile-batches``): the share inside
qcompile's kernels, the rest by kernel category, and the gaps between kernels. Phases that would
pass ``--budget-s`` (compiling, profiling, further bit widths) are skipped and say so. A
``--target avx2`` run is the same job on the CPU, float32, eager steps (a smoke test).

A smoke run (meant to take about 2 minutes on the GPU machine), then the real one:

    python tools/bench.py model-gpu --layers 2 --rounds 2 --json /tmp/smoke.json
    python tools/bench.py model-gpu --json tools/results/h200/model_llama2_7b.json
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from qcompile.gptq import LM_HEAD_BITS
from tools.harness import cli, decode, models, random_gptq, results

ENGINES = ("qcompile", "transformers", "humming")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(random_gptq.MODELS), default="llama2-7b",
                        help="the model's shape (default llama2-7b)")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: the model's; 2 for a smoke run)")
    parser.add_argument("--bits", type=cli.ints, default="4",
                        help="weight bits, one checkpoint each (default 4; 3 and 2 too)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--target", default="cuda", help="cuda (default), or a CPU preset")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default=None,
                        help="activations (default float16 on a GPU, float32 on a CPU)")
    parser.add_argument("--engines", type=cli.choices(*ENGINES), default=",".join(ENGINES))
    parser.add_argument("--compile", type=cli.choices(*ENGINES, "none"),
                        default="qcompile,transformers",
                        help="engines also run under torch.compile (default qcompile and "
                             "transformers; none)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend (aot_eager: fast compile, for tests)")
    parser.add_argument("--batches", type=cli.ints, default="1,4,16",
                        help="sequences per decode step (default 1,4,16)")
    parser.add_argument("--decode-prompt", type=int, default=32,
                        help="prompt tokens before decoding (default 32)")
    parser.add_argument("--decode-tokens", type=int, default=64,
                        help="decode steps timed per round (default 64)")
    parser.add_argument("--prompt", type=int, default=512, help="prefill prompt tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-batches", type=cli.ints, default="1,16",
                        help="decode batches whose qcompile steps are profiled (default 1,16)")
    parser.add_argument("--checkpoint-dir", default="/tmp/qcompile-model-gpu",
                        help="where the random checkpoints are written (and reused)")
    parser.add_argument("--db", default=None, help="tuning database URL")
    parser.add_argument("--lm-head-bits", type=int, choices=LM_HEAD_BITS, default=None,
                        help="our model's lm_head quantized at load (qcompile.hf's "
                             "lm_head_bits; the peers keep theirs in fp16)")
    parser.add_argument("--budget-s", type=float, default=330,
                        help="skip optional phases that would end past this many seconds")
    parser.add_argument("--json", metavar="PATH")


class Clock:
    """Seconds since the job started, whether a phase of ``estimate`` seconds still fits in
    the budget, and the timeline of what was said when (the result's ``timeline``)."""

    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.timeline: list[tuple[float, str]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def fits(self, estimate: float) -> bool:
        return self.elapsed() + estimate <= self.budget_s

    def say(self, text: str) -> None:
        """Print ``text`` after the seconds since the start, and keep it."""
        self.timeline.append((round(self.elapsed(), 1), text))
        print(f"[{self.elapsed():6.0f} s] {text}", flush=True)


def main(args) -> int:
    import torch

    import targets

    preset = targets.get(args.target)
    device = torch.device("cuda" if preset.kind == "cuda" else "cpu")
    dtype = args.dtype or ("float16" if device.type == "cuda" else "float32")
    if device.type == "cpu":
        torch.set_num_threads(preset.hardware().cores)
    for name in ("recompile_limit", "cache_size_limit"):  # one compile per engine and batch
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    clock = Clock(args.budget_s)
    params = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    result = results.header("model-gpu", device.type, params)
    result.update(target=preset.name, dtype=dtype, runs=[])

    def save() -> None:
        result["elapsed_s"] = clock.elapsed()
        result["timeline"] = clock.timeline
        if args.json:
            results.write(args.json, result)

    failed = False
    for index, bits in enumerate(args.bits):
        if index and not clock.fits(120):
            result["runs"].append({"bits": bits, "skipped": "over --budget-s"})
            clock.say(f"{bits}-bit: skipped (over --budget-s {args.budget_s:.0f})")
            continue
        run = {"bits": bits}
        result["runs"].append(run)
        failed |= not run_bits(args, bits, dtype, preset.name, device, clock, run, save)
        save()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        print(f"wrote {results.write(args.json, result)}")
    return 1 if failed else 0


def run_bits(args, bits: int, dtype: str, target: str, device, clock: Clock, run: dict,
             save) -> bool:
    """One checkpoint: write it, build the engines, check them, time what passed, profile
    ours; fills ``run``; False when a check failed."""
    import torch

    config = random_gptq.llama_config(
        args.model, layers=args.layers,
        positions=max(args.prompt, args.decode_prompt + args.decode_tokens) + 64)
    layers = config.num_hidden_layers
    directory = Path(args.checkpoint_dir) / (f"{args.model}-l{layers}-b{bits}"
                                             f"-g{args.group_size}")
    started = time.monotonic()
    random_gptq.write(directory, config, bits=bits, group_size=args.group_size,
                      device="cuda" if torch.cuda.is_available() else "cpu")
    run.update(model=args.model, layers=layers, checkpoint=str(directory),
               checkpoint_s=time.monotonic() - started, checks={}, failures={})
    clock.say(f"{bits}-bit {args.model} ({layers} layers, g{args.group_size}) at {directory} "
              f"in {run['checkpoint_s']:.0f} s")

    generator = torch.Generator().manual_seed(bits)
    vocabulary = config.vocab_size
    prefill_prompt = torch.randint(0, vocabulary, (1, args.prompt), generator=generator)
    sequences = {b: torch.randint(0, vocabulary, (b, args.decode_prompt + 1),
                                  generator=generator) for b in args.batches}
    reference = references(directory, device, prefill_prompt, sequences, args.decode_prompt)
    clock.say(f"float64 reference logits in {reference['seconds']:.0f} s")

    engines, unavailable = build_engines(args, directory, bits, dtype, target, device, clock)
    run["engines"] = {e.name: {"detail": e.detail, "setup_s": e.setup_s, "dtype": e.dtype}
                      for e in engines}
    run["unavailable"] = unavailable
    save()

    prefills = check_prefill(engines, prefill_prompt, reference.pop("prefill"), run, clock)
    decoders = make_decoders(args, engines, sequences, device, clock, run)
    for decoder in decoders.values():  # after every decoder has run: workspaces are grown
        decoder.capture()
    check_decode(decoders, engines, sequences, reference["decode"], args.decode_prompt, run)
    clock.say(f"{len(decoders)} decoders captured and checked")
    print_checks(run["checks"])
    save()

    passed = {key: d for key, d in decoders.items() if run["checks"][check_label(*key)]["ok"]}
    run["decode"] = time_decode(passed, args.decode_tokens, args.rounds)
    run["prefill"] = [time_prefill(label, model, prefill_prompt, args.rounds)
                      for label, model in prefills if run["checks"][f"{label} prefill"]["ok"]]
    save()
    clock.say("timed")
    run["profiles"] = profile_decode(passed, args.profile_batches, run["decode"], device, clock)
    run["summary"] = summary(run)
    clock.say("profiled")
    print_table(run, args)
    for decoder in decoders.values():
        decoder.graph = None
    return all(c["ok"] for c in run["checks"].values())


def check_prefill(engines, prompt, expected, run: dict, clock: Clock) -> list:
    """Check every prefill variant's logits for ``prompt`` (eager; which also runs every kernel
    the prompts use before any graph is captured); an engine that raises is dropped. Returns
    the (label, model) pairs that ran."""
    import torch

    ran = []
    for engine in list(engines):
        try:
            for label, model in prefill_variants(engine):
                with torch.no_grad():
                    logits = model(prompt.to(engine.model.device), use_cache=False).logits[0]
                run["checks"][f"{label} prefill"] = check(logits, expected, engine.dtype)
                ran.append((label, model))
        except Exception as error:  # noqa: BLE001 - reported; the other engines still run
            run["failures"][f"{engine.name} prefill"] = one_line(error)
            clock.say(f"{engine.name} prefill failed: {one_line(error)}")
            engines.remove(engine)
    return ran


def check_label(name: str, mode: str, batch: int) -> str:
    return f"{name} {mode} decode B={batch}"


def check_decode(decoders: dict, engines, sequences, expected: dict, prompt_length: int,
                 run: dict) -> None:
    """Each decoder's first step, as it will be timed (a graph replay), from the reference
    sequence's next token, against the float64 logits of that position."""
    dtypes = {engine.name: engine.dtype for engine in engines}
    for (name, mode, batch), decoder in decoders.items():
        decoder.rewind(sequences[batch][:, prompt_length:].to(decoder.device))
        decoder.step()
        run["checks"][check_label(name, mode, batch)] = check(
            decoder.logits, expected[batch], dtypes[name], method=decoder.method)
        decoder.rewind()


def print_checks(checks: dict) -> None:
    for label, c in checks.items():
        flag = "ok" if c["ok"] else "FAILED: not timed"
        method = f" [{c['method']}]" if c.get("method") else ""
        print(f"  check {label:42s} max rel error {c['error']:.1e} (tolerance "
              f"{c['tolerance']:.0e}) {flag}{method}", flush=True)


def time_decode(decoders: dict, steps: int, rounds: int) -> list[dict]:
    """Seconds per step of every decoder, in ``rounds`` interleaved rounds: one row each."""
    samples = {key: [] for key in decoders}
    for _ in range(rounds):
        for key, decoder in decoders.items():
            samples[key].append(decoder.seconds_per_step(steps))
    rows = []
    for (name, mode, batch), values in samples.items():
        step_s = decode.median(values)
        rows.append({"engine": name, "mode": mode, "batch": batch,
                     "method": decoders[(name, mode, batch)].method, "step_ms": step_s * 1e3,
                     "tokens_per_s": batch / step_s, "samples_ms": [v * 1e3 for v in values]})
    return rows


def time_prefill(label: str, model, prompt, rounds: int) -> dict:
    seconds = decode.prefill_seconds(model, prompt, rounds)
    median = decode.median(seconds)
    return {"engine": label, "prompt": prompt.shape[1], "ms": median * 1e3,
            "tokens_per_s": prompt.shape[1] / median, "samples_ms": [s * 1e3 for s in seconds]}


def profile_decode(decoders: dict, batches, rows: list[dict], device, clock: Clock) -> dict:
    """Where our decode steps' time goes (GPU only): ``decode.step_profile`` per batch and
    mode of ours (graph: the eager model's step captured; compiled: torch.compile's)."""
    profiles = {}
    for batch in batches if device.type == "cuda" else ():
        for mode in ("graph", "compiled"):
            key = ("qcompile", mode, batch)
            if key not in decoders:
                continue
            label = f"B={batch}" if mode == "graph" else f"B={batch} {mode}"
            if not clock.fits(15):
                profiles[label] = {"skipped": "over --budget-s"}
                continue
            step_ms = next(r["step_ms"] for r in rows
                           if (r["engine"], r["mode"], r["batch"]) == key)
            profiles[label] = decode.step_profile(decoders[key], 8, step_ms * 1e-3)
    return profiles


def references(directory, device, prefill_prompt, sequences, prompt_length: int) -> dict:
    """float64 logits of the checkpoint's dense model: every position of ``prefill_prompt``,
    and position ``prompt_length`` (the first decode step) of each batch's sequences."""
    import torch

    started = time.monotonic()
    model = models.dense_model(directory, torch.float64, device)
    with torch.no_grad():
        out = {"prefill": model(prefill_prompt.to(device), use_cache=False).logits[0],
               "decode": {b: model(s.to(device), use_cache=False).logits[:, prompt_length]
                          for b, s in sequences.items()}}
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out["seconds"] = time.monotonic() - started
    return out


def check(logits, expected, dtype: str, method: str = "") -> dict:
    """max |logits - expected| / max |expected| against the engine's tolerance."""
    import torch

    got = logits.detach().to(torch.float64)
    expected = expected.to(got.device)
    if not torch.isfinite(got).all():
        error = float("inf")
    else:
        error = float((got - expected).abs().max() / expected.abs().max())
    out = {"error": error, "tolerance": models.TOLERANCE[dtype],
           "ok": error <= models.TOLERANCE[dtype]}
    if method:
        out["method"] = method
    return out


def build_engines(args, directory, bits: int, dtype: str, target: str, device, clock: Clock):
    """The engines of ``--engines`` that can run here, and {name: why not} for the others."""
    import torch

    engines, unavailable = [], {}
    for name in args.engines:
        started = time.monotonic()
        try:
            if name == "qcompile":
                model, detail = models.qcompile_model(directory, target, dtype, args.batches,
                                                      args.db, args.lm_head_bits)
                engine = models.Engine("qcompile", model, dtype, detail)
            elif name == "transformers":
                model = models.dense_model(directory, getattr(torch, dtype), device)
                engine = models.Engine(f"transformers_{dtype}", model, dtype,
                                       f"transformers' Llama, dense {dtype} weights, unfused")
            else:
                if device.type != "cuda":
                    raise models.Unavailable("humming-kernels runs on CUDA GPUs only")
                model, detail = models.humming_model(directory, bits, args.group_size)
                engine = models.Engine("humming", model, "float16", detail)
        except models.Unavailable as why:
            unavailable[name] = str(why)
            clock.say(f"{name}: unavailable: {why}")
            continue
        except Exception as error:  # noqa: BLE001 - one engine's failure (a JIT compile, say)
            unavailable[name] = f"failed to build: {one_line(error)}"
            clock.say(f"{name}: {unavailable[name]}")
            continue
        engine.setup_s = time.monotonic() - started
        engines.append(engine)
        clock.say(f"{engine.name} built in {engine.setup_s:.0f} s: {engine.detail}")
    return engines, unavailable


def prefill_variants(engine):
    """(label, model) pairs whose prefill is checked and timed: qcompile once per path."""
    if engine.name != "qcompile":
        return [(engine.name, engine.model)]
    return [("qcompile", engine.model), ("qcompile (M=16 kernels)", _KernelPrefill(engine.model))]


class _KernelPrefill:
    """Calls ``model`` with every QuantLinear's dense prefill path off (the prompt runs the
    M = 16 kernels over chunks of 16 rows), then turns it back on."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = model.device

    def __call__(self, *args, **kwargs):
        old = models.prefill_rows(self.model, 1 << 30)
        try:
            return self.model(*args, **kwargs)
        finally:
            models.prefill_rows(self.model, old)


def step_mode(device) -> str:
    """The name of the plain mode: a CUDA graph per step on a GPU, eager steps on a CPU."""
    return "graph" if device.type == "cuda" else "eager"


def make_decoders(args, engines, sequences, device, clock: Clock, run: dict) -> dict:
    """{(engine, mode, batch): Decoder}, prompts run and every step warmed (compiled ones
    compiled), none captured yet. An engine whose steps fail is dropped (``run["failures"]``
    says why); compiling stops where the budget would be passed, B = 1 and 16 first."""
    import torch

    length = args.decode_prompt + args.decode_tokens + 2
    decoders = {}
    for engine in engines:
        try:
            for batch in args.batches:
                decoder = decode.Decoder(engine.model, batch, length)
                decoder.prefill(sequences[batch][:, :args.decode_prompt])
                decoder.warm()
                decoders[(engine.name, step_mode(device), batch)] = decoder
        except Exception as error:  # noqa: BLE001 - reported; the other engines still run
            run["failures"][f"{engine.name} decode"] = one_line(error)
            clock.say(f"{engine.name} decode failed: {one_line(error)}")
            decoders = {k: v for k, v in decoders.items() if k[0] != engine.name}
    clock.say(f"{len(decoders)} decoders warmed")
    compiled = run.setdefault("compile", {})
    measured = []  # seconds of each compile
    guess = 10 + 2.5 * engines[0].model.config.num_hidden_layers if engines else 0.0
    # B = 1 compiles with static shapes; the next batch recompiles with the batch dimension
    # dynamic (torch's automatic dynamic shapes), which then serves every other batch: two
    # compiles per engine, the B = 1 and 16 first.
    order = sorted(args.batches, key=lambda b: (b not in (1, 16), b))
    for engine in engines:
        if not any(engine.name.startswith(name) for name in args.compile):
            continue
        forward = torch.compile(engine.model, backend=args.compile_backend, fullgraph=True)
        for batch in order:
            label = f"{engine.name} B={batch}"
            if not clock.fits(max(measured, default=guess) + 30):  # 30 s: timing after
                compiled[label] = {"skipped": "over --budget-s"}
                clock.say(f"compile {label}: skipped (over --budget-s)")
                continue
            started = time.monotonic()
            try:
                decoder = decode.Decoder(engine.model, batch, length, forward=forward)
                decoder.prefill(sequences[batch][:, :args.decode_prompt])
                decoder.warm()
            except Exception as error:  # noqa: BLE001 - a model that does not compile
                compiled[label] = {"failed": one_line(error)}
                clock.say(f"compile {label}: failed: {one_line(error)}")
                break
            seconds = time.monotonic() - started
            measured.append(seconds)
            compiled[label] = {"seconds": seconds}
            decoders[(engine.name, "compiled", batch)] = decoder
            clock.say(f"compiled {label} in {seconds:.0f} s")
    return decoders


def one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:240] if text else ''}"


def summary(run: dict) -> dict:
    """Ratios: qcompile's best mode over each peer's best mode (and over transformers' graph
    and compiled modes apart), per batch; prefill's; at 4 bits, the issue's targets."""
    best: dict[tuple[str, int], float] = {}
    by_mode: dict[tuple[str, str, int], float] = {}
    for row in run["decode"]:
        key = (row["engine"], row["batch"])
        best[key] = max(best.get(key, 0.0), row["tokens_per_s"])
        by_mode[(row["engine"], row["mode"], row["batch"])] = row["tokens_per_s"]
    out: dict[str, object] = {}
    batches = sorted({b for _, b in best})
    peers = sorted({name for name, _ in best if name != "qcompile"})
    for batch in batches:
        ours = best.get(("qcompile", batch))
        if ours is None:
            continue
        for peer in peers:
            if (peer, batch) in best:
                out[f"B={batch} qcompile / {peer} (best modes)"] = ours / best[(peer, batch)]
            for mode in ("graph", "eager", "compiled"):
                if (peer, mode, batch) in by_mode and peer.startswith("transformers"):
                    out[f"B={batch} qcompile / {peer} {mode}"] = ours / by_mode[(peer, mode,
                                                                                 batch)]
    prefill = {row["engine"]: row["tokens_per_s"] for row in run["prefill"]}
    for label in (p for p in prefill if p.startswith("qcompile")):
        for peer in (p for p in prefill if not p.startswith("qcompile")):
            out[f"prefill {label} / {peer}"] = prefill[label] / prefill[peer]
    if run["bits"] != 4:  # the targets are 4-bit's
        return out
    dense = next((p for p in peers if p.startswith("transformers")), None)
    targets = {}

    def judge(name: str, peer: str, batch: int, ratio: float) -> None:
        # a peer's best mode is only its best if every mode asked of it ran
        label = f"{peer} B={batch}"
        compiled = run.get("compile", {}).get(label)
        if ("qcompile", batch) not in best or (peer, batch) not in best:
            return
        if compiled is not None and "seconds" not in compiled:
            targets[name] = f"not judged: {label} compiled did not run"
        else:
            targets[name] = best[("qcompile", batch)] / best[(peer, batch)] >= ratio

    if dense:
        judge(f"B=1 >= 2.5x {dense}", dense, 1, 2.5)
    judge("B=1 >= humming", "humming", 1, 1.0)
    if dense:
        judge(f"B=16 >= 2x {dense}", dense, 16, 2.0)
    out["targets (issue 25)"] = targets
    return out


def print_table(run: dict, args) -> None:
    batches = sorted({row["batch"] for row in run["decode"]})
    print(f"\n{run['bits']}-bit g{args.group_size} {run['model']} ({run['layers']} layers): "
          f"decode tokens/s after a {args.decode_prompt}-token prompt, "
          f"{args.decode_tokens} steps, median of {args.rounds} rounds")
    header = "".join(f"{'B=' + str(b):>12s}" for b in batches)
    print(f"  {'engine':38s}{header}")
    rows: dict[tuple[str, str], dict[int, dict]] = {}
    for row in run["decode"]:
        rows.setdefault((row["engine"], row["mode"]), {})[row["batch"]] = row
    for (engine, mode), by_batch in rows.items():
        cells = "".join(f"{by_batch[b]['tokens_per_s']:12.1f}" if b in by_batch else
                        f"{'-':>12s}" for b in batches)
        failed = any(r["method"].startswith("eager (") for r in by_batch.values())
        label = f"{engine} {mode}" + (" (capture failed: eager)" if failed else "")
        print(f"  {label:38s}{cells}")
    print(f"prefill of {args.prompt} tokens, tokens/s:")
    for row in run["prefill"]:
        print(f"  {row['engine']:38s}{row['tokens_per_s']:12.1f}   ({row['ms']:.2f} ms)")
    for label, value in run["summary"].items():
        if isinstance(value, dict) and value:
            print(f"  {label}: " + ", ".join(
                f"{k}: {v if isinstance(v, str) else 'yes' if v else 'NO'}"
                for k, v in value.items()))
        elif not isinstance(value, dict):
            print(f"  {label}: {value:.2f}x")
    for batch, profile in run.get("profiles", {}).items():
        if "categories" not in profile:
            print(f"  profile {batch}: {profile}")
            continue
        parts = ", ".join(f"{label} {c['share'] * 100:.0f}%"
                          for label, c in profile["categories"].items() if c["share"] >= 0.005)
        print(f"  qcompile decode step {batch} ({profile['step_us']:.0f} us, "
              f"{profile['method']}): {parts}")
    print(flush=True)
