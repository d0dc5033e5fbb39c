"""Records as files: JSON lines and MetaSchedule's JSONDatabase, read into plain line dicts and
written from a database. Nothing here trusts what it reads: the lines go to
:mod:`qcompile.trust.records`, which validates all of them before one transaction stores them.

JSON lines (``.jsonl``): a header line, then every workload followed by its records, each
followed by its later measurements::

    {"format": "qcompile-tuning-records", "version": 2, "schema": "0003"}
    {"type": "workload", "digest": ..., "name": ..., "spec_json": ..., "target_json": ..., ...}
    {"type": "record", "workload": <workload digest>, "digest": ..., "status": "ok",
     "run_secs": [...], "trace_json": ..., "host": ..., "user": ..., "created_at": ISO,
     "claimed": false, "seal": ..., "other_load": ..., ...}
    {"type": "measurement", "record": <record digest>, "digest": ..., "purpose": "verify",
     "run_secs": [...], "device_model": ..., "seal": ..., ...}

Version 1 files (no measurements, seals or loads) still import. MetaSchedule's JSONDatabase is
two files: ``database_workload.json`` (a line per workload: ``[structural hash, base64
IRModule]``) and ``database_tuning_record.json`` (a line per record: ``[workload line, [trace,
run_secs, target, args_info]]``). Its IRModules are never deserialized: the kernel spec is read
out of the module's JSON as text, and the TensorIR is rebuilt from the spec.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qcompile.errors import DatabaseError
from tuning_db.models import STATUS_OK
from tuning_db.schema import HEAD
from tuning_db.storage import Storage, WorkloadInfo
from tuning_db.url import redact_origin

FORMAT = "qcompile-tuning-records"
VERSION = 2
READABLE_VERSIONS = (1, 2)
MS_WORKLOADS = "database_workload.json"
MS_RECORDS = "database_tuning_record.json"
#: The PrimFunc attribute that names a workload's kernel spec (qcompile.kernels.base.SPEC_ATTR).
SPEC_ATTR = "qcompile.spec"
#: The longest line read from a file (a large workload's IRModule is a few hundred KiB).
MAX_LINE_BYTES = 16 << 20

WORKLOAD_FIELDS = ("digest", "name", "family", "spec_digest", "spec_json", "target_key",
                   "target_json", "mod_hash", "mod_json")
PROVENANCE_FIELDS = ("host", "device_model", "tvm_version", "tvm_ffi_version",
                     "qcompile_version", "user")
MEASUREMENT_FIELDS = ("digest", "purpose", "run_secs", "other_load", "host", "device_model",
                      "user", "tvm_version", "qcompile_version", "claimed", "seal")


@dataclass
class TransferCount:
    """What an import, export or merge did."""

    workloads: int = 0
    records: int = 0
    duplicates: int = 0  # records already present (same digest): stored once
    measurements: int = 0
    skipped: int = 0  # what a MetaSchedule file holds that is not ours to take, with reasons
    reasons: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons.append(reason)

    def line(self) -> str:
        text = f"{self.workloads} workloads, {self.records} records"
        if self.duplicates:
            text += f" ({self.duplicates} already there)"
        if self.measurements:
            text += f", {self.measurements} measurements"
        if self.skipped:
            text += f"; skipped {self.skipped}: " + "; ".join(sorted(set(self.reasons))[:3])
        return text


def _selected(storage: Storage, name: str | None) -> list[WorkloadInfo]:
    return [w for w in storage.workloads() if name is None or name in w.name]


# ---- a database as lines (export, merge) -------------------------------------------------------


def database_lines(storage: Storage, *, name: str | None = None) -> Iterator[dict]:
    """Every workload (whose name contains ``name``), record and measurement of ``storage`` as
    the line dicts of a JSON lines export."""
    for info in _selected(storage, name):
        yield {"type": "workload", **{f: getattr(info, f) for f in WORKLOAD_FIELDS}}
        records = storage.records(info.id)
        measurements = storage.measurements([r.id for r in records])
        for record in records:
            yield {
                "type": "record", "workload": info.digest, "digest": record.digest,
                "status": record.status, "run_secs": record.run_secs, "error": record.error,
                "trace_json": record.trace_json, "args_info_json": record.args_info_json,
                "target_json": record.target_json, "origin": record.origin,
                "created_at": record.created_at.isoformat() if record.created_at else None,
                "claimed": record.claimed, "seal": record.seal, "other_load": record.other_load,
                **{f: getattr(record, f) for f in PROVENANCE_FIELDS},
            }
            for m in measurements[record.id]:
                yield {"type": "measurement", "record": record.digest,
                       "created_at": m.created_at.isoformat() if m.created_at else None,
                       **{f: getattr(m, f) for f in MEASUREMENT_FIELDS}}


def export_jsonl(storage: Storage, path: str | Path, *, name: str | None = None) -> TransferCount:
    """Write the workloads (whose name contains ``name``), their records and measurements to
    ``path`` (:func:`write_jsonl`)."""
    return write_jsonl(path, database_lines(storage, name=name))


def write_jsonl(path: str | Path, lines: Iterable[dict], *,
                header: dict | None = None) -> TransferCount:
    """Write a JSON lines export of ``lines`` (:func:`database_lines`' dicts) to ``path``, written
    whole, then renamed into place; ``header`` adds keys to the header line (a record pack's).
    Origins leave with a URL's secrets removed, whatever an older database holds."""
    count = TransferCount()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        out.write(json.dumps({"format": FORMAT, "version": VERSION, "schema": HEAD,
                              **(header or {})}) + "\n")
        for line in lines:
            if line["type"] == "record":
                line["origin"] = redact_origin(line["origin"] or "")
                count.records += 1
            elif line["type"] == "workload":
                count.workloads += 1
            else:
                count.measurements += 1
            out.write(json.dumps(line) + "\n")
    tmp.replace(path)
    return count


# ---- JSON lines in ------------------------------------------------------------------------------


def _open(path: Path):
    try:
        return open(path, "rb")
    except OSError as error:
        raise DatabaseError(f"cannot read {path}: {error.strerror or error}") from None


def _checked_header(handle, path: Path) -> dict:
    """The header line of the export open in ``handle``; DatabaseError when it is not an export
    of a version this qcompile reads."""
    header = _json_line(handle.readline(MAX_LINE_BYTES + 1))
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DatabaseError(f"{path}: not a qcompile JSON lines export (its first line must "
                            f"carry \"format\": \"{FORMAT}\")")
    if header.get("version") not in READABLE_VERSIONS:
        raise DatabaseError(f"{path}: export format version {header.get('version')!r}; this "
                            f"qcompile reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    return header


def read_header(path: str | Path) -> dict:
    """The header line of a JSON lines export (checked as :func:`read_jsonl` checks it)."""
    path = Path(path)
    with _open(path) as handle:
        return _checked_header(handle, path)


def read_jsonl(path: str | Path) -> Iterator[tuple[str, object]]:
    """(where, parsed JSON) for every line after the header of a JSON lines export; a line that
    is not JSON comes as (where, None). Raises DatabaseError when the file is not an export of
    a version this qcompile reads."""
    path = Path(path)
    with _open(path) as handle:
        _checked_header(handle, path)
        for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), 2):
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES:
                yield f"{path.name}:{number}", None
                handle.readline()  # skip the rest of that line
                continue
            yield f"{path.name}:{number}", _json_line(raw)


def _json_line(raw: bytes) -> object:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


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


def spec_json_of_workload(workload_json: object) -> str | None:
    """The kernel spec a MetaSchedule workload line names (its PrimFunc's ``qcompile.spec``
    attribute), read from the module's serialized JSON as text, or None when it names none.

    The IRModule is never deserialized: the base64 payload is a short header then TVM's JSON
    graph, whose nodes are plain JSON; the attribute is a map entry whose key node is the
    string ``qcompile.spec``.
    """
    if not (isinstance(workload_json, list) and len(workload_json) == 2
            and isinstance(workload_json[1], str)):
        return None
    try:
        raw = base64.b64decode(workload_json[1], validate=True)
        graph = json.loads(raw[raw.index(b"{"):].decode("utf-8"))
        nodes = graph["nodes"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(nodes, list):
        return None

    def string(index):
        if isinstance(index, int) and 0 <= index < len(nodes) and isinstance(nodes[index], dict) \
                and nodes[index].get("type") == "ffi.String":
            data = nodes[index].get("data")
            return data if isinstance(data, str) else None
        return None

    for node in nodes:
        if isinstance(node, dict) and node.get("type") == "ffi.Map" \
                and isinstance(node.get("data"), list):
            pairs = node["data"]
            for key, value in zip(pairs[::2], pairs[1::2], strict=False):
                if string(key) == SPEC_ATTR:
                    return string(value)
    return None


def read_metaschedule(path: str | Path, count: TransferCount) -> Iterator[tuple[str, object]]:
    """A MetaSchedule JSONDatabase as (where, line dict) pairs in the JSON lines form: a
    workload line per qcompile workload (spec and target; its TensorIR is rebuilt by the
    checker), a record line per successful record. Workloads that are not qcompile kernels and
    failed MetaSchedule records are skipped and counted in ``count``."""
    workloads_path, records_path = metaschedule_paths(path)
    specs: list[tuple[str, str] | None] = []
    for text in workloads_path.read_bytes().splitlines():
        if not text.strip():
            continue
        line = _json_line(text)
        spec_json = spec_json_of_workload(line)
        if spec_json is None:
            specs.append(None)
            count.skip("workloads that are not qcompile kernels")
            continue
        specs.append((spec_json, str(line[0])))
    emitted: set[tuple[int, str]] = set()
    for number, text in enumerate(records_path.read_bytes().splitlines(), 1):
        if not text.strip():
            continue
        where = f"{records_path.name}:{number}"
        line = _json_line(text)
        if not (isinstance(line, list) and len(line) == 2 and isinstance(line[0], int)
                and isinstance(line[1], list) and len(line[1]) == 4):
            yield where, None
            continue
        index, (trace, run_secs, target, args_info) = line
        if not 0 <= index < len(specs):
            yield where, {"type": "invalid", "reason": f"names workload line {index}, but "
                          f"{workloads_path.name} has {len(specs)} lines"}
            continue
        if specs[index] is None:
            count.skip("records of workloads that are not qcompile kernels")
            continue
        if not isinstance(run_secs, list) or not run_secs or any(
                not isinstance(s, int | float) or s >= 1e9 for s in run_secs):
            count.skip("failed MetaSchedule records (no latency, no error text)")
            continue
        spec_json, mod_hash = specs[index]
        target_text = json.dumps(target, sort_keys=True, separators=(",", ":"))
        key = (index, target_text)
        if key not in emitted:  # one of ours per (workload, target): MetaSchedule has one
            emitted.add(key)
            yield where, {"type": "workload", "digest": f"ms:{index}:{target_text}",
                          "spec_json": spec_json, "target_json": target_text,
                          "mod_hash": mod_hash}
        yield where, {"type": "record", "workload": f"ms:{index}:{target_text}",
                      "status": STATUS_OK, "run_secs": run_secs,
                      "trace_json": json.dumps(trace), "args_info_json": json.dumps(args_info),
                      "target_json": target_text}
