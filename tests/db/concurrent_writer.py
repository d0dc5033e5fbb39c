"""One of the concurrent writers of tests/db/test_concurrency.py (run as a script).

    python tests/db/concurrent_writer.py URLS INDEX BARRIER_DIR OUT_JSON

Prepares its records, writes BARRIER_DIR/ready.INDEX and waits for BARRIER_DIR/go (so that all
writers start together, whatever their import times), opens each database of URLS in turn
(comma-separated; empty ones: the writers race to create the schema), and commits, through the
MetaSchedule database view that tuning uses, real tuning records (traces of schedules from our
design space) of two workloads: one every writer shares, and one of its own. The shared
workload gets both records every writer commits (the same traces) and records only this writer
has. Writes what it committed to each, to OUT_JSON.
"""

import json
import sys
import time


def main(urls: str, index: int, barrier: str, out_path: str) -> None:
    from pathlib import Path

    import targets
    from qcompile import _tvm
    from qcompile.kernels import UniformSpec, get_family
    from schedules import untuned_schedule
    from tuning_db import STATUS_BUILD_ERROR, STATUS_OK, Storage
    from tuning_db.database import SqlDatabase

    preset = targets.get("avx2")
    hw = preset.hardware(cores=2)
    target = _tvm.Target(preset.tvm_target(hw))
    shared = UniformSpec(k=128, n=64, bits=4, group_size=32)
    own = UniformSpec(k=128, n=64 + 16 * (index + 1), bits=4, group_size=32)
    mods = {spec: _tvm.normalize_mod(get_family("uniform").compute(spec)) for spec in (shared, own)}

    def schedule(spec, seed):
        return untuned_schedule(_tvm.Schedule(mods[spec], seed=seed + 1), spec, "cpu", hw)

    # Build the schedules before the start, so that the writers overlap on the database only.
    plan = []
    for seed in range(6):  # every writer commits these (same traces): stored once
        plan.append((shared, schedule(shared, seed), [1e-5 * (seed + 1)], STATUS_OK))
    for seed in range(6):  # this writer's own traces of the shared workload
        plan.append((shared, schedule(shared, 1000 * (index + 1) + seed), [2e-5 + 1e-7 * seed],
                     STATUS_OK))
    for seed in range(6):  # this writer's own workload
        status = STATUS_BUILD_ERROR if seed == 5 else STATUS_OK
        plan.append((own, schedule(own, seed), None if seed == 5 else [3e-5], status))
    (Path(barrier) / f"ready.{index}").touch()
    while not (Path(barrier) / "go").exists():
        time.sleep(0.002)
    report = {}
    for url in urls.split(","):
        storage = Storage(url)
        database = SqlDatabase(storage, target)
        committed = []
        for spec, sch, secs, status in plan:
            workload = database.commit_workload(mods[spec])
            args_info = _tvm.ms.arg_info.ArgInfo.from_prim_func(mods[spec]["main"])
            record = _tvm.TuningRecord(sch.trace, workload, secs, target, args_info)
            new_id = database.commit_measurement(record, status, None if secs else "made to fail")
            info = database.register(mods[spec])
            trace_json, *_ = record.as_json()
            committed.append({"workload": info.digest, "new": new_id is not None,
                              "trace": json.dumps(trace_json, sort_keys=True,
                                                  separators=(",", ":"))})
        report[url] = {"committed": committed, "retries": storage.retries}
    with open(out_path, "w") as out:
        json.dump(report, out)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
