"""Moving records between databases and files: JSON lines, MetaSchedule's JSONDatabase, merge.

JSON lines (``.jsonl``): a header line, then every workload followed by its records::

    {"format": "qcompile-tuning-records", "version": 1, "schema": "0002"}
    {"type": "workload", "digest": ..., "name": ..., "spec_json": ..., "mod_json": ..., ...}
    {"type": "record", "workload": <workload digest>, "digest": ..., "status": "ok",
     "run_secs": [...], "trace_json": ..., "host": ..., "user": ..., "created_at": ISO, ...}

Every field of the database is kept (provenance and failures included), so export then import
into an empty database gives the same records; importing twice stores them once (digests).

MetaSchedule's JSONDatabase is two files: ``database_workload.json`` (a line per workload:
``[structural hash, base64 IRModule]``) and ``database_tuning_record.json`` (a line per record:
``[workload line number, [trace, run_secs, target, args_info]]``). Export writes successful
records only (MetaSchedule has no failure status); import keeps the workloads that are qcompile
kernels (their PrimFunc names its spec) and skips others, saying how many.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from qcompile.errors import DatabaseError
from tuning_db.models import STATUS_OK
from tuning_db.schema import HEAD
from tuning_db.storage import Provenance, RecordInfo, Storage, WorkloadInfo

FORMAT = "qcompile-tuning-records"
VERSION = 1
MS_WORKLOADS = "database_workload.json"
MS_RECORDS = "database_tuning_record.json"

_WORKLOAD_FIELDS = ("digest", "name", "family", "spec_digest", "spec_json", "target_key",
                    "target_json", "mod_hash", "mod_json")
_PROVENANCE_FIELDS = ("host", "device_model", "tvm_version", "tvm_ffi_version",
                      "qcompile_version", "user")


@dataclass
class TransferCount:
    """What an import, export or merge did."""

    workloads: int = 0
    records: int = 0
    duplicates: int = 0  # records already present (same digest): stored once
    skipped: int = 0  # workloads or records that could not be taken, with reasons below
    reasons: list[str] | None = None

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons = (self.reasons or []) + [reason]

    def line(self) -> str:
        text = f"{self.workloads} workloads, {self.records} records"
        if self.duplicates:
            text += f" ({self.duplicates} already there)"
        if self.skipped:
            text += f"; skipped {self.skipped}: " + "; ".join(sorted(set(self.reasons or []))[:3])
        return text


def _selected(storage: Storage, name: str | None) -> list[WorkloadInfo]:
    return [w for w in storage.workloads() if name is None or name in w.name]


def _copy_workload(dest: Storage, info: WorkloadInfo | dict) -> WorkloadInfo:
    values = {f: (info[f] if isinstance(info, dict) else getattr(info, f))
              for f in _WORKLOAD_FIELDS}
    stored = dest.get_or_create_workload(**values)
    if stored.mod_hash != values["mod_hash"]:
        raise DatabaseError(
            f"workload {values['name']} ({values['digest'][:12]}) exists in "
            f"{dest.display_url} with different TensorIR (structural hash {stored.mod_hash} != "
            f"{values['mod_hash']}): the two databases disagree on its compute definition")
    return stored


def _copy_record(dest: Storage, workload_id: int, record: RecordInfo | dict,
                 origin: str) -> int | None:
    get = record.get if isinstance(record, dict) else lambda f: getattr(record, f)
    created = get("created_at")
    if isinstance(created, str):
        created = datetime.fromisoformat(created)
    provenance = Provenance(**{f: get(f) or "" for f in _PROVENANCE_FIELDS})
    return dest.add_record(
        workload_id=workload_id, digest=get("digest"), status=get("status"),
        run_secs=get("run_secs"), trace_json=get("trace_json"),
        args_info_json=get("args_info_json"), target_json=get("target_json"),
        error=get("error"), provenance=provenance, origin=origin, created_at=created)


# ---- JSON lines --------------------------------------------------------------------------------


def export_jsonl(storage: Storage, path: str | Path, *, name: str | None = None) -> TransferCount:
    """Write the workloads (whose name contains ``name``) and all their records to ``path``."""
    count = TransferCount()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        out.write(json.dumps({"format": FORMAT, "version": VERSION, "schema": HEAD}) + "\n")
        for info in _selected(storage, name):
            line = {"type": "workload", **{f: getattr(info, f) for f in _WORKLOAD_FIELDS}}
            out.write(json.dumps(line) + "\n")
            count.workloads += 1
            for record in storage.records(info.id):
                out.write(json.dumps({
                    "type": "record", "workload": info.digest, "digest": record.digest,
                    "status": record.status, "run_secs": record.run_secs, "error": record.error,
                    "trace_json": record.trace_json, "args_info_json": record.args_info_json,
                    "target_json": record.target_json, "origin": record.origin,
                    "created_at": record.created_at.isoformat() if record.created_at else None,
                    **{f: getattr(record, f) for f in _PROVENANCE_FIELDS},
                }) + "\n")
                count.records += 1
    tmp.replace(path)
    return count


def import_jsonl(storage: Storage, path: str | Path) -> TransferCount:
    """Insert-or-get every workload of a JSON lines file and add its records (idempotent)."""
    path = Path(path)
    count = TransferCount()
    workloads: dict[str, WorkloadInfo] = {}
    with open(path) as lines:
        header = json.loads(lines.readline() or "{}")
        if header.get("format") != FORMAT:
            raise DatabaseError(f"{path}: not a qcompile JSON lines export (its first line must "
                                f"carry \"format\": \"{FORMAT}\")")
        if header.get("version") != VERSION:
            raise DatabaseError(f"{path}: export format version {header.get('version')}; this "
                                f"qcompile reads version {VERSION}")
        for number, text in enumerate(lines, 2):
            if not text.strip():
                continue
            line = json.loads(text)
            if line.get("type") == "workload":
                workloads[line["digest"]] = _copy_workload(storage, line)
                count.workloads += 1
            elif line.get("type") == "record":
                workload = workloads.get(line["workload"])
                if workload is None:
                    raise DatabaseError(f"{path}:{number}: record of workload "
                                        f"{line['workload'][:12]} before that workload's line")
                if _copy_record(storage, workload.id, line, f"import {path.name}") is None:
                    count.duplicates += 1
                count.records += 1
            else:
                raise DatabaseError(f"{path}:{number}: unknown line type {line.get('type')!r}")
    return count


# ---- MetaSchedule's JSONDatabase ----------------------------------------------------------------


def export_metaschedule(storage: Storage, directory: str | Path, *,
                        name: str | None = None) -> TransferCount:
    """Write a MetaSchedule JSONDatabase (the two files) of the successful records."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    count = TransferCount()
    with open(out / MS_WORKLOADS, "w") as wl_file, open(out / MS_RECORDS, "w") as rec_file:
        for info in _selected(storage, name):
            records = [r for r in storage.records(info.id) if r.status == STATUS_OK]
            wl_file.write(json.dumps(json.loads(info.mod_json)) + "\n")
            for record in records:
                rec_file.write(json.dumps([count.workloads, [
                    json.loads(record.trace_json), record.run_secs,
                    json.loads(record.target_json), json.loads(record.args_info_json)]]) + "\n")
                count.records += 1
            count.workloads += 1
    return count


def metaschedule_paths(path: str | Path) -> tuple[Path, Path]:
    """The two files of a JSONDatabase given its directory or either file."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    workloads, records = directory / MS_WORKLOADS, directory / MS_RECORDS
    if not workloads.is_file() or not records.is_file():
        raise DatabaseError(f"{path}: a MetaSchedule JSONDatabase needs both {MS_WORKLOADS} and "
                            f"{MS_RECORDS} in {directory}")
    return workloads, records


def import_metaschedule(storage: Storage, path: str | Path,
                        provenance: Provenance | None = None) -> TransferCount:
    """Import a MetaSchedule JSONDatabase (a directory, or either of its files).

    Workloads that are not qcompile kernels are skipped (their PrimFunc carries no spec). A
    record's target comes from the record (MetaSchedule keys workloads by IRModule only), so one
    MetaSchedule workload may become several here, one per target. Records get ``provenance``
    (default: the importing host's versions, no host or user: the file does not say).
    """
    from qcompile import _tvm
    from qcompile.kernels import spec_from_dict
    from targets import canonical_json, target_key
    from tuning_db.database import record_digest, spec_of, workload_digest

    workloads_path, records_path = metaschedule_paths(path)
    if provenance is None:
        provenance = Provenance(tvm_version=_tvm.TVM_VERSION, tvm_ffi_version=_tvm.TVM_FFI_VERSION)
    count = TransferCount()
    mods: list[tuple[str, dict, object] | None] = []
    for text in workloads_path.read_text().splitlines():
        if not text.strip():
            continue
        wl_json = json.loads(text)
        workload = _tvm.Workload.from_json(wl_json)
        try:
            spec = spec_from_dict(spec_of(workload.mod))
        except DatabaseError:
            mods.append(None)
            count.skip("workloads that are not qcompile kernels")
            continue
        mods.append((json.dumps(wl_json), spec, _tvm.structural_hash(workload.mod)))
    stored: dict[str, WorkloadInfo] = {}
    origin = f"import {workloads_path.parent.name}/{workloads_path.name}"
    for text in records_path.read_text().splitlines():
        if not text.strip():
            continue
        index, (trace, run_secs, target, args_info) = json.loads(text)
        if index >= len(mods):
            raise DatabaseError(f"{records_path}: a record names workload line {index}, but "
                                f"{workloads_path.name} has {len(mods)} lines")
        if mods[index] is None:
            count.skip("records of workloads that are not qcompile kernels")
            continue
        mod_json, spec, mod_hash = mods[index]
        key = target_key(target)
        digest = workload_digest(spec.digest(), key)
        if digest not in stored:
            stored[digest] = _copy_workload(storage, dict(
                digest=digest, name=spec.name(), family=spec.family, spec_digest=spec.digest(),
                spec_json=spec.to_json(), target_key=key, target_json=canonical_json(target),
                mod_hash=mod_hash, mod_json=mod_json))
            count.workloads += 1
        secs = [float(s) for s in run_secs or []]
        if not secs or max(secs) >= 1e9:  # MetaSchedule's mark of a failed candidate
            count.skip("failed MetaSchedule records (no latency, no error text)")
            continue
        trace_text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
        new = storage.add_record(
            workload_id=stored[digest].id, digest=record_digest(digest, trace_text),
            status=STATUS_OK, run_secs=secs, trace_json=trace_text,
            args_info_json=json.dumps(args_info), target_json=canonical_json(target),
            provenance=provenance, origin=origin)
        count.records += 1
        count.duplicates += new is None
    return count


# ---- merge --------------------------------------------------------------------------------------


def merge(source: Storage, dest: Storage, *, name: str | None = None) -> TransferCount:
    """Copy every workload and record of ``source`` into ``dest`` (idempotent: digests)."""
    count = TransferCount()
    origin = f"merge {source.display_url}"
    for info in _selected(source, name):
        stored = _copy_workload(dest, info)
        count.workloads += 1
        for record in source.records(info.id):
            if _copy_record(dest, stored.id, record, origin) is None:
                count.duplicates += 1
            count.records += 1
    return count
