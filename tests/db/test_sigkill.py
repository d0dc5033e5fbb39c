"""A tuner killed with SIGKILL mid-run: the database opens, passes its integrity check, keeps
every record committed before the kill, no builder or runner process outlives it, and a rerun
resumes from the records (commits come every batch of a few candidates, so a kill loses at
most one batch).

Two tuners run side by side, one into a SQLite file, one into PostgreSQL (a tuning process
spends most of its first half minute importing TVM: running both at once halves the cost).
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qcompile.tune import BATCH
from tuning_db import Storage

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 12  # one batch of 8 committed before the kill, a few more after the rerun
TUNE = ["tune", "--target", "avx2", "--shape", "128x64", "--group-size", "32", "--quiet"]


def _start(args, env):
    return subprocess.Popen([sys.executable, "-m", "qcompile.cli", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _left_behind(cache: str, wait_s: float = 10.0) -> list[str]:
    """Processes started for our tuners (they carry our cache directory) still alive after
    ``wait_s``."""
    import psutil

    deadline = time.time() + wait_s
    while True:
        alive = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if process.environ().get("XDG_CACHE_HOME") == cache:
                    alive.append(" ".join(process.info["cmdline"] or [])[:120])
            except psutil.Error:
                continue
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def _finish(proc):
    stdout, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stdout + stderr
    return stdout


@pytest.mark.slow
def test_sigkill_mid_run_keeps_committed_records_and_resumes(postgres_url, tmp_path, avx2):
    urls = {"sqlite-file": f"sqlite:///{tmp_path / 'tuning.sqlite'}", "postgresql": postgres_url}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    watchers = {name: Storage(url) for name, url in urls.items()}  # schemas exist: we can poll
    tuners = {name: _start([*TUNE, "--trials", str(TRIALS), "--db", url], env)
              for name, url in urls.items()}
    seen: dict[str, set[str]] = {}
    deadline = time.time() + 1200
    while len(seen) < len(tuners):
        for name, tuner in tuners.items():
            if name in seen:
                continue
            assert tuner.poll() is None, f"{name}: the tuner ended before committing anything: " \
                + tuner.communicate()[1][-2000:]
            digests = {r.digest for r in watchers[name].records()}
            if digests:
                assert len(digests) <= BATCH, f"{name}: more than one batch in one commit"
                # Mid-run: while it commits its first batch of candidates, or just after.
                tuner.send_signal(signal.SIGKILL)
                seen[name] = digests
        assert time.time() < deadline, f"no record committed in 1200 s: {sorted(seen)} did"
        time.sleep(0.1)  # the next commit is a whole batch away: seconds, not 0.1 s
    for name, tuner in tuners.items():
        tuner.communicate(timeout=60)
        assert tuner.returncode == -signal.SIGKILL, f"{name}: the tuner finished before the kill"
        watchers[name].close()
    assert _left_behind(env["XDG_CACHE_HOME"]) == [], "worker processes outlived the tuner"

    kept: dict[str, set[str]] = {}
    checks = {name: _start(["db", "check", "--db", url], env) for name, url in urls.items()}
    for name, url in urls.items():
        assert "ok (schema" in _finish(checks[name])
        storage = Storage(url)
        assert storage.integrity_problems() == []
        kept[name] = {r.digest for r in storage.records()}
        assert seen[name] <= kept[name], f"{name}: a record committed before the kill is gone"
        assert 1 <= len(kept[name]) < TRIALS

    finals: dict[str, set[str]] = {}
    for name, url in urls.items():
        # One rerun at a time: side by side, each counted the other's builds as load from others
        # and, its tune done, waited for a quiet machine to re-measure its best (qcompile.tune).
        stdout = _finish(_start([*TUNE, "--trials", str(TRIALS), "--db", url], env))
        measured = len(kept[name])
        assert re.search(rf": {TRIALS - measured} trials in \d+ s \(\d+ failed, after {measured} "
                         "records already there\\)", stdout), stdout
        stored = int(re.search(r"stored\s+(\d+) records", stdout).group(1))
        finals[name] = {r.digest for r in Storage(url).records()}
        assert kept[name] <= finals[name] and len(finals[name]) == measured + stored
    # A budget the records now cover tunes nothing. (MetaSchedule may measure a candidate
    # the database already had: that trial stores nothing, so the count is the records'.)
    # Both at once: each spends its time importing TVM.
    agains = {name: _start([*TUNE, "--trials", str(len(finals[name])), "--db", url], env)
              for name, url in urls.items()}
    for name, final in finals.items():
        again = _finish(agains[name])
        assert f"0 trials, reused {len(final)} records" in again, again
