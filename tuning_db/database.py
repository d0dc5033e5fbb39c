"""MetaSchedule's database interface over :class:`tuning_db.storage.Storage`.

:class:`SqlDatabase` is a ``PyDatabase``: MetaSchedule's tuner commits workloads and records
through it, its search strategy seeds from its top-k, and ``compile_tir``/``query_schedule`` read
the best record back. One instance serves one target: MetaSchedule's ``commit_workload(mod)``
says nothing of the target, and here a workload is the pair (kernel spec, target).

Lookups respect the target: ``query_tuning_record(mod, target)`` only returns records of the
workload keyed by that target (MetaSchedule's own databases ignore it, primer G5), and the TVM
version: only records measured with this TVM's major.minor series count, since a trace from
another series may not replay.

Lookups read every layer (:class:`tuning_db.layers.Layers`: the shared database, then the local
one) and rank their records together; writes go to one storage.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging

import qcompile
from qcompile import _tvm
from qcompile._tvm import TuningRecord, Workload, derived_object, ms
from qcompile.errors import DatabaseError, RecordRefused
from qcompile.kernels.base import SPEC_ATTR
from qcompile.trust.traces import check_record_trace, target_kind_of
from targets import canonical_json, target_key
from targets.host import cpu_model, hostname
from tuning_db.models import STATUS_OK, STATUS_RUN_ERROR
from tuning_db.storage import Provenance, RecordInfo, Storage, WorkloadInfo

#: MetaSchedule marks failed candidates with this run time; we store a status instead.
_FAILED_RUN_SECS = 1e9

log = logging.getLogger(__name__)


def workload_digest(spec_digest: str, target_key_: str) -> str:
    """The database key of (kernel spec, target)."""
    return hashlib.sha256(f"{spec_digest}:{target_key_}".encode()).hexdigest()


def record_digest(workload_digest_: str, trace_json: str) -> str:
    """The database key of a record: its workload and its decisions."""
    return hashlib.sha256(f"{workload_digest_}:{trace_json}".encode()).hexdigest()


def spec_of(mod) -> dict:
    """The kernel spec a workload's PrimFunc carries in its attributes."""
    func = mod["main"]
    text = func.attrs.get(SPEC_ATTR) if func.attrs is not None else None
    if text is None:
        raise DatabaseError(
            f"workload has no {SPEC_ATTR!r} attribute: only qcompile compute definitions "
            "(qcompile.kernels) can be stored in the tuning database"
        )
    return json.loads(str(text))


def tvm_series(version: str | None = None) -> str:
    """A TVM version's major.minor ("0.27"): records of one series replay on each other."""
    return ".".join((version or _tvm.TVM_VERSION).split(".")[:2])


def default_provenance() -> Provenance:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return Provenance(host=hostname(), device_model=cpu_model(), tvm_version=_tvm.TVM_VERSION,
                      tvm_ffi_version=_tvm.TVM_FFI_VERSION,
                      qcompile_version=qcompile.__version__, user=user)


def _plain_json(obj):
    """A TVM JSON-style object as plain Python, IndexMaps as their JSON strings."""
    from tvm.ir import save_json
    from tvm.tirx.expr import FloatImm, IntImm
    from tvm.tirx.function import IndexMap
    from tvm_ffi import Array, Map

    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, IntImm | FloatImm):
        return obj.value
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, IndexMap):
        return save_json(obj)
    if isinstance(obj, Array | list | tuple):
        return [_plain_json(i) for i in obj]
    if isinstance(obj, Map | dict):
        return {_plain_json(k): _plain_json(v) for k, v in obj.items()}
    raise TypeError(f"cannot store {type(obj).__name__} in a tuning record")


def record_json(record: TuningRecord) -> list:
    """``record.as_json()``, except that a trace's IndexMap attributes (``transform_layout``,
    as the CPU design spaces use for their weight layouts) become JSON strings, as
    ``Trace.as_json`` writes them and ``TuningRecord.from_json`` reads them back (TVM's
    ``TuningRecord.as_json`` raises on them)."""
    from tvm.s_tir.meta_schedule import _ffi_api

    return _plain_json(_ffi_api.TuningRecordAsJSON(record))


@derived_object
class SqlDatabase(ms.database.PyDatabase):
    """A MetaSchedule database for one target, stored in a :class:`Storage`.

    Parameters
    ----------
    storage : Storage
    target : tvm.target.Target
        The target this view tunes and answers for.
    provenance : Provenance, optional
        Stored on every record committed through this view (host, device, versions, user).
    readers : list of Storage, optional
        The lookup order (the shared database, then the local one); default ``[storage]``.
        ``storage`` receives every write.
    sealer : qcompile.trust.seals.Sealer, optional
        Seals every successful measurement committed through this view (tuning); None: none.
    """

    def __init__(self, storage: Storage, target, provenance: Provenance | None = None,
                 readers: list[Storage] | None = None, sealer=None) -> None:
        super().__init__()
        self.sealer = sealer
        self.storage = storage
        self.readers = list(readers) if readers else [storage]
        self.tvm_series = tvm_series()
        self._found: dict[tuple[int, str], WorkloadInfo | None] = {}
        self.target = target
        self.target_json = canonical_json(_tvm.target_dict(target))
        self.target_key = target_key(_tvm.target_dict(target))
        self.provenance = provenance or default_provenance()
        self._workloads: dict[str, tuple[WorkloadInfo, Workload]] = {}
        #: The modules looked up through this view, by workload digest (get_all_tuning_records).
        self._seen: dict[str, object] = {}
        #: Records whose trace our design spaces could not have emitted (qcompile.trust.traces),
        #: by (reader layer, record id): their one-line reasons. Lookups skip them.
        self.refused: dict[tuple[int, int], str] = {}
        self._passed: set[tuple[int, int]] = set()

    # ---- helpers ---------------------------------------------------------------------------

    def digest_of(self, mod, target=None) -> str:
        """Workload digest of ``mod`` on ``target`` (default: this view's target)."""
        key = self.target_key if target is None else target_key(_tvm.target_dict(target))
        spec = spec_of(mod)
        from qcompile.kernels import spec_from_dict

        return workload_digest(spec_from_dict(spec).digest(), key)

    def _lookup(self, mod, target=None,
                create: bool = False) -> tuple[WorkloadInfo, Workload] | None:
        digest = self.digest_of(mod, target)
        if digest in self._workloads:
            return self._workloads[digest]
        mod_hash = _tvm.structural_hash(mod)
        if create:
            workload = Workload(mod)
            wl_json = workload.as_json()
            from qcompile.kernels import spec_from_dict

            spec = spec_from_dict(spec_of(mod))
            info = self.storage.get_or_create_workload(
                digest=digest, name=spec.name(), family=spec.family, spec_digest=spec.digest(),
                spec_json=spec.to_json(), target_key=self.target_key,
                target_json=self.target_json, mod_hash=mod_hash, mod_json=json.dumps(wl_json),
            )
        else:
            info = self.storage.find_workload(digest)
            if info is None:
                return None
            workload = Workload(mod)
        _check_hash(info, mod_hash)
        self._workloads[digest] = (info, workload)
        return info, workload

    def _found_in(self, layer: int, mod, target=None) -> WorkloadInfo | None:
        """The workload of ``mod`` in reader ``layer``, or None (cached once found)."""
        digest = self.digest_of(mod, target)
        key = (layer, digest)
        if self._found.get(key) is None:
            info = self.readers[layer].find_workload(digest)
            if info is not None:
                _check_hash(info, _tvm.structural_hash(mod))
            self._found[key] = info
        return self._found[key]

    def ranked(self, mod, k: int, target=None) -> list[tuple[WorkloadInfo, RecordInfo]]:
        """The ``k`` fastest successful records of ``mod`` over every layer, fastest first
        (ties go to the earlier layer; a record present in two layers counts once)."""
        if target is None:
            self._seen.setdefault(self.digest_of(mod), mod)
        found = []
        for layer in range(len(self.readers)):
            info = self._found_in(layer, mod, target)
            if info is None:
                continue
            for record in self._trusted_top(layer, info, k, spec_of(mod), target):
                found.append((record.mean_us, layer, record.id, info, record))
        found.sort(key=lambda item: item[:3])
        seen: set[str] = set()
        out = []
        for *_, info, record in found:
            if record.digest not in seen:
                seen.add(record.digest)
                out.append((info, record))
        return out[:k]

    def candidates(self, mod, k: int,
                   target=None) -> list[tuple[Storage, WorkloadInfo, RecordInfo]]:
        """:meth:`ranked`, with the storage (layer) each record was read from."""
        by_url = {storage.display_url: storage for storage in self.readers}
        return [(by_url[record.database], info, record)
                for info, record in self.ranked(mod, k, target)]
    def _trusted_top(self, layer: int, info: WorkloadInfo, k: int, spec: dict,
                     target=None) -> list[RecordInfo]:
        """The ``k`` fastest successful records of ``info`` in reader ``layer`` whose traces
        pass the trace check; the refused ones are skipped (and more are read in their place)."""
        limit = k
        while True:
            records = self.readers[layer].top_records(info.id, limit, self.tvm_series)
            trusted = [r for r in records if self._trusted(layer, r, spec, target)]
            if len(trusted) >= k or len(records) < limit:
                return trusted[:k]
            limit = k + len(records) - len(trusted)

    def _trusted(self, layer: int, record: RecordInfo, spec: dict, target=None) -> bool:
        """Whether ``record``'s trace is one our design spaces could emit for ``spec`` on this
        view's target kind; a refused record is logged once, with its digest and the rule."""
        key = (layer, record.id)
        if key not in self._passed and key not in self.refused:
            try:
                check_record_trace(record.trace_json, spec, target_kind_of(target or self.target),
                                   digest=record.digest)
                self._passed.add(key)
            except RecordRefused as error:
                self.refused[key] = str(error)
                log.warning("%s (in %s); skipped", error, self.readers[layer].display_url)
        return key in self._passed

    def measured(self, mod, target=None) -> int:
        """Records (every status, this TVM series) of ``mod`` over every layer whose traces pass
        the trace check: the trials already spent (a flood of refused records buys nothing)."""
        spec = spec_of(mod)
        counted: set[str] = set()  # a record copied into another layer counts once
        for layer in range(len(self.readers)):
            info = self._found_in(layer, mod, target)
            if info is None:
                continue
            counted.update(record.digest for record in self.readers[layer].records(info.id)
                           if (record.tvm_version == self.tvm_series
                               or record.tvm_version.startswith(f"{self.tvm_series}."))
                           and self._trusted(layer, record, spec, target))
        return len(counted)

    def _to_tuning_record(self, record: RecordInfo, workload: Workload) -> TuningRecord:
        trace = json.loads(record.trace_json)
        args_info = json.loads(record.args_info_json)
        run_secs = record.run_secs if record.status == STATUS_OK else None
        return TuningRecord.from_json(
            [trace, run_secs, json.loads(record.target_json), args_info], workload
        )

    def commit_measurement(self, record: TuningRecord, status: str,
                           error: str | None, other_load: float | None = None) -> int | None:
        """Store one measured candidate with its status (what MetaSchedule's own path lacks),
        how busy the machine was (``other_load``, cores), and the seal of :attr:`sealer`."""
        info, _ = self._lookup(record.workload.mod, create=True)
        trace_json, run_secs, target_dict, args_info = record_json(record)
        trace_text = json.dumps(trace_json, sort_keys=True, separators=(",", ":"))
        secs = [float(s) for s in run_secs] if status == STATUS_OK else None
        digest = record_digest(info.digest, trace_text)
        seal = ""
        if secs and self.sealer is not None:
            seal = self.sealer.seal(digest, self.provenance.device_model, secs, "tune")
        # A trace our own tuner produced: a refusal here is a bug in a space or in the check.
        check_record_trace(trace_json, spec_of(record.workload.mod), target_kind_of(self.target),
                           digest=digest)
        return self.storage.add_record(
            workload_id=info.id, digest=digest, status=status,
            run_secs=secs, trace_json=trace_text, args_info_json=json.dumps(args_info),
            target_json=canonical_json(target_dict), error=error, provenance=self.provenance,
            origin="tune", seal=seal, other_load=other_load,
        )

    def register(self, mod) -> WorkloadInfo:
        """Insert-or-get the workload of ``mod`` on this target.

        Plain Python (not a PyDatabase method, which MetaSchedule calls through TVM's FFI and
        whose exceptions come back as RuntimeError): call it before tuning so that a read-only
        database or a changed compute definition fails with its own error.
        """
        return self._lookup(mod, create=True)[0]

    def best(self, mod, target=None) -> tuple[WorkloadInfo, RecordInfo] | None:
        """The workload and its fastest successful record on ``target`` over every layer (the
        record's ``database`` says which), or None."""
        ranked = self.ranked(mod, 1, target)
        return ranked[0] if ranked else None

    # ---- the PyDatabase interface ----------------------------------------------------------

    def has_workload(self, mod) -> bool:
        return any(self._found_in(layer, mod) is not None for layer in range(len(self.readers)))

    def commit_workload(self, mod) -> Workload:
        return self._lookup(mod, create=True)[1]

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
        """The successful records of the workloads this view has been asked about in this process,
        fastest first (a stored IRModule is never deserialized: the workloads are our own
        computes, and their records pass :meth:`ranked`'s checks)."""
        out = []
        for mod in list(self._seen.values()):
            workload = Workload(mod)
            out.extend(self._to_tuning_record(record, workload)
                       for _, record in self.ranked(mod, 1 << 30))
        return out

    def query_tuning_record(self, mod, target, workload_name=None) -> TuningRecord | None:
        ranked = self.ranked(mod, 1, target)
        if not ranked:
            return None
        return self._to_tuning_record(ranked[0][1], Workload(mod))

    def __len__(self) -> int:
        return sum(self.storage.count_records(info.id)
                   for info in self.storage.workloads(self.target_key))


def _check_hash(info: WorkloadInfo, mod_hash: str) -> None:
    if info.mod_hash != mod_hash:
        raise DatabaseError(
            f"workload {info.name}: its records were tuned on different TensorIR (structural "
            f"hash {info.mod_hash} != {mod_hash}). The compute definition changed without a "
            "compute_version bump; bump it so the new kernel gets a fresh workload"
        )
