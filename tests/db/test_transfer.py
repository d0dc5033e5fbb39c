"""Export/import (JSON lines, MetaSchedule's JSONDatabase both ways), merge, prune, and the
layered lookup, over every backend."""

import json

import pytest

import targets
from qcompile import _tvm
from qcompile.errors import DatabaseError
from qcompile.kernels import UniformSpec
from qcompile.testing.records import commit_records, uniform_trace
from qcompile.trust import records
from qcompile.trust.workloads import workload_database
from schedules.variants import compute_for
from tuning_db import Provenance, Storage, transfer
from tuning_db.layers import Layers, open_layers

SPEC = UniformSpec(k=256, n=128, bits=4, group_size=64)


def _target():
    preset = targets.get("avx2")
    return _tvm.Target(preset.tvm_target(preset.hardware(cores=2)))


def _mod():
    return _tvm.normalize_mod(compute_for(SPEC, "cpu"))


def _fill(database, secs_by_tile):
    """Commit real records (our design space's traces, tiles by index) with these latencies;
    None stores a build failure."""
    return commit_records(database, SPEC, secs_by_tile)


def _alice():
    return Provenance(host="alice-box", device_model="EPYC", tvm_version=_tvm.TVM_VERSION,
                      tvm_ffi_version=_tvm.TVM_FFI_VERSION, qcompile_version="0.1.0", user="alice")


def _fields(record):
    return (record.digest, record.status, record.mean_us, record.trace_json, record.host,
            record.user, record.device_model, record.tvm_version, record.error)


def test_jsonl_round_trip_is_exact_and_idempotent(db_url, tmp_path):
    source = Storage(f"sqlite:///{tmp_path / 'source.sqlite'}")
    _fill(workload_database(source, SPEC, _target(), provenance=_alice()),
          {0: [3e-5], 1: [1e-5], 2: None})
    path = tmp_path / "records.jsonl"
    assert transfer.export_jsonl(source, path).line() == "1 workloads, 3 records"
    dest = Storage(db_url)
    assert records.import_file(dest, path).line() == "1 workloads, 3 records"
    assert records.import_file(dest, path).line() == \
        "1 workloads, 3 records (3 already there)"
    assert sorted(map(_fields, dest.records())) == sorted(map(_fields, source.records()))
    assert {r.origin for r in dest.records()} == {"import records.jsonl"}
    created = {r.digest: r.created_at for r in source.records()}
    assert all(r.created_at == created[r.digest] for r in dest.records())


def test_jsonl_refuses_other_files(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(DatabaseError, match="not a qcompile JSON lines export"):
        records.import_file(Storage("sqlite://"), path)


def test_metaschedule_export_reads_in_metaschedule(tmp_path):
    source = Storage(f"sqlite:///{tmp_path / 'source.sqlite'}")
    mod = _fill(workload_database(source, SPEC, _target()), {0: [3e-5], 1: [1e-5], 2: None})
    count = transfer.export_metaschedule(source, tmp_path / "ms")
    assert (count.workloads, count.records) == (1, 2)  # failures have no MetaSchedule form
    ms_db = _tvm.ms.database.JSONDatabase(
        path_workload=str(tmp_path / "ms" / transfer.MS_WORKLOADS),
        path_tuning_record=str(tmp_path / "ms" / transfer.MS_RECORDS), allow_missing=False)
    assert len(ms_db) == 2
    best = ms_db.query_tuning_record(mod, _target(), "main")
    assert [float(s) for s in best.run_secs] == [1e-5]
    assert ms_db.query_schedule(mod, _target(), "main") is not None


def test_metaschedule_import_from_metaschedule(db_url, tmp_path):
    """Records MetaSchedule's own JSONDatabase wrote come in with their target and latency."""
    mod = _mod()
    ms_dir = tmp_path / "ms"
    ms_dir.mkdir()
    ms_db = _tvm.ms.database.JSONDatabase(
        path_workload=str(ms_dir / transfer.MS_WORKLOADS),
        path_tuning_record=str(ms_dir / transfer.MS_RECORDS))
    workload = ms_db.commit_workload(mod)
    for index, secs in ((3, [2e-5]), (4, [0.5e-5]), (5, [1e10])):
        sch = uniform_trace(SPEC, index, mod)
        args_info = _tvm.ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        ms_db.commit_tuning_record(_tvm.TuningRecord(sch.trace, workload, secs, _target(),
                                                     args_info))
    dest = Storage(db_url)
    count = records.import_file(dest, ms_dir)
    assert (count.workloads, count.records, count.skipped) == (1, 2, 1)
    best = workload_database(dest, SPEC, _target()).best(mod)
    assert best is not None and best[1].mean_us == pytest.approx(5.0)
    assert best[0].name == SPEC.name()
    # and back out: the same latencies
    transfer.export_metaschedule(dest, tmp_path / "again")
    lines = (tmp_path / "again" / transfer.MS_RECORDS).read_text().splitlines()
    assert sorted(json.loads(line)[1][1][0] for line in lines) == [0.5e-5, 2e-5]
    assert records.import_file(dest, ms_dir).duplicates == 2


def test_merge_and_prune(db_url, tmp_path):
    other = Storage(f"sqlite:///{tmp_path / 'other.sqlite'}")
    _fill(workload_database(other, SPEC, _target(), provenance=_alice()),
          {0: [5e-5], 1: [4e-5], 2: [3e-5], 3: None})
    dest = Storage(db_url)
    mod = _fill(workload_database(dest, SPEC, _target()), {4: [2e-5], 5: [6e-5]})
    count = records.merge(other, dest)
    assert (count.workloads, count.records, count.duplicates) == (1, 4, 0)
    assert records.merge(other, dest).duplicates == 4
    assert len(dest.workloads()) == 1 and dest.count_records() == 6
    assert dest.prune(3, dry_run=True) == 3 and dest.count_records() == 6
    assert dest.prune(3) == 3
    kept = sorted(r.mean_us for r in dest.records())
    assert kept == pytest.approx([20.0, 30.0, 40.0])  # the fastest three; the failure went
    assert workload_database(dest, SPEC, _target()).best(mod)[1].mean_us == pytest.approx(20.0)
    with pytest.raises(ValueError, match="keep=0"):
        dest.prune(0)


def test_layered_lookup_reads_shared_then_local_and_writes_local(db_url, tmp_path):
    shared_rw = Storage(db_url)
    mod = _fill(workload_database(shared_rw, SPEC, _target(), provenance=_alice()),
                {0: [3e-5], 1: [2e-5]})
    if db_url == "sqlite://":  # an in-memory database is private to its engine: reuse it
        shared = shared_rw
        shared.readonly = True
    else:
        shared = Storage(db_url, readonly=True)
    local = Storage(f"sqlite:///{tmp_path / 'local.sqlite'}")
    layers = Layers(writer=local, readers=[shared, local])
    database = workload_database(local, SPEC, _target(), readers=layers.readers)
    info, best = database.best(mod)
    assert (best.user, best.mean_us, best.database) == ("alice", pytest.approx(20.0),
                                                        shared.display_url)
    assert database.measured(mod) == 2
    _fill(database, {2: [1e-5]})  # a faster one, tuned here: goes to the local database
    assert local.count_records() == 1 and shared.count_records() == 2
    assert database.best(mod)[1].database == local.display_url
    assert [float(r.run_secs[0]) for r in database.get_top_k(database.commit_workload(mod), 5)] \
        == [1e-5, 2e-5, 3e-5]
    other_spec = UniformSpec(k=256, n=64)
    other = _tvm.normalize_mod(compute_for(other_spec, "cpu"))
    with pytest.raises(DatabaseError, match="read-only"):
        workload_database(shared, other_spec, _target()).register(other)


def test_open_layers(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    local = open_layers()
    assert len(local.readers) == 1 and local.writer.url.endswith("tuning.sqlite")
    shared_url = f"sqlite:///{tmp_path / 'team.sqlite'}"
    Storage(shared_url)
    writable = open_layers(shared_url)
    assert [s.url for s in writable.readers] == [shared_url, local.writer.url]
    assert writable.writer.url == shared_url
    readonly = open_layers(shared_url, readonly=True)
    assert readonly.writer.url == local.writer.url and readonly.readers[0].readonly
    assert "(read-only)" in readonly.describe()
