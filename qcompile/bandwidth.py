"""The machine's streaming-read bandwidth: the denominator of "fraction of bandwidth".

A GEMV kernel at the memory limit reads its weights once, sequentially, with vector loads on
every core. The reference is the same access pattern with no arithmetic to speak of: a sum over a
float32 buffer far larger than the last-level cache, split into contiguous chunks, one parallel
task per chunk, each summed with eight independent 8-lane (AVX2) accumulators, compiled by TVM
for the same target as the kernels and run on the same thread pool. ``torch.sum`` over the same
buffer is a second opinion; :func:`measure` reports both and takes the larger as the bandwidth
(the stricter denominator).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

#: Floats per accumulator row: eight 8-lane vectors.
_ROW = 64


@dataclass(frozen=True)
class Bandwidth:
    """Streaming-read bandwidth, GB/s (1e9 bytes per second); medians over ``repeats``."""

    gbps: float
    tvm_gbps: float
    torch_gbps: float
    buffer_mib: int
    threads: int
    repeats: int
    method: str

    def to_dict(self) -> dict:
        return asdict(self)


def _read_kernel(tasks: int, rows: int, target):
    """TVM function summing a float32 [tasks, rows, 64] buffer into [tasks, 64]."""
    from qcompile import _tvm

    T = _tvm.T

    @T.prim_func(s_tir=True)
    def read_sum(a: T.Buffer((tasks, rows, _ROW), "float32"),
                 out: T.Buffer((tasks, _ROW), "float32")):
        T.func_attr({"global_symbol": "read_sum", "tirx.noalias": True})
        for t, r, j in T.grid(tasks, rows, _ROW):
            with T.sblock("sum"):
                vt, vr, vj = T.axis.remap("SRS", [t, r, j])
                with T.init():
                    out[vt, vj] = T.float32(0)
                out[vt, vj] = out[vt, vj] + a[vt, vr, vj]

    sch = _tvm.Schedule(read_sum)
    block = sch.get_sblock("sum")
    t, r, j = sch.get_loops(block)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, t)
    j_reg, j_lane = sch.split(j, factors=[None, 8])
    sch.parallel(t)
    sch.unroll(j_reg)
    sch.vectorize(j_lane)
    sch.decompose_reduction(block, r)
    return _tvm.tvm.compile(sch.mod, target=target)["read_sum"]


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm: page faults, thread pools
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class ReadProbe:
    """The read loop as a reusable call, for timing it interleaved with kernels: ``probe()``
    reads the whole buffer once; ``probe.nbytes`` bytes.

    Parameters
    ----------
    target : tvm Target
    tasks : int
        Parallel chunks (one per thread).
    buffer_mib : int
        At least 512.
    """

    def __init__(self, target, tasks: int, buffer_mib: int = 1024) -> None:
        import torch

        if buffer_mib < 512:
            raise ValueError(f"the bandwidth buffer must be at least 512 MiB; got {buffer_mib}")
        rows = buffer_mib * (1 << 20) // 4 // _ROW // tasks
        self.buffer = torch.ones((tasks, rows, _ROW), dtype=torch.float32)
        self.out = torch.empty((tasks, _ROW), dtype=torch.float32)
        self.nbytes = self.buffer.numel() * 4
        self._kernel = _read_kernel(tasks, rows, target)
        self()
        if abs(float(self.out[0, 0]) - rows) > 1e-3 * rows:  # the loop really read the buffer
            raise RuntimeError(f"bandwidth kernel summed {float(self.out[0, 0])}, expected {rows}")

    def __call__(self) -> None:
        self._kernel(self.buffer, self.out)


def measure(target, threads: int, buffer_mib: int = 1024, repeats: int = 9) -> Bandwidth:
    """Measure the streaming-read bandwidth with ``threads`` threads.

    Parameters
    ----------
    target : tvm Target
        The kernels' target (``llvm -mcpu=...``), so the read loop uses the same vector ISA.
    threads : int
        Threads for TVM's pool and for torch (set by the caller, see ``set_threads``).
    buffer_mib : int
        Buffer size; at least 512 MiB so that no cache holds a meaningful part of it.
    repeats : int
        Timed passes; the median counts.
    """
    import torch

    if buffer_mib < 512:
        raise ValueError(f"the bandwidth buffer must be at least 512 MiB; got {buffer_mib}")
    tasks = max(1, threads)
    rows = buffer_mib * (1 << 20) // 4 // _ROW // tasks
    a = torch.ones((tasks, rows, _ROW), dtype=torch.float32)
    out = torch.empty((tasks, _ROW), dtype=torch.float32)
    nbytes = a.numel() * 4
    kernel = _read_kernel(tasks, rows, target)
    tvm_s = _median_seconds(lambda: kernel(a, out), repeats)
    expected = float(rows)
    if abs(float(out[0, 0]) - expected) > 1e-3 * expected:  # the loop really read the buffer
        raise RuntimeError(f"bandwidth kernel summed {float(out[0, 0])}, expected {expected}")
    torch_s = _median_seconds(lambda: a.sum(), repeats)
    tvm_gbps, torch_gbps = nbytes / tvm_s / 1e9, nbytes / torch_s / 1e9
    return Bandwidth(
        gbps=max(tvm_gbps, torch_gbps), tvm_gbps=tvm_gbps, torch_gbps=torch_gbps,
        buffer_mib=nbytes >> 20, threads=threads, repeats=repeats,
        method=(f"median of {repeats} sums over a {nbytes >> 20} MiB float32 buffer (much larger "
                f"than L3), {tasks} contiguous chunk(s) in parallel on {threads} thread(s): a TVM "
                "loop with 8 vector accumulators for the kernels' target, and torch.sum; the "
                "larger rate counts"),
    )


def set_threads(threads: int) -> None:
    """Use ``threads`` threads in TVM's runtime pool and in torch."""
    import torch

    from qcompile import _tvm

    torch.set_num_threads(threads)
    _tvm.tvm.get_global_func("runtime.config_threadpool")(1, threads)
