"""MetaSchedule's database interface over :class:`tuning_db.storage.Storage`.

:class:`SqlDatabase` is a ``PyDatabase``: MetaSchedule's tuner commits workloads and records
through it, its search strategy seeds from its top-k, and ``compile_tir``/``query_schedule`` read
the best record back. One instance serves one workload on one target: MetaSchedule's
``commit_workload(mod)`` says nothing of either, and here a workload is the pair (kernel spec,
target).

The database never parses a spec. Its caller says what the workload is
(:class:`WorkloadIdentity`: digests, a name and the spec's JSON, stored as given) and how a
stored record's trace is checked before TVM reads it (a :data:`RecordCheck`, built by
``qcompile.trust.workloads`` from our design spaces). ``commit_workload(mod)`` stores the
module's structural hash, and every lookup checks it: records tuned on other TensorIR are
never answered.

Lookups respect the target: ``query_tuning_record(mod, target)`` answers only for this view's
target (MetaSchedule's own databases ignore it, primer G5), and the TVM version: only records
measured with this TVM's major.minor series count, since a trace from another series may not
replay.

Lookups read every layer (:class:`tuning_db.layers.Layers`: the shared database, then the local
one) and rank their records together; writes go to one storage.
"""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from qcompile import _tvm
from qcompile._tvm import TuningRecord, Workload, derived_object, ms
from qcompile._version import __version__
from qcompile.errors import DatabaseError, RecordRefused
from targets import canonical_json, target_key
from targets.host import cpu_model, hostname
from tuning_db.models import STATUS_OK, STATUS_RUN_ERROR
from tuning_db.storage import (
    Provenance,
    RecordInfo,
    Storage,
    WorkloadInfo,
    record_digest,
    workload_digest,
)

#: MetaSchedule marks failed candidates with this run time; we store a status instead.
_FAILED_RUN_SECS = 1e9

#: ``check(trace, digest)``: returns when the record's trace (its stored JSON text, or that JSON
#: parsed) may be replayed, raises :class:`~qcompile.errors.RecordRefused` naming the record
#: (``digest``) and the rule otherwise.
RecordCheck = Callable[[str | list, str], None]

log = logging.getLogger(__name__)

__all__ = [
    "RecordCheck",
    "SqlDatabase",
    "WorkloadIdentity",
    "default_provenance",
    "record_digest",
    "record_json",
    "tvm_series",
    "workload_digest",
]


@dataclass(frozen=True)
class WorkloadIdentity:
    """What the database stores of a workload besides its TensorIR: keys and JSON, never parsed.

    Attributes
    ----------
    digest : str
        The workload's key: :func:`workload_digest` of the spec digest and the target key.
    name : str
        The spec's name (``uniform_b4_g128_k4096_n4096_m1_f32``).
    family : str
    spec_digest : str
    spec_json : str
        The spec as JSON (its ``to_json()``): what import, merge and ``db verify`` read back.
    """

    digest: str
    name: str
    family: str
    spec_digest: str
    spec_json: str

    @classmethod
    def on_target(cls, *, name: str, family: str, spec_digest: str, spec_json: str,
                  target_key: str) -> WorkloadIdentity:
        """The identity of a spec on the target whose key (``targets.target_key``) is given."""
        return cls(digest=workload_digest(spec_digest, target_key), name=name, family=family,
                   spec_digest=spec_digest, spec_json=spec_json)


def tvm_series(version: str | None = None) -> str:
    """A TVM version's major.minor ("0.27"): records of one series replay on each other."""
    return ".".join((version or _tvm.TVM_VERSION).split(".")[:2])


def default_provenance() -> Provenance:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return Provenance(host=hostname(), device_model=cpu_model(), tvm_version=_tvm.TVM_VERSION,
                      tvm_ffi_version=_tvm.TVM_FFI_VERSION, qcompile_version=__version__,
                      user=user)


def _plain_json(obj):
    """A TVM JSON-style object as plain Python, IndexMaps as their JSON strings."""
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, _tvm.IntImm | _tvm.FloatImm):
        return obj.value
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, _tvm.IndexMap):
        return _tvm.save_json(obj)
    if isinstance(obj, _tvm.Array | list | tuple):
        return [_plain_json(i) for i in obj]
    if isinstance(obj, _tvm.Map | dict):
        return {_plain_json(k): _plain_json(v) for k, v in obj.items()}
    raise TypeError(f"cannot store {type(obj).__name__} in a tuning record")


def record_json(record: TuningRecord) -> list:
    """``record.as_json()``, except that a trace's IndexMap attributes (``transform_layout``,
    as the CPU design spaces use for their weight layouts) become JSON strings, as
    ``Trace.as_json`` writes them and ``TuningRecord.from_json`` reads them back (TVM's
    ``TuningRecord.as_json`` raises on them)."""
    return _plain_json(_tvm.ms_ffi.TuningRecordAsJSON(record))


@derived_object
class SqlDatabase(ms.database.PyDatabase):
    """A MetaSchedule database for one workload on one target, stored in a :class:`Storage`.

    Parameters
    ----------
    storage : Storage
        Receives every write.
    target : tvm.target.Target
        The target this view tunes and answers for.
    workload : WorkloadIdentity
        The workload this view serves, keyed for ``target``.
    check : RecordCheck
        Refuses a stored trace that may not be replayed (``qcompile.trust.workloads``); a
        refused record is skipped by every lookup and never counts as a trial.
    provenance : Provenance, optional
        Stored on every record committed through this view (host, device, versions, user).
    readers : list of Storage, optional
        The lookup order (the shared database, then the local one); default ``[storage]``.
    sealer : qcompile.trust.seals.Sealer, optional
        Seals every successful measurement committed through this view (tuning); None: none.

    Every method that takes a module (``mod``, a ``Workload``'s) takes this workload's compute:
    the first one seen fixes the structural hash, and a module of other TensorIR, or a stored
    workload row of other TensorIR, raises :class:`~qcompile.errors.DatabaseError`.
    """

    def __init__(self, storage: Storage, target, workload: WorkloadIdentity,
                 check: RecordCheck, *, provenance: Provenance | None = None,
                 readers: list[Storage] | None = None, sealer=None) -> None:
        super().__init__()
        self.storage = storage
        self.readers = list(readers) if readers else [storage]
        self.target = target
        self.target_json = canonical_json(_tvm.target_dict(target))
        self.target_key = target_key(_tvm.target_dict(target))
        if workload.digest != workload_digest(workload.spec_digest, self.target_key):
            raise DatabaseError(
                f"workload {workload.name}: its digest {workload.digest[:12]} is not the key of "
                f"its spec on {self.target_json}: make it with WorkloadIdentity.on_target for "
                "this target")
        self.workload = workload
        self.check = check
        self.provenance = provenance or default_provenance()
        self.sealer = sealer
        self.tvm_series = tvm_series()
        #: The module this view serves and its structural hash (fixed by the first one seen).
        self._mod = None
        self._mod_hash: str | None = None
        self._last: tuple[object, str] | None = None  # the last module hashed, and its hash
        #: The writer's workload row (with its MetaSchedule Workload), once committed.
        self._committed: tuple[WorkloadInfo, Workload] | None = None
        #: The workload row of each reader layer, once found.
        self._found: dict[int, WorkloadInfo] = {}
        #: Records whose trace ``check`` refused, by (reader layer, record id): their one-line
        #: reasons. Lookups skip them.
        self.refused: dict[tuple[int, int], str] = {}
        self._passed: set[tuple[int, int]] = set()

    # ---- helpers ---------------------------------------------------------------------------

    def _hash_of(self, mod) -> str:
        """The structural hash of ``mod``, which must be this view's workload."""
        if self._last is not None and self._last[0] is mod:
            return self._last[1]
        mod_hash = _tvm.structural_hash(mod)
        if self._mod_hash is None:
            self._mod, self._mod_hash = mod, mod_hash
        elif mod_hash != self._mod_hash:
            raise DatabaseError(
                f"workload {self.workload.name}: this database view serves TensorIR of "
                f"structural hash {self._mod_hash}, not {mod_hash}: open one view per workload")
        self._last = (mod, mod_hash)
        return mod_hash

    def _answers_for(self, target) -> bool:
        return target is None or target_key(_tvm.target_dict(target)) == self.target_key

    def _commit(self, mod) -> tuple[WorkloadInfo, Workload]:
        mod_hash = self._hash_of(mod)
        if self._committed is None:
            workload = Workload(mod)
            w = self.workload
            info = self.storage.get_or_create_workload(
                digest=w.digest, name=w.name, family=w.family, spec_digest=w.spec_digest,
                spec_json=w.spec_json, target_key=self.target_key, target_json=self.target_json,
                mod_hash=mod_hash, mod_json=json.dumps(workload.as_json()),
            )
            _check_hash(info, mod_hash)
            self._committed = (info, workload)
        return self._committed

    def _found_in(self, layer: int, mod) -> WorkloadInfo | None:
        """This workload's row in reader ``layer``, or None (cached once found)."""
        mod_hash = self._hash_of(mod)
        if layer not in self._found:
            info = self.readers[layer].find_workload(self.workload.digest)
            if info is None:
                return None
            _check_hash(info, mod_hash)
            self._found[layer] = info
        return self._found[layer]

    def ranked(self, mod, k: int) -> list[tuple[WorkloadInfo, RecordInfo]]:
        """The ``k`` fastest successful records of ``mod`` over every layer, fastest first
        (ties go to the earlier layer; a record present in two layers counts once)."""
        found = []
        for layer in range(len(self.readers)):
            info = self._found_in(layer, mod)
            if info is None:
                continue
            for record in self._trusted_top(layer, info, k):
                found.append((record.mean_us, layer, record.id, info, record))
        found.sort(key=lambda item: item[:3])
        seen: set[str] = set()
        out = []
        for *_, info, record in found:
            if record.digest not in seen:
                seen.add(record.digest)
                out.append((info, record))
        return out[:k]

    def candidates(self, mod, k: int) -> list[tuple[Storage, WorkloadInfo, RecordInfo]]:
        """:meth:`ranked`, with the storage (layer) each record was read from."""
        by_url = {storage.display_url: storage for storage in self.readers}
        return [(by_url[record.database], info, record) for info, record in self.ranked(mod, k)]

    def _trusted_top(self, layer: int, info: WorkloadInfo, k: int) -> list[RecordInfo]:
        """The ``k`` fastest successful records of ``info`` in reader ``layer`` whose traces
        pass the check; the refused ones are skipped (and more are read in their place)."""
        limit = k
        while True:
            records = self.readers[layer].top_records(info.id, limit, self.tvm_series)
            trusted = [r for r in records if self._trusted(layer, r)]
            if len(trusted) >= k or len(records) < limit:
                return trusted[:k]
            limit = k + len(records) - len(trusted)

    def _trusted(self, layer: int, record: RecordInfo) -> bool:
        """Whether ``record``'s trace passes the check; a refused record is logged once, with
        its digest and the rule."""
        key = (layer, record.id)
        if key not in self._passed and key not in self.refused:
            try:
                self.check(record.trace_json, record.digest)
                self._passed.add(key)
            except RecordRefused as error:
                self.refused[key] = str(error)
                log.warning("%s (in %s); skipped", error, self.readers[layer].display_url)
        return key in self._passed

    def measured(self, mod) -> int:
        """Records (every status, this TVM series) of ``mod`` over every layer whose traces pass
        the check: the trials already spent (a flood of refused records buys nothing)."""
        counted: set[str] = set()  # a record copied into another layer counts once
        for layer in range(len(self.readers)):
            info = self._found_in(layer, mod)
            if info is None:
                continue
            counted.update(record.digest for record in self.readers[layer].records(info.id)
                           if (record.tvm_version == self.tvm_series
                               or record.tvm_version.startswith(f"{self.tvm_series}."))
                           and self._trusted(layer, record))
        return len(counted)

    def _to_tuning_record(self, record: RecordInfo, workload: Workload) -> TuningRecord:
        trace = json.loads(record.trace_json)
        args_info = json.loads(record.args_info_json)
        run_secs = record.run_secs if record.status == STATUS_OK else None
        return TuningRecord.from_json(
            [trace, run_secs, json.loads(record.target_json), args_info], workload
        )

    def replay(self, mod, record: RecordInfo):
        """Workload ``mod`` with ``record``'s trace replayed on it (an IRModule).

        Raises
        ------
        RecordRefused
            The check refuses the trace: it is not replayed.
        """
        self._hash_of(mod)
        self.check(record.trace_json, record.digest)
        tuning_record = TuningRecord.from_json(
            [json.loads(record.trace_json), None, _tvm.target_dict(self.target),
             json.loads(record.args_info_json)],
            Workload(mod),
        )
        sch = _tvm.Schedule(mod)
        tuning_record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch.mod

    def commit_measurement(self, record: TuningRecord, status: str,
                           error: str | None, other_load: float | None = None) -> int | None:
        """Store one measured candidate with its status (what MetaSchedule's own path lacks),
        how busy the machine was (``other_load``, cores), and the seal of :attr:`sealer`."""
        info, _ = self._commit(record.workload.mod)
        trace_json, run_secs, target_dict, args_info = record_json(record)
        trace_text = json.dumps(trace_json, sort_keys=True, separators=(",", ":"))
        secs = [float(s) for s in run_secs] if status == STATUS_OK else None
        digest = record_digest(info.digest, trace_text)
        seal = ""
        if secs and self.sealer is not None:
            seal = self.sealer.seal(digest, self.provenance.device_model, secs, "tune")
        # A trace our own tuner produced: a refusal here is a bug in a space or in the check.
        self.check(trace_json, digest)
        return self.storage.add_record(
            workload_id=info.id, digest=digest, status=status,
            run_secs=secs, trace_json=trace_text, args_info_json=json.dumps(args_info),
            target_json=canonical_json(target_dict), error=error, provenance=self.provenance,
            origin="tune", seal=seal, other_load=other_load,
        )

    def register(self, mod) -> WorkloadInfo:
        """Insert-or-get the workload row of ``mod`` in the writer.

        Plain Python (not a PyDatabase method, which MetaSchedule calls through TVM's FFI and
        whose exceptions come back as RuntimeError): call it before tuning so that a read-only
        database or a changed compute definition fails with its own error.
        """
        return self._commit(mod)[0]

    def best(self, mod) -> tuple[WorkloadInfo, RecordInfo] | None:
        """The workload and its fastest successful record over every layer (the record's
        ``database`` says which), or None."""
        ranked = self.ranked(mod, 1)
        return ranked[0] if ranked else None

    # ---- the PyDatabase interface ----------------------------------------------------------

    def has_workload(self, mod) -> bool:
        return any(self._found_in(layer, mod) is not None for layer in range(len(self.readers)))

    def commit_workload(self, mod) -> Workload:
        return self._commit(mod)[1]

    def commit_tuning_record(self, record: TuningRecord) -> None:
        secs = [float(s) for s in (record.run_secs or [])]
        failed = not secs or max(secs) >= _FAILED_RUN_SECS
        if failed:
            self.commit_measurement(record, STATUS_RUN_ERROR, "failed in MetaSchedule (no message)")
        else:
            self.commit_measurement(record, STATUS_OK, None)

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        if top_k <= 0:
            return []
        return [self._to_tuning_record(record, workload)
                for _, record in self.ranked(workload.mod, top_k)]

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """The successful records of this workload, fastest first, once a module of it was seen
        (a stored IRModule is never deserialized: the workload is our own compute, and its
        records pass :meth:`ranked`'s checks)."""
        if self._mod is None:
            return []
        workload = Workload(self._mod)
        return [self._to_tuning_record(record, workload)
                for _, record in self.ranked(self._mod, 1 << 30)]

    def query_tuning_record(self, mod, target, workload_name=None) -> TuningRecord | None:
        if not self._answers_for(target):
            return None
        ranked = self.ranked(mod, 1)
        if not ranked:
            return None
        return self._to_tuning_record(ranked[0][1], Workload(mod))

    def __len__(self) -> int:
        """Records of this workload (every status) in the writer."""
        info = self.storage.find_workload(self.workload.digest)
        return self.storage.count_records(info.id) if info is not None else 0


def _check_hash(info: WorkloadInfo, mod_hash: str) -> None:
    if info.mod_hash != mod_hash:
        raise DatabaseError(
            f"workload {info.name}: its records were tuned on different TensorIR (structural "
            f"hash {info.mod_hash} != {mod_hash}). The compute definition changed without a "
            "compute_version bump; bump it so the new kernel gets a fresh workload"
        )


@derived_object
class WorkloadSetDatabase(ms.database.PyDatabase):
    """One MetaSchedule database over several workloads (a model's layer shapes tuned as one
    job): each call goes to the :class:`SqlDatabase` view of the module it names.

    Parameters
    ----------
    views : list of (module, SqlDatabase)
        Each workload's compute and its view; the modules' structural hashes route the calls.
    """

    def __init__(self, views: list) -> None:
        super().__init__()
        self.views = [view for _, view in views]
        self._by_hash = {view._hash_of(mod): view for mod, view in views}

    def view_of(self, mod) -> SqlDatabase:
        """The view that serves ``mod``; DatabaseError for a module of none of them."""
        view = self._by_hash.get(_tvm.structural_hash(mod))
        if view is None:
            raise DatabaseError("a module of none of this job's workloads: "
                                f"{', '.join(v.workload.name for v in self.views)}")
        return view

    def commit_measurement(self, record: TuningRecord, status: str, error: str | None,
                           other_load: float | None = None) -> int | None:
        """:meth:`SqlDatabase.commit_measurement` of the record's workload."""
        return self.view_of(record.workload.mod).commit_measurement(record, status, error,
                                                                    other_load)

    # ---- the PyDatabase interface ----------------------------------------------------------

    def has_workload(self, mod) -> bool:
        return self.view_of(mod).has_workload(mod)

    def commit_workload(self, mod) -> Workload:
        return self.view_of(mod).commit_workload(mod)

    def commit_tuning_record(self, record: TuningRecord) -> None:
        self.view_of(record.workload.mod).commit_tuning_record(record)

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        return self.view_of(workload.mod).get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> list[TuningRecord]:
        return [r for view in self.views for r in view.get_all_tuning_records()]

    def query_tuning_record(self, mod, target, workload_name=None) -> TuningRecord | None:
        return self.view_of(mod).query_tuning_record(mod, target, workload_name)

    def __len__(self) -> int:
        return sum(len(view) for view in self.views)
