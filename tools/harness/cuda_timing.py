"""GPU timing: CUDA events around CUDA-graph replays of back-to-back calls.

These kernels run for microseconds, so launch gaps and Python overhead must stay out: each
implementation's calls are captured in a CUDA graph (about :data:`GRAPH_MS` of GPU time per
replay) and timed with CUDA events, replay by replay, in interleaved rounds. Its weights rotate
among enough copies to exceed the L2 cache three times (:func:`rotating`), so that weights come
from HBM as in a model. torch is imported by the caller (this module needs CUDA only when used).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

GRAPH_MS = 2.0


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """Copies of a weight set so that one pass over them reads at least three L2s."""
    return max(1, math.ceil(3 * l2_bytes / max(nbytes, 1)))


def l2_bytes() -> int:
    import torch

    return torch.cuda.get_device_properties(0).L2_cache_size


def rotating(tensors: tuple, nbytes: int) -> list[tuple]:
    """``tensors`` and clones of them, enough to exceed the L2 three times."""
    return [tensors] + [tuple(t.clone() for t in tensors)
                        for _ in range(copies_for(nbytes, l2_bytes()) - 1)]


def event_seconds(fn: Callable[[], object]) -> float:
    """GPU seconds of one call of ``fn``, between two CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


class GraphTimer:
    """One implementation: ``calls`` (one per weight copy) captured in a CUDA graph.

    ``bytes_read`` is what one call must read (for TB/s). Capture falls back to eager timing,
    recorded in ``method``, when an implementation cannot be captured.
    """

    def __init__(self, name: str, calls: list[Callable[[], object]], bytes_read: int) -> None:
        self.name = name
        self.calls = calls
        self.bytes_read = bytes_read
        self.graph = None
        self.per_graph = 0
        self.method = "cuda-graph"
        self.samples: list[float] = []

    def prepare(self) -> None:
        self.warm()
        self.capture()

    def warm(self) -> None:
        """Call everything twice (module loads, handles, autotuning, workspace pools)."""
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in self.calls * 2:
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def capture(self) -> None:
        """Estimate a call's time and capture enough calls for a sample in one CUDA graph."""
        import torch

        def all_calls():
            for call in self.calls:
                call()

        estimate_ms = max(event_seconds(all_calls) * 1e3 / len(self.calls), 1e-3)
        self.per_graph = max(len(self.calls), int(GRAPH_MS / estimate_ms))
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(self.per_graph):
                    self.calls[i % len(self.calls)]()
            self.graph = graph
        except Exception as error:  # noqa: BLE001 - record why, time eagerly instead
            self.method = f"eager (graph capture failed: {str(error).splitlines()[0][:120]})"
            torch.cuda.synchronize()

    def sample(self) -> None:
        def replay():
            if self.graph is not None:
                self.graph.replay()
            else:
                for i in range(self.per_graph):
                    self.calls[i % len(self.calls)]()

        self.samples.append(event_seconds(replay) * 1e6 / self.per_graph)

    def result(self) -> dict:
        us = statistics.median(self.samples)
        return {"median_us": us, "tbps": self.bytes_read / (us * 1e-6) / 1e12,
                "bytes_read": self.bytes_read, "calls_per_sample": self.per_graph,
                "samples": len(self.samples), "method": self.method}


def prepare_all(timers: list[GraphTimer]) -> None:
    """Warm every timer up, then capture each one's graph.

    TVM functions take their scratch buffers (partial sums over K slices) from a workspace pool
    that frees a buffer to allocate a larger one, so a graph captured before a later kernel's
    first, larger request would replay into freed memory. Once every kernel has run, the pool
    holds its largest buffer and every capture reuses it (the graphs replay one at a time)."""
    for timer in timers:
        timer.warm()
    for timer in timers:
        timer.capture()


def interleaved(timers: list[GraphTimer], rounds: int) -> dict[str, dict]:
    """Prepare every timer, sample them in ``rounds`` interleaved rounds: {name: result}."""
    prepare_all(timers)
    for _ in range(rounds):
        for timer in timers:
            timer.sample()
    return {timer.name: timer.result() for timer in timers}


def kernel_times(run: Callable[[], object], calls: int,
                 synchronize: Callable[[], object]) -> dict[str, float]:
    """{kernel name: GPU microseconds per call} of one ``run()`` that makes ``calls`` calls,
    waited for by ``synchronize()`` (torch.profiler; CUPTI reports each kernel of a CUDA-graph
    replay too; none where nothing ran on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        synchronize()
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            us = getattr(event, "self_device_time_total", None)
            if us is None:  # older torch
                us = getattr(event, "self_cuda_time_total", 0.0)
            kernels[event.key] = kernels.get(event.key, 0.0) + us / calls
    return kernels
