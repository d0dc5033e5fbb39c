"""A record whose trace carries native code never reaches a build, nor MetaSchedule's search.

A hostile writer stores, straight through ``Storage.add_record`` (no tuner, no import checks),
a record whose trace adds ``Annotate(loop, "pragma_import_llvm", <LLVM IR with a global
constructor>)`` and claims 1 ns. ``SqlDatabase.ranked`` (build's choice and MetaSchedule's
seeding) skips it with one warning; ``build`` takes the valid record, or says that none is
valid; ``SqlDatabase.replay`` refuses to replay it; our own tuner cannot store such a trace.
"""

from __future__ import annotations

import json
import logging

import pytest

from qcompile import _tvm
from qcompile.build import build
from qcompile.errors import NoRecordError, RecordRefused
from qcompile.kernels import UniformSpec
from qcompile.trust.workloads import workload_database
from schedules.variants import compute_for
from tuning_db import STATUS_OK, Provenance, Storage
from tuning_db.database import record_digest

SPEC = UniformSpec(k=256, n=128, bits=4, group_size=64)

#: LLVM IR whose function runs when the library holding it is loaded (it does nothing here:
#: the check refuses the annotation key whatever the payload).
ATTACK_IR = """@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] \
[{ i32, ptr, ptr } { i32 65535, ptr @qcompile_attack, ptr null }]

define internal void @qcompile_attack() {
entry:
  ret void
}
"""


@pytest.fixture
def setting(avx2, tmp_path):
    hw = avx2.hardware(cores=2)
    return avx2, hw, _tvm.Target(avx2.tvm_target(hw))


def _database(storage: Storage, target):
    """The database's view of SPEC on ``target``."""
    return workload_database(storage, SPEC, target)


def _mod():
    return _tvm.normalize_mod(compute_for(SPEC, "cpu"))


def _schedule(hw):
    """A schedule of our design space (sketch 1, fixed tiles)."""
    from schedules.cpu import uniform

    return uniform.register_tile(_tvm.Schedule(_mod()), SPEC, hw, {"n_blk": 1, "n_reg": 2})


def _attack(sch):
    """``sch`` with the annotation on one of its own loops, added as TVM records it."""
    sch.annotate(_live_loop(sch), "pragma_import_llvm", ATTACK_IR)
    return sch


def _live_loop(sch):
    """The last loop variable of ``sch``'s trace whose loop still exists."""
    from tvm.s_tir.schedule import LoopRV

    for inst in reversed(sch.trace.insts):
        for out in inst.outputs:
            if isinstance(out, LoopRV):
                try:
                    sch.get(out)
                except ValueError:  # split or fused away
                    continue
                return out
    raise AssertionError("no loop left")


def _commit_valid(storage: Storage, target, hw) -> int:
    database = _database(storage, target)
    mod = _mod()
    workload = database.commit_workload(mod)
    args_info = _tvm.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    record = _tvm.TuningRecord(_schedule(hw).trace, workload, [3e-5, 3e-5], target, args_info)
    return database.commit_measurement(record, STATUS_OK, None)


def _store_hostile(storage: Storage, target, hw) -> str:
    """What a hostile writer stores: a valid trace plus the annotation, claiming 1 ns."""
    database = _database(storage, target)
    info = database.register(_mod())
    sch = _attack(_schedule(hw))
    from tuning_db.database import _plain_json

    trace = _plain_json(sch.trace.as_json())
    assert trace[0][-1][2] == ["pragma_import_llvm"] and "global_ctors" in trace[0][-1][1][1]
    text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
    digest = record_digest(info.digest, text)
    args_info = json.dumps(_plain_json(
        [a.as_json() for a in _tvm.ms.arg_info.ArgInfo.from_prim_func(_mod()["main"])]))
    storage.add_record(
        workload_id=info.id, digest=digest, status=STATUS_OK, run_secs=[1e-9], trace_json=text,
        args_info_json=args_info, target_json=json.dumps(_tvm.target_dict(target)),
        provenance=Provenance(host="mallory-box", user="mallory", tvm_version=_tvm.TVM_VERSION),
        origin="import")
    return digest


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "pragma_import_llvm" in r.getMessage()]


@pytest.mark.slow
def test_hostile_record_is_skipped_and_build_takes_the_valid_one(setting, tmp_path, caplog):
    preset, hw, target = setting
    storage = Storage(f"sqlite:///{tmp_path / 'shared.sqlite'}")
    valid_id = _commit_valid(storage, target, hw)
    hostile = _store_hostile(storage, target, hw)
    stored = storage.top_records(storage.workloads()[0].id, 5, _tvm.TVM_VERSION)
    assert [r.digest for r in stored][:1] == [hostile] and len(stored) == 2  # 1 ns: first

    database = _database(storage, target)
    with caplog.at_level(logging.WARNING, logger="tuning_db.database"):
        ranked = database.ranked(_mod(), 5)
        assert [record.id for _, record in ranked] == [valid_id]
        # MetaSchedule's seeding and query paths see the valid record only
        seeds = database.get_top_k(_tvm.Workload(_mod()), 5)
        assert len(seeds) == 1 and float(seeds[0].run_secs[0]) == pytest.approx(3e-5)
        assert database.query_tuning_record(_mod(), target, "main") is not None
        assert len(database.get_all_tuning_records()) == 1
    refusals = _refusals(caplog)
    assert len(refusals) == 1, refusals  # one warning per record, however often it is met
    assert refusals[0].startswith(
        f"record {hostile[:12]}: instruction ") and "Annotate key 'pragma_import_llvm' is " \
        "not one our design spaces emit" in refusals[0] and "skipped" in refusals[0]

    result = build(SPEC, preset, tmp_path / "out", storage=storage, hw=hw)
    assert result.record_id == valid_id
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["record"]["digest"] != hostile
    assert "pragma_import_llvm" not in (tmp_path / "out" / f"{SPEC.name()}.tir.py").read_text()

    record = next(r for r in storage.records() if r.digest == hostile)
    with pytest.raises(RecordRefused, match=rf"^record {hostile[:12]}: instruction \d+ Annotate "
                                            r"key 'pragma_import_llvm' is not one"):
        _database(storage, target).replay(_mod(), record)


@pytest.mark.slow
def test_build_says_when_no_record_is_valid(setting, tmp_path, caplog):
    preset, hw, target = setting
    storage = Storage(f"sqlite:///{tmp_path / 'shared.sqlite'}")
    hostile = _store_hostile(storage, target, hw)
    with pytest.raises(NoRecordError) as error:
        build(SPEC, preset, tmp_path / "out", storage=storage, hw=hw)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"no tuned record for {SPEC.name()} on avx2")
    assert (f"(none valid: 1 refused, the first as record {hostile[:12]}: instruction "
            in message) and "Annotate key 'pragma_import_llvm'" in message
    assert "run: qcompile tune" in message
    assert not (tmp_path / "out").exists()


def test_our_tuner_cannot_store_such_a_trace(setting, tmp_path):
    _, hw, target = setting
    storage = Storage(f"sqlite:///{tmp_path / 'local.sqlite'}")
    database = _database(storage, target)
    mod = _mod()
    workload = database.commit_workload(mod)
    sch = _attack(_schedule(hw))
    record = _tvm.TuningRecord(sch.trace, workload, [1e-5], target,
                               _tvm.ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
    with pytest.raises(RecordRefused, match=r"^record [0-9a-f]{12}: instruction \d+ Annotate key "
                                            "'pragma_import_llvm'"):
        database.commit_measurement(record, STATUS_OK, None)
    assert storage.count_records() == 0
