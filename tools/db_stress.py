"""N real ``qcompile tune`` processes at once into one database, then check what they left.

    python tools/db_stress.py --db postgresql+psycopg2://postgres@127.0.0.1:5432/test \
        [--processes 8] [--trials 8] [--json]

Half the processes tune one shared workload (different seeds, so their candidates partly
overlap), the others one workload each. With a PostgreSQL URL the run gets a fresh schema of
its own (dropped afterwards unless --keep). Checks: every process exits 0 with no error on
stderr; no workload appears twice; the records in the database are exactly the records the
processes reported storing (nothing lost, nothing duplicated); ``qcompile db check`` passes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _schema_url(base: str) -> tuple[str, str]:
    from sqlalchemy import create_engine, text

    from tuning_db.url import resolve_url

    schema = f"qc_stress_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    engine = create_engine(resolve_url(base))
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}", schema


def _drop_schema(base: str, schema: str) -> None:
    from sqlalchemy import create_engine, text

    from tuning_db.url import resolve_url

    engine = create_engine(resolve_url(base))
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, metavar="URL")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL schema")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from tuning_db import Storage, redact
    from tuning_db.url import scrub

    url, schema = args.db, None
    if args.db.startswith("postgresql"):
        url, schema = _schema_url(args.db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_NUM_THREADS": "1"}
    jobs = []
    for i in range(args.processes):
        shape = "128x64" if i % 2 == 0 else f"128x{64 + 16 * (i + 1)}"
        jobs.append((shape, i))
    started = time.monotonic()
    procs = []
    for shape, seed in jobs:
        cmd = [sys.executable, "-m", "qcompile.cli", "tune", "--target", "avx2", "--shape", shape,
               "--group-size", "32", "--trials", str(args.trials), "--seed", str(seed), "--quiet",
               "--force", "--db", url]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT))
    outcomes = []
    for (shape, seed), proc in zip(jobs, procs, strict=True):
        stdout, stderr = proc.communicate()
        stored = re.search(r"stored\s+(\d+) records", stdout)
        outcomes.append({"shape": shape, "seed": seed, "rc": proc.returncode,
                         "stored": int(stored.group(1)) if stored else None,
                         "stderr_errors": [scrub(line, url) for line in stderr.splitlines()
                                           if "error" in line.lower() or "Traceback" in line]})
    wall = time.monotonic() - started
    storage = Storage(url)
    workloads = storage.workloads()
    records = storage.records()
    digests = Counter(r.digest for r in records)
    stored_total = sum(o["stored"] or 0 for o in outcomes)
    check = subprocess.run([sys.executable, "-m", "qcompile.cli", "db", "check", "--db", url],
                           env=env, capture_output=True, text=True, cwd=ROOT)
    report = {
        "database": redact(url), "processes": args.processes, "trials": args.trials,
        "wall_s": round(wall, 1),
        "all_exit_0": all(o["rc"] == 0 for o in outcomes),
        "errors_on_stderr": sum(len(o["stderr_errors"]) for o in outcomes),
        "workloads": len(workloads),
        "distinct_workload_digests": len({w.digest for w in workloads}),
        "expected_workloads": len({shape for shape, _ in jobs}),
        "records_in_db": len(records),
        "records_reported_stored": stored_total,
        "max_copies_of_a_record": max(digests.values()) if digests else 0,
        "db_check": scrub(check.stdout.strip(), url), "db_check_rc": check.returncode,
        "outcomes": outcomes,
    }
    report["ok"] = (report["all_exit_0"] and report["errors_on_stderr"] == 0
                    and report["workloads"] == report["distinct_workload_digests"]
                    == report["expected_workloads"]
                    and report["records_in_db"] == stored_total
                    and report["max_copies_of_a_record"] == 1 and check.returncode == 0)
    storage.close()
    if schema and not args.keep:
        _drop_schema(args.db, schema)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            if key != "outcomes":
                print(f"{key:28s} {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
