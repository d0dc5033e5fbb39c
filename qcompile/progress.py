"""What ``qcompile tune`` shows while it works: one tqdm bar on stderr, from the first second.

A tuning run is silent for long stretches unless told otherwise: TVM takes seconds to import,
MetaSchedule searches before each batch, builds the batch in worker processes that each import
TVM again, then times the candidates one by one. The bar names the phase it is in (``starting
TVM``, ``searching``, ``building 8 candidates``, ``measuring 3/8``), counts measured candidates,
and shows the best latency and the failures so far; its clock starts when the command did, so
start-up counts. The summary that follows prints once, after the bar is closed.

Light: imports tqdm only (the CLI shows the bar before TVM loads).
"""

from __future__ import annotations

import sys
import threading
import time

from tqdm import tqdm

#: How often the bar is redrawn while nothing happens (its clock keeps moving), seconds.
REFRESH_S = 1.0


class TuneProgress:
    """The progress of one tuning run.

    Parameters
    ----------
    total : int
        Candidates to measure (the trials).
    label : str
        What is tuned, for where (``uniform_b4_... @avx2``).
    started : float, optional
        ``time.monotonic()`` when the run began (the CLI's start, before TVM loaded); default
        now.
    stream : file, optional
        Default stderr.
    enabled : bool
        False: nothing is drawn, the counts are still kept.
    phase : str
        What the run does first.
    """

    def __init__(self, total: int, label: str, *, started: float | None = None, stream=None,
                 enabled: bool = True, phase: str = "starting") -> None:
        self.started = time.monotonic() if started is None else started
        self.total = max(1, total)
        self.label = label
        self.measured = 0
        self.failed = 0
        self.best_us: float | None = None
        self.phase = phase
        self._lock = threading.Lock()
        self._closed = False
        stream = stream or sys.stderr
        self._bar = None
        if enabled:
            tty = getattr(stream, "isatty", lambda: False)()
            # delay: the first line is drawn below, once the clock and the phase are set.
            self._bar = tqdm(total=self.total, desc=label, unit="trial", file=stream,
                             dynamic_ncols=True, mininterval=0.5 if tty else 5.0, delay=1e-6,
                             bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} "
                                        "trials [{elapsed}{postfix}]")
            # Count from the run's start, not the bar's: start-up is part of the wait.
            self._bar.start_t = time.time() - (time.monotonic() - self.started)
            self._draw()
            self._stop = threading.Event()
            if tty:  # keep the clock moving through long silent phases
                threading.Thread(target=self._tick, daemon=True,
                                 name="qcompile-progress").start()

    def set_total(self, total: int) -> None:
        """The number of candidates to measure, once known (resumed runs measure fewer)."""
        with self._lock:
            self.total = max(1, total)
            if self._bar is not None:
                self._bar.total = self.total
                self._bar.refresh()

    def set_phase(self, phase: str) -> None:
        """Say what the run is doing now (``building 8 candidates``); drawn at once."""
        with self._lock:
            self.phase = phase
            self._draw()

    def candidate(self, mean_us: float | None) -> None:
        """One candidate measured: its latency in microseconds, or None when it failed."""
        with self._lock:
            self.measured += 1
            if mean_us is None:
                self.failed += 1
            else:
                self.best_us = mean_us if self.best_us is None else min(self.best_us, mean_us)
            if self._bar is not None and self._bar.n < self.total:
                self._bar.n += 1  # drawn once, with the new best, just below
            self._draw()

    def close(self, phase: str = "done") -> None:
        """Draw the final state once and end the bar's line (later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.phase = phase
            if self._bar is not None:
                self._stop.set()
                self._bar.set_postfix_str(self._postfix(), refresh=False)
                self._bar.close()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def _postfix(self) -> str:
        best = f"{self.best_us:.1f} us" if self.best_us is not None else "-"
        return f"best {best}, failed {self.failed}, {self.phase}"

    def _draw(self) -> None:
        if self._bar is not None and not self._closed:
            self._bar.set_postfix_str(self._postfix(), refresh=True)
            self._bar.last_print_t = time.time()  # drawn: close() draws the final state too

    def _tick(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                if self._closed or self._bar is None:
                    return
                self._bar.refresh()

    def __enter__(self) -> TuneProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close("stopped" if exc[0] is not None else "done")
