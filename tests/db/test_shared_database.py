"""A team's shared PostgreSQL database, through the command line, as two users on two caches.

Alice tunes into the shared database. Bob, from a fresh cache directory, builds the kernel from
Alice's record with no tuning (its time is printed: speed is for benchmarks), reuses it when he
asks to tune (0 trials), and with --force tunes anyway into his local database, the shared one
opened read-only. The password in the URL never appears in any output, error or file.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuning_db import Storage

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-Pw-8x"
SPEC = ["--target", "avx2", "--shape", "128x64", "--group-size", "32"]
NAME = "uniform_b4_g32_k128_n64_m1_f32"


def _env(tmp_path, user):
    return {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / user),
            "USER": user, "LOGNAME": user}


def _qcompile(args, env, check=True):
    result = subprocess.run([sys.executable, "-m", "qcompile.cli", *args], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=1800)
    assert PASSWORD not in result.stdout + result.stderr, "the password was printed"
    if check:
        assert result.returncode == 0, f"qcompile {args[:2]}:\n{result.stdout}\n{result.stderr}"
    return result


def _with_password(url):
    return url.replace("postgresql+psycopg2://postgres@",
                       f"postgresql+psycopg2://postgres:{PASSWORD}@")


@pytest.mark.slow
def test_fresh_cache_builds_a_teammates_record_with_no_tuning(postgres_url, tmp_path, avx2):
    shared = _with_password(postgres_url)  # trust auth: the server ignores the password
    alice, bob = _env(tmp_path, "alice"), _env(tmp_path, "bob")

    tuned = _qcompile(["tune", *SPEC, "--trials", "4", "--quiet", "--db", shared], alice)
    alice_records = int(re.search(r"stored\s+(\d+) records", tuned.stdout).group(1))
    assert alice_records >= 1

    assert not (tmp_path / "bob").exists()
    out = tmp_path / "bob-kernels"
    started = time.monotonic()
    built = _qcompile(["build", *SPEC, "--db", shared, "--db-readonly", "--out", str(out)], bob)
    elapsed = time.monotonic() - started
    print(f"bob's build from alice's record: {elapsed:.1f} s")
    assert "0 trials: the record comes from" in built.stdout
    manifest = json.loads((out / f"{NAME}.json").read_text())
    assert manifest["record"]["measured_by"]["user"] == "alice"
    for path in out.iterdir():
        assert PASSWORD not in path.read_text(errors="replace"), f"password in {path.name}"

    reused = _qcompile(["tune", *SPEC, "--trials", str(alice_records), "--quiet", "--db", shared,
                        "--db-readonly"], bob)
    assert f"0 trials, reused {alice_records} records" in reused.stdout, reused.stdout

    forced = _qcompile(["tune", *SPEC, "--trials", "2", "--quiet", "--force", "--db", shared,
                        "--db-readonly"], bob)
    assert re.search(r": 2 trials in \d+ s", forced.stdout), forced.stdout
    local = Storage(f"sqlite:///{tmp_path / 'bob' / 'qcompile' / 'tuning.sqlite'}")
    assert local.count_records() >= 1 and "bob" in {r.user for r in local.records()}
    # Alice's records that bob's build timed were copied next to his measurements of them:
    # marked claimed, saying where they came from, each with a sealed measurement by bob.
    copies = [r for r in local.records() if r.user != "bob"]
    assert copies and all(r.claimed and r.origin.startswith("copied from") for r in copies)
    measured = local.measurements([r.id for r in copies])
    assert all(m and m[0].user == "bob" and m[0].seal for m in measured.values())
    assert Storage(postgres_url).count_records() == alice_records  # the shared one untouched

    # Every db command over the password URL, and a failing connection: no password shown.
    for args in (["info"], ["ls"], ["best", "--top", "2"], ["check"],
                 ["export", "--out", str(tmp_path / "x.jsonl")]):
        result = _qcompile(["db", *args, "--db", shared], bob)
        assert "***" in result.stdout or args[0] in ("ls", "best")
    assert PASSWORD not in (tmp_path / "x.jsonl").read_text()
    unreachable = shared.replace("127.0.0.1:5432", "127.0.0.1:1")
    for args in (["db", "info"], ["build", *SPEC, "--out", str(out)]):
        failed = _qcompile([*args, "--db", unreachable], bob, check=False)
        assert failed.returncode == 2 and "***" in failed.stderr, failed.stderr
