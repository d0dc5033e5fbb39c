"""Records say how busy the machine was; a tune on a busy machine warns and measures its best
again when the machine is quieter, and stores those measurements."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from qcompile.kernels import UniformSpec
from qcompile.machine_load import BUSY_SHARE, LoadMeter, _own_cpu_seconds
from qcompile.tune import tune
from tuning_db import Storage


@contextmanager
def others_burning(cores: int, seconds: float, tmp_path):
    """``cores`` busy loops that are not our descendants (started through a shell that exits,
    so they belong to init), stopped on exit."""
    pids = []
    script = tmp_path / "burn.py"
    script.write_text(f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: "
                      "pass\n")
    for index in range(cores):
        pid_file = tmp_path / f"burner{index}.pid"
        subprocess.run(["sh", "-c", f"{sys.executable} {script} >/dev/null 2>&1 & "
                                    f"echo $! > {pid_file}"], check=True)
        pids.append(int(pid_file.read_text()))
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_meter_counts_others_and_not_us(tmp_path):
    meter = LoadMeter()
    with others_burning(1, 5, tmp_path):
        time.sleep(2)
        assert meter.lap() >= 0.6
    # Our own descendants' work is ours, not someone else's: their CPU time is subtracted.
    before = _own_cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nend = time.time() + 2\n"
                    "while time.time() < end: pass"], check=True)
    assert _own_cpu_seconds() - before >= 1.5


@pytest.mark.slow
def test_a_busy_tune_warns_and_remeasures_its_best(tmp_path, avx2):
    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    spec = UniformSpec(k=256, n=256)
    # Twice the busy share of the cores (one of two): burning every core only made the tune
    # itself slower. 4 trials: still more than the 3 best it re-measures.
    burners = max(1, round(2 * BUSY_SHARE * LoadMeter().cores))
    with others_burning(burners, 600, tmp_path):
        summary = tune(spec, avx2, trials=4, storage=storage, progress=False, quiet_wait_s=2)
    assert summary.busy > 0 and summary.max_other_load >= 0.5
    text = "\n".join(summary.lines())
    assert "warning" in text and "re-measured the" in text, text
    loads = [r.other_load for r in storage.records()]
    assert all(load is not None for load in loads) and max(loads) >= 0.5
    remeasured = [m for ms in storage.measurements([r.id for r in storage.records()]).values()
                  for m in ms]
    assert 1 <= len(remeasured) <= 3 and {m.purpose for m in remeasured} == {"remeasure"}
    assert summary.record_id in {m.record_id for m in remeasured}
