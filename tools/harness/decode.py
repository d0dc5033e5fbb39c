"""Timing a whole causal LM: decode steps over a static KV cache, prefill, and where a decode
step's GPU time goes.

A :class:`Decoder` holds B sequences of one model in a transformers ``StaticCache``. After the
prompt (``prefill``, eager), one decode *step* is a forward pass of B new tokens whose greedy
next tokens are written back as the next step's input, all on the device: on a GPU the step is
captured once as a CUDA graph and each token is one replay (what serving engines and
``torch.compile(mode="reduce-overhead")`` do), so Python's cost per layer stays out; the
cache's position is a device tensor that each replay advances. On a CPU, steps run eagerly.

The TVM functions behind qcompile's kernels take scratch memory from a workspace pool that
frees a buffer to grow it (``cuda_timing.prepare_all``): every decoder of a model must have run
(:meth:`Decoder.warm`) before any of them is captured, and nothing new may run after.
torch is imported by the caller.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from tools.harness import cuda_timing


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Decoder:
    """B sequences of ``model`` over a static KV cache, decoded greedily one step per call.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM on its device (``model.device``).
    batch : int
        Sequences B.
    max_length : int
        The cache's length: prompt plus decode steps.
    forward : callable, optional
        What a step calls in place of ``model`` (``torch.compile(model)``); the prompt always
        runs ``model``.
    """

    def __init__(self, model, batch: int, max_length: int, forward: Callable | None = None):
        import torch
        import transformers

        self.model = model
        self.forward = model if forward is None else forward
        self.device = model.device
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=max_length)
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=self.device)
        self.first = self.ids.clone()
        self.position = 0
        self.logits = None  # [B, vocabulary] of the last step (a graph's output buffer)
        self.graph = None
        self.method = "eager"

    def prefill(self, prompt) -> None:
        """Run the prompt (int64 [B, P]) into the cache; its greedy token is the first input."""
        import torch

        with torch.no_grad():
            out = self.model(prompt.to(self.device), cache=self.cache, use_cache=True)
        self.position = prompt.shape[1]
        self.first.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        self.ids.copy_(self.first)

    def eager_step(self):
        """One step without the graph: returns the logits [B, vocabulary]."""
        import torch

        with torch.no_grad():
            logits = self.forward(self.ids, cache=self.cache, use_cache=True).logits[:, -1]
            self.ids.copy_(logits.argmax(-1, keepdim=True))
        return logits

    def rewind(self, ids=None) -> None:
        """Back to the end of the prompt, with ``ids`` (int64 [B, 1]; default the prompt's
        greedy token) as the next input. Each cache layer's length is a device tensor that a
        step advances in place (transformers' StaticLayer), so it is set back in place too."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.position)
        self.ids.copy_(self.first if ids is None else ids)

    def warm(self, steps: int = 2) -> None:
        """Run ``steps`` steps (compiling a compiled forward, loading kernels, growing
        workspaces), on a side stream on a GPU as CUDA-graph capture wants, then rewind."""
        import torch

        if self.device.type == "cuda":
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(steps):
                    self.logits = self.eager_step()
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            for _ in range(steps):
                self.logits = self.eager_step()
        synchronize(self.device)
        self.rewind()

    def capture(self) -> None:
        """Capture one step as a CUDA graph (GPU only); a step that cannot be captured stays
        eager, and :attr:`method` says why."""
        import torch

        if self.device.type != "cuda":
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.logits = self.eager_step()
        except Exception as error:  # noqa: BLE001 - recorded, timed eagerly instead
            self.method = f"eager (graph capture failed: {str(error).splitlines()[0][:160]})"
            torch.cuda.synchronize(self.device)
        else:
            self.graph = graph
            self.method = "cuda-graph"
        self.rewind()

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits = self.eager_step()

    def seconds_per_step(self, steps: int) -> float:
        """Wall time of ``steps`` back-to-back steps from the end of the prompt, per step
        (CUDA events on a GPU)."""
        import torch

        self.rewind()
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                self.step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / steps
        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - started) / steps


def prefill_seconds(model, prompt, rounds: int) -> list[float]:
    """Seconds of a prompt's forward pass (int64 [1, L], no cache, the last position's logits
    as ``generate`` computes them), eager, once untimed and then ``rounds`` times."""
    import torch

    prompt = prompt.to(model.device)

    def run():
        with torch.no_grad():
            model(prompt, use_cache=False, logits_to_keep=1)

    run()
    synchronize(model.device)
    samples = []
    for _ in range(rounds):
        if model.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        else:
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
    return samples


#: Kernel categories of a decode step's profile, by a piece of the kernel's name (first match
#: wins; lower case). qcompile's kernels carry their spec's name (``uniform_b4_g128_...``).
CATEGORIES = (
    ("qcompile kernels", ("uniform_b", "bcq_", "mixed_")),
    ("humming kernels", ("humming", "marlin")),
    ("attention", ("attention", "fmha", "flash", "sdpa", "softmax")),
    ("dense GEMM/GEMV (cuBLAS)", ("gemm", "gemv", "cutlass", "xmma", "cublas", "splitk")),
    ("inductor's fused kernels", ("triton_",)),
    ("copies, padding, cache writes", ("copy", "cat", "fill", "index", "zero", "memset",
                                        "memcpy")),
    ("elementwise, norms, rotary", ("elementwise", "reduce", "norm", "pow", "mean", "rsqrt",
                                    "silu", "mul", "add", "neg", "argmax", "max")),
)


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for label, pieces in CATEGORIES:
        if any(piece in name for piece in pieces):
            return label
    return "other kernels"


def step_profile(decoder: Decoder, steps: int, seconds_per_step: float) -> dict:
    """Where a decode step's time goes: GPU time per step by kernel category
    (:data:`CATEGORIES`), from torch.profiler over ``steps`` steps as the benchmark runs them
    (graph replays: CUPTI reports each kernel of a graph), against the measured step time;
    what no kernel covers is launch gaps and idle GPU time.

    Returns
    -------
    dict
        ``step_us``; ``categories``: {label: {"us": per step, "share": of the step}}, with
        "between kernels (launch gaps, idle)"; ``top_kernels``: the 12 longest kernels per
        step; ``method`` (what was profiled).
    """
    method = f"{decoder.method} steps"
    kernels = _kernel_times(decoder, decoder.step, steps)
    if not kernels and decoder.graph is not None:  # a profiler that sees no graph kernels
        kernels = _kernel_times(decoder, decoder.eager_step, steps)
        method = "eager steps (no kernels reported inside graph replays)"
    step_us = seconds_per_step * 1e6
    totals: dict[str, float] = {}
    for name, us in kernels.items():
        totals[category(name)] = totals.get(category(name), 0.0) + us
    totals["between kernels (launch gaps, idle)"] = max(step_us - sum(kernels.values()), 0.0)
    top = sorted(kernels.items(), key=lambda item: -item[1])[:12]
    return {"step_us": step_us, "method": method, "kernels_seen": len(kernels),
            "categories": {label: {"us": us, "share": us / step_us}
                           for label, us in sorted(totals.items(), key=lambda i: -i[1])},
            "top_kernels": [{"name": name[:160], "us": us, "category": category(name)}
                            for name, us in top]}


def _kernel_times(decoder: Decoder, step: Callable[[], object], steps: int) -> dict:
    """{kernel name: GPU microseconds per step} of ``steps`` calls of ``step`` from the end
    of the prompt (:func:`cuda_timing.kernel_times`)."""
    def run():
        for _ in range(steps):
            step()

    decoder.rewind()
    kernels = cuda_timing.kernel_times(run, steps, lambda: synchronize(decoder.device))
    decoder.rewind()
    return kernels


def median(values) -> float:
    return statistics.median(values)
