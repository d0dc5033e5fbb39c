"""``qcompile db verify``: measure a database's fastest records on this machine and seal them.

A team that shares a database runs this on one machine of each kind (with the team key in
``$QCOMPILE_TEAM_KEY_FILE``): every other machine of that kind then builds from those records
without timing them again (:mod:`qcompile.trust.choice`). Without a team key the seals are this
host's own, and only builds here believe them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import targets
from qcompile import _tvm
from qcompile.errors import QCompileError
from qcompile.kernels import family_of, spec_from_dict
from qcompile.machine_load import LoadMeter
from qcompile.measure import MeasurePolicy, measure_modules, measuring_provenance
from qcompile.trust.choice import Candidate, store_measurement
from qcompile.trust.seals import Sealer
from qcompile.trust.workloads import workload_database
from schedules.variants import compute_for
from tuning_db.models import PURPOSE_VERIFY
from tuning_db.storage import Storage


@dataclass(frozen=True)
class Verified:
    """What verifying one workload did (a line of the command's output)."""

    name: str
    target: str
    measured: int
    failed: int
    best_us: float | None
    #: Why the workload was not measured, when it was not.
    skipped: str = ""


def verify(storage: Storage, *, name: str | None = None, family: str | None = None,
           target: str | None = None, top: int = 3, policy=None) -> list[Verified]:
    """Measure the ``top`` fastest valid records of every workload this host can run (whose
    name contains ``name``, of ``family``, for preset ``target``) and store the sealed
    measurements (purpose "verify") in ``storage``.

    Only workloads whose target is this host's target for a preset are measured (same ISA,
    same core count): a record tuned for 16 cores says nothing about 2.
    """
    sealer = Sealer.load()
    out: list[Verified] = []
    for preset in targets.PRESETS.values():
        if target is not None and preset.name != target:
            continue
        if not preset.host_support()[0]:
            continue
        hw = preset.hardware()
        tvm_target = _tvm.Target(preset.tvm_target(hw))
        key = targets.target_key(_tvm.target_dict(tvm_target))
        provenance = measuring_provenance(preset)
        for info in storage.workloads(key):
            if (name and name not in info.name) or (family and info.family != family):
                continue
            try:
                spec = spec_from_dict(json.loads(info.spec_json))
            except (QCompileError, ValueError, TypeError) as error:
                out.append(Verified(info.name, preset.name, 0, 0, None, f"invalid spec: {error}"))
                continue
            mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
            database = workload_database(storage, spec, tvm_target)
            found = database.candidates(mod, top)
            if not found:
                out.append(Verified(info.name, preset.name, 0, 0, None, "no valid record"))
                continue
            candidates = [Candidate(s, w, r, None) for s, w, r in found]
            database.register(mod)  # our own compute's row, never a copy of a stored one
            meter = LoadMeter()
            results = measure_modules(
                [database.replay(mod, c.record) for c in candidates], tvm_target,
                policy or MeasurePolicy.for_target(
                    preset.kind, build_workers=getattr(hw, "cores", None) or 2),
                family_of(spec).measure_arguments(spec))
            load = meter.lap()
            timed = [(c, m) for c, m in zip(candidates, results, strict=True) if m.run_secs]
            for candidate, measured in timed:
                store_measurement(storage, candidate, measured, purpose=PURPOSE_VERIFY,
                                  provenance=provenance, sealer=sealer, other_load=load)
            best = min((m.mean_us for _, m in timed), default=None)
            out.append(Verified(info.name, preset.name, len(timed),
                                len(candidates) - len(timed), best))
    return out
