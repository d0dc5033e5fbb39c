"""The concurrency contract, kept by real processes and real servers.

- 8 processes commit at once into one empty PostgreSQL schema, then into one SQLite file: the
  schema is created once, every workload is one row, every committed record is there exactly
  once, and no process sees an error.
- A deadlock PostgreSQL detects is retried, not surfaced.
"""

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import create_engine, text

from tuning_db import Storage
from tuning_db.database import record_digest

WRITER = Path(__file__).with_name("concurrent_writer.py")
PROCESSES = 8
ROOT = Path(__file__).resolve().parents[2]


def _run_writers(url, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_NUM_THREADS": "1"}
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    outs = [tmp_path / f"writer{i}.json" for i in range(PROCESSES)]
    procs = [subprocess.Popen([sys.executable, str(WRITER), url, str(i), str(barrier),
                               str(outs[i])], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    # Importing TVM takes seconds: let everyone go at once when all are ready.
    deadline = time.time() + 300
    while len(list(barrier.glob("ready.*"))) < PROCESSES:
        assert time.time() < deadline, "writers never got ready"
        assert all(p.poll() is None for p in procs), "a writer died before the start"
        time.sleep(0.05)
    (barrier / "go").touch()
    started = time.monotonic()
    results = []
    for proc, out in zip(procs, outs, strict=True):
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"a writer failed:\n{stdout}\n{stderr}"
        assert "Error" not in stderr and "Traceback" not in stderr, stderr
        results.append(json.loads(out.read_text()))
    print(f"{PROCESSES} writers committed in {time.monotonic() - started:.1f} s")
    return results


def _check(url, reports):
    storage = Storage(url)
    results = [report[url] for report in reports]
    committed = [c for r in results for c in r["committed"]]
    expected = {record_digest(c["workload"], c["trace"]) for c in committed}
    # every writer shares one workload and has one of its own
    workloads = storage.workloads()
    assert len(workloads) == 1 + PROCESSES
    assert len({w.digest for w in workloads}) == len(workloads)
    shared = Counter(c["workload"] for c in committed)
    assert max(shared.values()) == 6 * PROCESSES  # the shared one, from everyone
    records = storage.records()
    digests = Counter(r.digest for r in records)
    assert set(digests) == expected, "a committed record is missing, or one appeared from nowhere"
    assert max(digests.values()) == 1
    # each distinct record was reported new by exactly one writer
    new_by = Counter(record_digest(c["workload"], c["trace"]) for c in committed if c["new"])
    assert set(new_by) == expected and max(new_by.values()) == 1
    assert storage.integrity_problems() == []
    return len(records), sum(r["retries"] for r in results)


def test_eight_processes_into_postgresql_and_sqlite(postgres_url, tmp_path):
    sqlite_url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    reports = _run_writers(f"{postgres_url},{sqlite_url}", tmp_path)
    for url in (postgres_url, sqlite_url):
        n_records, retries = _check(url, reports)
        print(f"{url.split(':')[0]}: {PROCESSES} writers, {n_records} distinct records, "
              f"{retries} retried transactions")


def test_deadlock_is_retried(postgres_url):
    """Two transactions lock two rows in opposite orders; PostgreSQL aborts ours (its deadlock
    timeout is the shorter), and the storage retries it to success."""
    storage = Storage(postgres_url)
    for name in ("a", "b"):
        storage.get_or_create_workload(digest=name * 64, name=name, family="uniform",
                                       spec_digest="s" * 64, spec_json="{}", target_key="t" * 64,
                                       target_json="{}", mod_hash="0", mod_json="[]")
    other = create_engine(postgres_url)
    locked_a = threading.Event()
    release = threading.Event()

    def rival():
        with other.begin() as conn:
            conn.execute(text("UPDATE workloads SET name = 'a1' WHERE digest = :d"),
                         {"d": "a" * 64})
            locked_a.set()
            release.wait(10)
            conn.execute(text("UPDATE workloads SET name = 'b1' WHERE digest = :d"),
                         {"d": "b" * 64})

    attempts = []

    def work(session):
        attempts.append(len(attempts) + 1)
        session.execute(text("SET LOCAL deadlock_timeout = '50ms'"))
        session.execute(text("UPDATE workloads SET name = 'b2' WHERE digest = :d"),
                        {"d": "b" * 64})
        if len(attempts) == 1:
            release.set()
            time.sleep(0.2)  # the rival now waits for our row b
        session.execute(text("UPDATE workloads SET name = 'a2' WHERE digest = :d"),
                        {"d": "a" * 64})
        return len(attempts)

    thread = threading.Thread(target=rival)
    thread.start()
    assert locked_a.wait(10)
    assert storage._run(work, write=True) == 2
    thread.join(10)
    other.dispose()
    assert storage.retries == 1
    names = {w.digest[0]: w.name for w in storage.workloads()}
    assert names == {"a": "a2", "b": "b2"}
