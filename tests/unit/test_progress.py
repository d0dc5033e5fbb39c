"""The tuning progress bar (qcompile.progress): drawn at once, one line that ends once, counting
from the run's start; no TVM."""

from __future__ import annotations

import io
import time

import pytest

from qcompile.progress import TuneProgress


class Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_phases_candidates_and_one_final_line(tty):
    stream = Terminal(tty)
    progress = TuneProgress(4, "uniform_x @avx2", stream=stream, phase="starting TVM",
                            started=time.monotonic() - 75)
    assert "starting TVM" in stream.getvalue() and "[01:15" in stream.getvalue()  # at once
    progress.set_phase("measuring 1/4")
    progress.candidate(12.5)
    assert "1/4 trials" in stream.getvalue() and "best 12.5 us" in stream.getvalue()
    progress.candidate(None)
    progress.candidate(9.0)
    progress.close()
    progress.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    final = text.rstrip("\n").split("\r")[-1].rstrip()
    assert final.endswith("best 9.0 us, failed 1, done]") and "3/4 trials" in final
    assert (progress.measured, progress.failed, progress.best_us) == (3, 1, 9.0)
    assert progress.elapsed_s() >= 75


def test_a_failure_ends_the_line_and_disabled_draws_nothing():
    stream = Terminal(False)
    with pytest.raises(RuntimeError), TuneProgress(2, "x", stream=stream):
        raise RuntimeError("boom")
    assert stream.getvalue().endswith("\n") and stream.getvalue().rstrip().endswith("stopped]")
    quiet = Terminal(True)
    with TuneProgress(2, "x", stream=quiet, enabled=False) as progress:
        progress.set_phase("building 2 candidates")
        progress.candidate(1.0)
    assert quiet.getvalue() == "" and progress.measured == 1
