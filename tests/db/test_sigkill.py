"""A tuner killed with SIGKILL mid-run: the database opens, passes its integrity check, keeps
every record committed before the kill, and a rerun resumes from them."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuning_db import Storage

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 20
TUNE = ["tune", "--target", "avx2", "--shape", "128x64", "--group-size", "32", "--quiet"]


def _qcompile(args, env, **kwargs):
    return subprocess.run([sys.executable, "-m", "qcompile.cli", *args], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=600, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite-file", "postgresql"])
def test_sigkill_mid_run_keeps_committed_records_and_resumes(backend, tmp_path, avx2, request):
    if backend == "postgresql":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 'tuning.sqlite'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    watcher = Storage(url)  # the schema exists before the tuner starts: we can poll
    tuner = subprocess.Popen([sys.executable, "-m", "qcompile.cli", *TUNE, "--trials",
                              str(TRIALS), "--db", url], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    deadline = time.time() + 500
    while not seen:
        assert tuner.poll() is None, "the tuner ended before committing anything: " + \
            tuner.communicate()[1][-2000:]
        assert time.time() < deadline, "no record committed in 500 s"
        seen = {r.digest for r in watcher.records()}
        time.sleep(0.02)
    tuner.send_signal(signal.SIGKILL)  # mid-run: while it commits the first batch, or after
    tuner.communicate(timeout=60)
    assert tuner.returncode == -signal.SIGKILL, "the tuner had finished before the kill"
    watcher.close()

    check = _qcompile(["db", "check", "--db", url], env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok (schema" in check.stdout
    after_kill = Storage(url)
    assert after_kill.integrity_problems() == []
    kept = {r.digest for r in after_kill.records()}
    assert seen <= kept, "a record committed before the kill is gone"
    measured = len(kept)
    assert 1 <= measured < TRIALS

    rerun = _qcompile([*TUNE, "--trials", str(TRIALS), "--db", url], env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    remaining = TRIALS - measured
    assert re.search(rf": {remaining} trials in \d+ s \(\d+ failed, after {measured} records "
                     "already there\\)", rerun.stdout), rerun.stdout
    stored = int(re.search(r"stored\s+(\d+) records", rerun.stdout).group(1))
    final = {r.digest for r in after_kill.records()}
    assert kept <= final and len(final) == measured + stored

    # A run whose budget the records now cover tunes nothing. (MetaSchedule may measure a
    # candidate the database already had: that trial stores nothing, and the budget is short.)
    again = _qcompile([*TUNE, "--trials", str(len(final)), "--db", url], env)
    assert f"0 trials, reused {len(final)} records" in again.stdout, again.stdout
