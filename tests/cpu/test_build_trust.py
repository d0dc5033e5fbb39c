"""``build`` believes only latencies sealed for this machine type; it times the claims that
would beat them, stores what it measured, and a fake 1 ns record never wins by its claim."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from qcompile import _tvm
from qcompile.build import build
from qcompile.errors import NoRecordError
from qcompile.kernels import UniformSpec
from qcompile.testing.records import TILES, uniform_trace
from qcompile.trust import records
from qcompile.trust.seals import Sealer, host_key_path
from qcompile.trust.workloads import workload_database
from qcompile.tune import tune
from schedules.variants import compute_for
from tuning_db import Provenance, Storage, transfer
from tuning_db.database import record_digest, record_json

ROOT = Path(__file__).resolve().parents[2]
SPEC = UniformSpec(k=256, n=256)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tuned_once(tmp_path_factory):
    """(database file, cache directory) of one real 8-trial tune of SPEC, done once for the
    module: every test here starts from the same tuned database (tuning it again per test cost
    15-30 s each and tested nothing more)."""
    preset = targets.get("avx2")
    supported, reason = preset.host_support()
    if not supported:
        pytest.skip(f"host cannot run avx2 code: {reason}")
    root = tmp_path_factory.mktemp("tuned-once")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(root / "cache"))  # the tuner's host key goes here
        storage = Storage(f"sqlite:///{root / 'tuned.sqlite'}")
        tune(SPEC, preset, trials=8, storage=storage, progress=False)
        storage.close()
    return root / "tuned.sqlite", root / "cache"


def _tuned_copy(tuned_once, path: Path) -> Storage:
    """A copy of the module's tuned database at ``path``, as if this test had tuned it here:
    the tuner's host key becomes this test's (its cache directory's) host key."""
    database, cache = tuned_once
    key = host_key_path()  # this test's, under its own $XDG_CACHE_HOME
    key.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cache / "qcompile" / "seal.key", key)
    with sqlite3.connect(database) as source, sqlite3.connect(path) as copy:
        source.backup(copy)  # whole, WAL included
    return Storage(f"sqlite:///{path}")


def _forge(storage, preset, claimed_secs):
    """What a hostile writer of a shared database can do: insert a valid trace of ours, with
    made-up provenance and a latency nobody measured (no seal). Returns its digest."""
    target = _tvm.Target(preset.tvm_target(preset.hardware()))
    database = workload_database(storage, SPEC, target)
    mod = _tvm.normalize_mod(compute_for(SPEC, "cpu"))
    workload = database.register(mod)
    taken = {r.digest for r in storage.records()}
    for index in range(len(TILES)):
        sch = uniform_trace(SPEC, index, mod)
        args = _tvm.ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        trace, _, target_dict, args_info = record_json(
            _tvm.TuningRecord(sch.trace, _tvm.Workload(mod), claimed_secs, target, args))
        text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
        digest = record_digest(workload.digest, text)
        if digest in taken:
            continue
        storage.add_record(workload_id=workload.id, digest=digest, status="ok",
                           run_secs=claimed_secs, trace_json=text,
                           args_info_json=json.dumps(args_info),
                           target_json=workload.target_json,
                           provenance=Provenance(host="build-farm", user="mallory",
                                                 device_model="AMD EPYC",
                                                 tvm_version=_tvm.TVM_VERSION), origin="tune")
        return digest
    raise AssertionError("every tile was tuned already")


def test_a_fake_record_is_timed_here_and_the_timing_is_kept(tmp_path, avx2, tuned_once):
    storage = _tuned_copy(tuned_once, tmp_path / "team.sqlite")
    fake = _forge(storage, avx2, [1e-9])

    first = build(SPEC, avx2, tmp_path / "out", storage=storage)
    assert "re-measured here against" in first.how, first.how
    assert first.tuned_us > 0.05, "the exported latency must be one measured here"
    manifest = json.loads((tmp_path / "out" / f"{SPEC.name()}.json").read_text())
    assert manifest["record"]["mean_us"] == pytest.approx(first.tuned_us)
    if manifest["record"]["digest"] == fake:
        assert manifest["record"]["claimed_us"] == pytest.approx(1e-3)
    fake_id = next(r.id for r in storage.records() if r.digest == fake)
    (measured,) = storage.measurements([fake_id])[fake_id]
    assert measured.purpose == "verify" and measured.mean_us > 0.05
    assert Sealer.load().verify(measured.seal, fake, measured.device_model, measured.run_secs,
                                "verify") == "host key"

    second = build(SPEC, avx2, tmp_path / "again", storage=storage)
    assert "sealed by the host key" in second.how and second.record_id == first.record_id
    assert storage.measurements([fake_id])[fake_id] == [measured], "nothing timed twice"


def test_without_a_way_to_measure_only_sealed_records_win(tmp_path, avx2, tuned_once):
    tuned = _tuned_copy(tuned_once, tmp_path / "tuned.sqlite")
    export = tmp_path / "records.jsonl"
    transfer.export_jsonl(tuned, export)

    # Another user's machine: imported records are claims, and their seals are not its keys.
    other_cache = tmp_path / "other-user"
    env = {"XDG_CACHE_HOME": str(other_cache)}
    received = f"sqlite:///{tmp_path / 'received.sqlite'}"
    run = [sys.executable, "-m", "qcompile.cli"]
    subprocess.run(run + ["db", "import", str(export), "--db", received], check=True,
                   env={**os.environ, **env}, cwd=ROOT, timeout=600)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(other_cache))
        with pytest.raises(NoRecordError, match="qcompile db verify"):
            build(SPEC, avx2, tmp_path / "out", storage=Storage(received), for_another_host=True)
        result = subprocess.run(run + ["db", "verify", "--db", received, "--top", "2"],
                                env={**os.environ, **env}, cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        assert "measured 2 records" in result.stdout and "sealed with the host key" in \
            result.stdout
        built = build(SPEC, avx2, tmp_path / "out", storage=Storage(received),
                      for_another_host=True)
        assert "sealed by the host key" in built.how


def test_imported_records_are_claims(tmp_path, avx2, tuned_once):
    tuned = _tuned_copy(tuned_once, tmp_path / "tuned.sqlite")
    export = tmp_path / "records.jsonl"
    transfer.export_jsonl(tuned, export)
    received = Storage(f"sqlite:///{tmp_path / 'received.sqlite'}")
    records.import_file(received, export)
    assert all(r.claimed for r in received.records())
    # Same user, same machine: the seals are this host's own, so the build believes them.
    result = build(SPEC, avx2, tmp_path / "out", storage=received)
    assert "sealed by the host key" in result.how
