"""The tuning database's view of one kernel spec on one target.

The database (tuning_db, a floor below this one) stores digests and JSON and never parses a
spec: this module hands it what it cannot know by itself, the workload's identity and the
check our design spaces put on every stored trace before TVM reads it
(:func:`qcompile.trust.traces.check_record_trace`: records are refused before replay).

>>> database = workload_database(storage, spec, target, readers=layers.readers)  # doctest: +SKIP
>>> database.best(mod)                                                          # doctest: +SKIP
"""

from __future__ import annotations

from qcompile import _tvm
from qcompile.kernels.base import KernelSpec
from qcompile.trust.traces import check_record_trace, target_kind_of
from targets import target_key
from tuning_db.database import RecordCheck, SqlDatabase, WorkloadIdentity
from tuning_db.storage import Provenance, Storage


def workload_identity(spec: KernelSpec, target) -> WorkloadIdentity:
    """``spec`` on ``target`` (a ``tvm.target.Target``) as the database keys and stores it."""
    return WorkloadIdentity.on_target(
        name=spec.name(), family=spec.family, spec_digest=spec.digest(),
        spec_json=spec.to_json(), target_key=target_key(_tvm.target_dict(target)))


def record_check(spec: KernelSpec, target) -> RecordCheck:
    """The check of a stored trace of ``spec`` on ``target``'s kind: what our design spaces
    could emit (the policy is derived on first use and cached per spec and target kind)."""
    kind = target_kind_of(target)

    def check(trace: str | list, digest: str) -> None:
        check_record_trace(trace, spec, kind, digest=digest)

    return check


def workload_database(storage: Storage, spec: KernelSpec, target, *,
                      provenance: Provenance | None = None, readers: list[Storage] | None = None,
                      sealer=None) -> SqlDatabase:
    """A :class:`~tuning_db.database.SqlDatabase` for ``spec`` on ``target``: writes go to
    ``storage``, lookups read ``readers`` (default ``[storage]``) and skip refused records.

    Parameters
    ----------
    storage : Storage
    spec : KernelSpec
    target : tvm.target.Target
    provenance : Provenance, optional
        Stored on every record committed (default: this host, user and versions).
    readers : list of Storage, optional
        The lookup order (the shared database, then the local one).
    sealer : qcompile.trust.seals.Sealer, optional
        Seals every successful measurement committed (tuning).
    """
    return SqlDatabase(storage, target, workload_identity(spec, target),
                       record_check(spec, target), provenance=provenance, readers=readers,
                       sealer=sealer)
