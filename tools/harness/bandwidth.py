"""The machine's memory bandwidth: the denominator of "fraction of bandwidth".

CPU read bandwidth is qcompile's own probe (``qcompile.bandwidth``: a large float32 buffer read
with vector loads by every thread, a TVM loop and torch.sum, the larger counts); its
:func:`read_probe` is a callable that joins a benchmark's interleaved rounds, so each row's
denominator is measured under the same load as its kernels. Copy bandwidth (read + write) is a
torch copy, on the CPU or the GPU.
"""

from __future__ import annotations

import statistics
import time


def cpu_read(target, threads: int, buffer_mib: int = 1024) -> dict:
    """Streaming-read bandwidth with ``threads`` threads: ``Bandwidth.to_dict()`` (GB/s)."""
    from qcompile import bandwidth

    bandwidth.set_threads(threads)
    return bandwidth.measure(target, threads, buffer_mib).to_dict()


def read_probe(target, threads: int, buffer_mib: int = 1024):
    """A zero-argument read of a ``buffer_mib`` buffer; ``.nbytes`` bytes per call."""
    from qcompile import bandwidth

    return bandwidth.ReadProbe(target, threads, buffer_mib)


def set_threads(threads: int) -> None:
    """torch's and TVM's thread counts."""
    from qcompile import bandwidth

    bandwidth.set_threads(threads)


def cpu_copy(threads: int, nbytes: int = 512 << 20, repeats: int = 5) -> dict:
    """A torch copy of ``nbytes`` with ``threads`` threads: median GB/s of read + write."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"bytes": nbytes, "median_us": seconds * 1e6, "gbps": 2 * nbytes / seconds / 1e9}


def cuda_copy(nbytes: int = 2 << 30, repeats: int = 20) -> dict:
    """Device-to-device copy of ``nbytes``: median TB/s counting bytes read plus written."""
    import torch

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds = statistics.median(_copy_times(src, dst, repeats))
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "median_us": seconds * 1e6, "tbps": 2 * nbytes / seconds / 1e12}


def _copy_times(src, dst, repeats: int) -> list[float]:
    from tools.harness.cuda_timing import event_seconds

    return [event_seconds(lambda: dst.copy_(src)) for _ in range(repeats)]
