"""Wall-clock timing on the CPU.

Every CPU benchmark times the same way: a block of back-to-back calls (long enough that the
clock's resolution and Python's call overhead vanish) after a few untimed warm-up calls, and
several implementations in interleaved rounds (one block of each per round), so that machine
noise -- this machine is shared, its load moves within minutes -- hits all of them alike. Each
block starts with warm-up calls because switching kernels leaves the other one's data in the
caches, torch's OpenMP threads spinning after their parallel region, and (on a VM) an idle vCPU
that takes time to come back. Results are medians over rounds, and ratios are taken within each
round (:func:`paired_ratio`), which is robust to load that drifts between rounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

WARMUP_CALLS = 3
BLOCK_SECONDS = 0.03
#: Bytes of weight copies a cold call rotates through, at least: past the EPYC's 32 MB L3
#: six times over (a host with a larger L3 rotates through three times its size).
COLD_BYTES = 200e6


def time_calls(fn: Callable[[], object], calls: int, warmup: int = WARMUP_CALLS) -> float:
    """Seconds per call of ``fn`` over ``calls`` back-to-back calls after ``warmup`` untimed
    ones."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def calls_per_block(fn: Callable[[], object], block_s: float = BLOCK_SECONDS) -> int:
    """How many calls of ``fn`` fill about ``block_s`` seconds (at least 3)."""
    return max(3, int(block_s / max(time_calls(fn, 3), 1e-7)))


def interleaved(runners: dict[str, Callable[[], object]], rounds: int,
                block_s: float = BLOCK_SECONDS,
                warmup: int = WARMUP_CALLS) -> dict[str, list[float]]:
    """Seconds per call of each runner in each of ``rounds`` rounds of interleaved blocks of
    about ``block_s``: ``{name: [per-round seconds]}``."""
    calls = {name: calls_per_block(fn, block_s) for name, fn in runners.items()}
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            samples[name].append(time_calls(fn, calls[name], warmup=warmup))
    return samples


def median(values) -> float:
    return statistics.median(values)


def paired_ratio(samples: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s time over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(samples[name], samples[base], strict=True))


def rotating(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One call that runs ``calls`` in turn, each on its own copy of the weights: with enough
    copies (:func:`copies_for`) every call reads its weights from DRAM, as a model's layers
    do, where calling one copy again and again times them from the cache."""
    turn = iter(range(1 << 62))

    def call():
        return calls[next(turn) % len(calls)]()

    return call


def copies_for(nbytes: int) -> int:
    """How many copies of ``nbytes`` of weights :func:`rotating` needs to read from DRAM:
    ``COLD_BYTES`` or three times this host's L3, whichever is more."""
    from targets.host import detected_cache_bytes

    return max(2, int(max(COLD_BYTES, 3 * (detected_cache_bytes(3) or 0)) // nbytes))
