"""One of the concurrent writers of tests/db/test_concurrency.py (run as a script).

    python tests/db/concurrent_writer.py URLS INDEX BARRIER_DIR OUT_JSON

Prepares its records, writes BARRIER_DIR/ready.INDEX and waits for BARRIER_DIR/go (so that all
writers start together, whatever their import times), opens each database of URLS in turn
(comma-separated; empty ones: the writers race to create the schema), and commits, through the
MetaSchedule database view that tuning uses, real tuning records (traces of schedules from our
design space) of two workloads: one every writer shares, and one of its own. The shared
workload gets records every writer commits (the same traces) and records some writers share.
Writes what it committed to each, to OUT_JSON.
"""

import json
import sys
import time

from schedules.variants import compute_for


def main(urls: str, index: int, barrier: str, out_path: str) -> None:
    from pathlib import Path

    import targets
    from qcompile import _tvm
    from qcompile.kernels import UniformSpec
    from qcompile.trust.workloads import workload_database
    from schedules.cpu import uniform
    from tuning_db import STATUS_BUILD_ERROR, STATUS_OK, Storage
    from tuning_db.database import record_json

    preset = targets.get("avx2")
    hw = preset.hardware(cores=2)
    target = _tvm.Target(preset.tvm_target(hw))
    shared = UniformSpec(k=128, n=64, bits=4, group_size=32)
    own = UniformSpec(k=128, n=64 + 16 * (index + 1), bits=4, group_size=32)
    mods = {spec: _tvm.normalize_mod(compute_for(spec, "cpu")) for spec in (shared, own)}

    tiles = [(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (1, 8), (2, 8)]

    def schedule(spec, choice):
        n_blk, n_reg = tiles[choice]
        return uniform.register_tile(_tvm.Schedule(mods[spec]), spec, hw,
                                     {"n_blk": n_blk, "n_reg": n_reg})

    # Build the schedules before the start, so that the writers overlap on the database only.
    plan = []
    for choice in range(4):  # every writer commits these (same traces): stored once
        plan.append((shared, schedule(shared, choice), [1e-5 * (choice + 1)], STATUS_OK))
    for choice in (4 + index % 4, 4 + (index + 1) % 4):  # shared by some writers only
        plan.append((shared, schedule(shared, choice), [2e-5], STATUS_OK))
    for choice in range(6):  # this writer's own workload
        status = STATUS_BUILD_ERROR if choice == 5 else STATUS_OK
        plan.append((own, schedule(own, choice), None if choice == 5 else [3e-5], status))
    (Path(barrier) / f"ready.{index}").touch()
    while not (Path(barrier) / "go").exists():
        time.sleep(0.002)
    report = {}
    for url in urls.split(","):
        storage = Storage(url)
        databases = {spec: workload_database(storage, spec, target) for spec in mods}
        committed = []
        for spec, sch, secs, status in plan:
            database = databases[spec]
            workload = database.commit_workload(mods[spec])
            args_info = _tvm.ms.arg_info.ArgInfo.from_prim_func(mods[spec]["main"])
            record = _tvm.TuningRecord(sch.trace, workload, secs, target, args_info)
            new_id = database.commit_measurement(record, status, None if secs else "made to fail")
            info = database.register(mods[spec])
            trace_json, *_ = record_json(record)
            committed.append({"workload": info.digest, "new": new_id is not None,
                              "trace": json.dumps(trace_json, sort_keys=True,
                                                  separators=(",", ":"))})
        report[url] = {"committed": committed, "retries": storage.retries}
    with open(out_path, "w") as out:
        json.dump(report, out)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
