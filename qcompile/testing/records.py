"""Real tuning records without a tuning run: our design space's traces with fixed tiles,
committed with chosen latencies (for database, import and trust tests)."""

from __future__ import annotations

import targets
from tuning_db.models import STATUS_BUILD_ERROR, STATUS_OK

#: (n_blk, n_reg) of the uniform CPU space's register-tile sketch, by index: 8 distinct traces.
TILES = [(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (1, 8), (2, 8)]


def uniform_trace(spec, index: int, mod=None):
    """The trace of the uniform CPU space's register-tile sketch with tiles ``TILES[index]``,
    on ``spec``'s compute (``mod``, default the normalized compute): a Schedule."""
    from qcompile import _tvm
    from schedules.cpu import uniform
    from schedules.variants import compute_for

    mod = mod or _tvm.normalize_mod(compute_for(spec, "cpu"))
    n_blk, n_reg = TILES[index]
    return uniform.register_tile(_tvm.Schedule(mod), spec, targets.get("avx2").hardware(),
                                 {"n_blk": n_blk, "n_reg": n_reg})


def commit_records(database, spec, secs_by_tile: dict[int, list[float] | None]):
    """Commit real records of ``spec`` (uniform, CPU) through ``database`` (a SqlDatabase of
    ``spec``, ``qcompile.trust.workloads.workload_database``): tile index -> run times, None for
    a build failure. Returns the workload's module."""
    from qcompile import _tvm
    from schedules.variants import compute_for

    mod = _tvm.normalize_mod(compute_for(spec, "cpu"))
    workload = database.commit_workload(mod)
    for index, secs in secs_by_tile.items():
        sch = uniform_trace(spec, index, mod)
        args_info = _tvm.ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        record = _tvm.TuningRecord(sch.trace, workload, secs, database.target, args_info)
        status = STATUS_OK if secs else STATUS_BUILD_ERROR
        database.commit_measurement(record, status, None if secs else "no")
    return mod
