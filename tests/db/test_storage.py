"""The storage layer and MetaSchedule's view of it, over every backend."""

import json

import pytest

import targets
from qcompile import _tvm
from qcompile.errors import DatabaseError
from qcompile.kernels import UniformSpec
from qcompile.trust.workloads import workload_database
from schedules.variants import compute_for
from tuning_db import STATUS_BUILD_ERROR, STATUS_OK, Storage

SPEC = UniformSpec(k=256, n=128, bits=4, group_size=64)


def _target(name):
    preset = targets.get(name)
    return _tvm.Target(preset.tvm_target(preset.hardware(cores=2)))


def _database(storage, target, **kwargs):
    """The database's view of SPEC on ``target`` (one view serves one workload)."""
    return workload_database(storage, SPEC, target, **kwargs)


def _mod(spec=SPEC):
    return _tvm.normalize_mod(compute_for(spec, "cpu"))


def _record(database, mod, run_secs, seed=1):
    """A real TuningRecord: the trace of a schedule from our design space (tiles picked by seed)."""
    from schedules.cpu import uniform

    n_blk, n_reg = [(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (1, 8), (2, 8)][seed]
    sch = uniform.register_tile(_tvm.Schedule(mod), SPEC, targets.get("avx2").hardware(),
                                {"n_blk": n_blk, "n_reg": n_reg})
    workload = database.commit_workload(mod)
    args_info = _tvm.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    return _tvm.TuningRecord(sch.trace, workload, run_secs, database.target, args_info)


def test_workload_insert_or_get_is_idempotent(db_url):
    storage = Storage(db_url)
    database = _database(storage, _target("avx2"))
    mod = _mod()
    assert not database.has_workload(mod)
    database.commit_workload(mod)
    database.commit_workload(mod)
    assert database.has_workload(mod)
    assert len(storage.workloads()) == 1


def test_records_rank_and_failures_have_no_latency(db_url):
    storage = Storage(db_url)
    database = _database(storage, _target("avx2"))
    mod = _mod()
    slow = _record(database, mod, [3e-5, 3e-5], seed=1)
    fast = _record(database, mod, [1e-5, 1e-5], seed=2)
    broken = _record(database, mod, None, seed=3)
    assert database.commit_measurement(slow, STATUS_OK, None) is not None
    assert database.commit_measurement(fast, STATUS_OK, None) is not None
    assert database.commit_measurement(broken, STATUS_BUILD_ERROR, "LLVM exploded") is not None
    # committing the same measurement again stores nothing new
    assert database.commit_measurement(fast, STATUS_OK, None) is None
    assert len(database) == 3
    top = database.get_top_k(database.commit_workload(mod), 5)
    assert [float(top[0].run_secs[0]), float(top[1].run_secs[0])] == [1e-5, 3e-5]
    failures = [r for r in storage.records() if r.status == STATUS_BUILD_ERROR]
    assert failures[0].mean_us is None and failures[0].error == "LLVM exploded"
    assert failures[0].tvm_version == _tvm.TVM_VERSION and failures[0].host


def test_target_isolation(db_url):
    """An avx2 record never answers an avx512 query."""
    storage = Storage(db_url)
    avx2 = _database(storage, _target("avx2"))
    mod = _mod()
    avx2.commit_measurement(_record(avx2, mod, [1e-5]), STATUS_OK, None)
    assert avx2.query_tuning_record(mod, _target("avx2"), "main") is not None
    assert avx2.query_tuning_record(mod, _target("avx512"), "main") is None
    avx512 = _database(storage, _target("avx512"))
    assert not avx512.has_workload(mod)
    assert avx512.best(mod) is None
    assert _tvm.ms.tir_integration.compile_tir(avx512, mod, _target("avx512")) is None
    assert _tvm.ms.tir_integration.compile_tir(avx2, mod, _target("avx2")) is not None


def test_round_trip_close_and_reopen(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = Storage(url)
    database = _database(storage, _target("avx2"))
    mod = _mod()
    database.commit_measurement(_record(database, mod, [2e-5], seed=4), STATUS_OK, None)
    database.commit_measurement(_record(database, mod, [1e-5], seed=5), STATUS_OK, None)
    best_before = database.best(mod)[1]
    storage.close()
    reopened = _database(Storage(url), _target("avx2"))
    best_after = reopened.best(mod)[1]
    assert (best_after.id, best_after.mean_us, best_after.trace_json) == (
        best_before.id, best_before.mean_us, best_before.trace_json)


def test_changed_tensorir_is_refused(db_url):
    storage = Storage(db_url)
    database = _database(storage, _target("avx2"))
    mod = _mod()
    database.commit_workload(mod)
    other = _tvm.normalize_mod(
        compute_for(SPEC, "cpu").with_attr("qcompile.extra", "changed"))
    fresh = _database(storage, _target("avx2"))
    with pytest.raises(DatabaseError, match="different TensorIR"):
        fresh.register(other)


def test_summaries_count_records(db_url):
    storage = Storage(db_url)
    database = _database(storage, _target("avx2"))
    mod = _mod()
    database.commit_measurement(_record(database, mod, [1e-5], seed=6), STATUS_OK, None)
    database.commit_measurement(_record(database, mod, None, seed=7), STATUS_BUILD_ERROR, "x")
    (summary,) = storage.summaries()
    assert (summary.name, summary.records, summary.ok_records) == (SPEC.name(), 2, 1)
    assert summary.best_us == pytest.approx(10.0)
    assert json.loads(summary.target_json)["mcpu"] == "core-avx2"


def test_readonly_refuses_writes(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    Storage(url)
    readonly = _database(Storage(url, readonly=True), _target("avx2"))
    with pytest.raises(DatabaseError, match="read-only"):
        readonly.register(_mod())


def test_password_never_shown():
    storage_url = "postgresql+psycopg2://alice:s3cret-pw@127.0.0.1:1/none"
    with pytest.raises(DatabaseError) as error:
        Storage(storage_url).summaries()
    assert "s3cret-pw" not in str(error.value)
    assert "***" in str(error.value)
    bare = Storage(storage_url, check_schema=False)
    for call in (bare.schema_revision, bare.upgrade_schema, bare.count_workloads):
        with pytest.raises(DatabaseError) as error:
            call()
        assert "s3cret-pw" not in str(error.value) and "***" in str(error.value)
    assert "s3cret-pw" not in repr(bare) and "s3cret-pw" not in bare.display_url


def test_records_of_another_tvm_series_do_not_answer(db_url):
    """A trace measured with another TVM major.minor may not replay: lookups skip it."""
    from dataclasses import replace

    from tuning_db.database import default_provenance

    storage = Storage(db_url)
    old = _database(storage, _target("avx2"),
                      provenance=replace(default_provenance(), tvm_version="0.26.0"))
    mod = _mod()
    old.commit_measurement(_record(old, mod, [1e-5], seed=1), STATUS_OK, None)
    current = _database(storage, _target("avx2"))
    assert current.best(mod) is None and current.measured(mod) == 0
    current.commit_measurement(_record(current, mod, [2e-5], seed=2), STATUS_OK, None)
    assert current.best(mod)[1].mean_us == pytest.approx(20.0)
    assert current.best(mod)[1].tvm_version == _tvm.TVM_VERSION
