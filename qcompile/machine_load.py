"""How busy the machine is with work that is not ours, while we measure.

A latency measured while other processes compete for the cores (or for memory bandwidth, which
follows them) can be several times the quiet one; a record must say so. :class:`LoadMeter`
counts the CPU time the whole machine spent busy, including time the hypervisor gave to other
guests (``steal``), minus the CPU time of this process and all its descendants (the builders
and the runner), between two laps: the result is how many cores others kept busy on average.

What it cannot see: other tenants of a shared host that take memory bandwidth without taking
this guest's CPU time. A benchmark that needs quiet numbers still measures the read bandwidth
in the same run.
"""

from __future__ import annotations

import time

import psutil

#: Others keeping at least this share of the cores busy make a measurement "busy".
BUSY_SHARE = 0.25


def _own_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and every live descendant."""
    me = psutil.Process()
    total = 0.0
    processes = [me]
    try:
        processes += me.children(recursive=True)
    except psutil.Error:
        pass
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


class LoadMeter:
    """Cores kept busy by others since the last :meth:`lap`.

    >>> meter = LoadMeter()        # doctest: +SKIP
    >>> ...                        # measure something
    >>> meter.lap()                # doctest: +SKIP
    0.03
    """

    def __init__(self) -> None:
        self.cores = psutil.cpu_count() or 1
        self._mark = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        return time.monotonic(), _machine_busy_seconds(), _own_cpu_seconds()

    def lap(self) -> float:
        """Average cores others kept busy since the previous lap (or since creation)."""
        now = self._read()
        wall = now[0] - self._mark[0]
        others = (now[1] - self._mark[1]) - (now[2] - self._mark[2])
        self._mark = now
        if wall <= 0:
            return 0.0
        return max(0.0, min(float(self.cores), others / wall))

    def busy(self, load: float | None) -> bool:
        """Whether ``load`` (cores) counts as a busy machine (:data:`BUSY_SHARE`)."""
        return load is not None and load >= BUSY_SHARE * self.cores

    def wait_for_quiet(self, timeout_s: float, interval_s: float = 1.0) -> float:
        """Sleep in ``interval_s`` steps until others use less than the busy share, at most
        ``timeout_s``; returns the last load seen."""
        self.lap()
        deadline = time.monotonic() + timeout_s
        load = 0.0
        while True:
            time.sleep(interval_s)
            load = self.lap()
            if not self.busy(load) or time.monotonic() >= deadline:
                return load
