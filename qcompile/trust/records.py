"""Records that cross a trust boundary (``db import``, ``db merge``) are validated whole, then
stored in one transaction: all of them, or none with a report of what was refused and why.

Nothing a file or another database says is taken on its word:

- a workload's spec and target are parsed by the same code as the command line (the spec's
  own rules, a target one of our presets gives), its digests are recomputed from them, and its
  TensorIR is rebuilt from the spec (the file's IRModule is never read);
- a record's trace must pass :mod:`qcompile.trust.traces` and replay on that TensorIR, its
  digest is recomputed from the trace, its argument shapes must be what the replay gives, its
  target must be its workload's, an ok record's run times finite positive seconds;
- provenance (who measured, where, with what) is kept but marked claimed, and must be plain
  printable text; seals are kept (they are verified when used, :mod:`qcompile.trust.seals`);
- only hex digests ever name anything; a digest in the file that disagrees with the one
  recomputed is refused.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import targets
from qcompile.errors import RecordRefused
from qcompile.kernels import spec_from_dict
from qcompile.trust.seals import well_formed
from qcompile.trust.traces import check_record_trace
from targets import target_key
from tuning_db import transfer
from tuning_db.models import PURPOSES, STATUS_OK, STATUSES
from tuning_db.storage import (
    Provenance,
    Storage,
    measurement_digest,
    measurement_values,
    record_digest,
    record_values,
    workload_digest,
)
from tuning_db.url import redact

#: Problems listed before a refused import stops reading.
MAX_PROBLEMS = 50
#: Bounds of what a line may hold.
MAX_TEXT = {"spec_json": 4096, "target_json": 4096, "trace_json": 1 << 20,
            "args_info_json": 1 << 16, "error": 1 << 16}
MAX_RUN_SECS = 1000  # values per measurement
MAX_SECONDS = 3600.0  # one run of one kernel
MAX_CORES = 4096
_PROVENANCE_LIMITS = {"host": 255, "device_model": 255, "tvm_version": 64,
                      "tvm_ffi_version": 64, "qcompile_version": 64, "user": 128}
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ImportRefused(RecordRefused):
    """Records refused as a whole (nothing stored); ``problems`` lists every one found."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems

    def __reduce__(self):
        # rebuilt from both arguments when it crosses a process pool (a parallel build's)
        return type(self), (self.args[0], self.problems)


@dataclass(frozen=True)
class CheckedWorkload:
    """A workload rebuilt from its spec and target."""

    spec: object
    preset: object
    values: dict  # the workloads row
    mod: object  # the TensorIR, {"main": compute}

    @property
    def digest(self) -> str:
        return self.values["digest"]


def _refuse(what: str, rule: str) -> RecordRefused:
    return RecordRefused(f"{what}: {rule}")


def _text(line: dict, key: str, what: str, *, optional: bool = False) -> str | None:
    value = line.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _refuse(what, f"{key} must be a string; got {type(value).__name__}")
    if len(value) > MAX_TEXT.get(key, 1 << 16):
        raise _refuse(what, f"{key} holds {len(value)} characters; at most "
                            f"{MAX_TEXT.get(key, 1 << 16)}")
    return value


def _json(line: dict, key: str, what: str):
    text = _text(line, key, what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise _refuse(what, f"{key} is not valid JSON") from None


def _printable(value, key: str, what: str, limit: int, allow_newlines: bool = False) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _refuse(what, f"{key} must be a string; got {type(value).__name__}")
    if len(value) > limit:
        raise _refuse(what, f"{key} holds {len(value)} characters; at most {limit}")
    for char in value:
        if allow_newlines and char in "\n\t":
            continue
        if unicodedata.category(char).startswith("C"):
            raise _refuse(what, f"{key} holds the control or format character "
                                f"U+{ord(char):04X}; only printable text is kept")
    return value


def _run_secs(value, what: str) -> list[float]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_RUN_SECS:
        raise _refuse(what, f"run_secs must be a list of 1 to {MAX_RUN_SECS} run times; "
                            f"got {_short(value)}")
    for secs in value:
        if (isinstance(secs, bool) or not isinstance(secs, int | float)
                or not math.isfinite(secs) or not 0 < secs <= MAX_SECONDS):
            raise _refuse(what, f"run times must be finite positive seconds up to "
                                f"{MAX_SECONDS:g}; got {_short(secs)}")
    return [float(s) for s in value]


def _load(value, what: str) -> float | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 <= value <= MAX_CORES):
        raise _refuse(what, f"other_load must be a number of cores from 0 to {MAX_CORES}; "
                            f"got {_short(value)}")
    return float(value)


def _created_at(value, what: str) -> datetime.datetime | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise _refuse(what, f"created_at must be an ISO 8601 time; got {_short(value)}")
    try:
        stamp = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise _refuse(what, f"created_at must be an ISO 8601 time; got {_short(value)}") from None
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(datetime.UTC).replace(tzinfo=None)
    return stamp


def _seal(value, what: str) -> str:
    value = "" if value is None else value
    if not isinstance(value, str) or not well_formed(value):
        raise _refuse(what, f"seal must be empty or v1:<16 hex>:<64 hex>; got {_short(value)}")
    return value


def _digest_matches(line: dict, recomputed: str, what: str) -> None:
    given = line.get("digest")
    if given is None:
        return
    if not isinstance(given, str) or not _HEX64.fullmatch(given):
        raise _refuse(what, f"digest must be 64 lowercase hex characters; got {_short(given)}")
    if given != recomputed:
        raise _refuse(what, f"digest {given[:12]} does not match its content "
                            f"({recomputed[:12]}): the line was edited, or written by a qcompile "
                            "whose definition of this kernel differs")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _provenance(line: dict, what: str) -> Provenance:
    return Provenance(**{key: _printable(line.get(key), key, what, limit)
                         for key, limit in _PROVENANCE_LIMITS.items()})


class RecordChecker:
    """Validates workload, record and measurement lines (the JSON lines export's dicts)."""

    def __init__(self) -> None:
        from qcompile import _tvm

        self._tvm = _tvm
        self._targets: dict[str, tuple[object, str]] = {}
        self._workloads: dict[tuple[str, str], CheckedWorkload] = {}

    # ---- workloads -------------------------------------------------------------------------

    def _target(self, target: object, what: str) -> tuple[object, str]:
        """(preset, canonical JSON) of a target dict, which must be one our presets give."""
        if not isinstance(target, dict):
            raise _refuse(what, f"target must be a JSON object; got {_short(target)}")
        text = targets.canonical_json(target)
        if text in self._targets:
            return self._targets[text]
        kind = target.get("kind")
        candidates = []
        for preset in targets.PRESETS.values():
            if kind == "llvm" and preset.kind == "cpu" and target.get("mcpu") == preset.mcpu:
                cores = target.get("num-cores")
                if isinstance(cores, bool) or not isinstance(cores, int) \
                        or not 1 <= cores <= MAX_CORES:
                    raise _refuse(what, f"target num-cores must be 1 to {MAX_CORES}; "
                                        f"got {_short(cores)}")
                candidates.append((preset, preset.tvm_target(preset.hardware(cores=cores))))
            elif kind == "cuda" and preset.kind == "cuda":
                candidates.append((preset, preset.tvm_target()))
        for preset, candidate in candidates:
            canonical = targets.canonical_json(self._tvm.target_dict(self._tvm.Target(candidate)))
            if canonical == text:
                self._targets[text] = (preset, canonical)
                return preset, canonical
        names = ", ".join(targets.PRESETS)
        raise _refuse(what, f"target {_short(text)} is not one qcompile's presets give "
                            f"({names})")

    def workload(self, line: dict, what: str) -> CheckedWorkload:
        """The workload of a ``"type": "workload"`` line, rebuilt and checked."""
        spec_data = _json(line, "spec_json", what)
        if not isinstance(spec_data, dict):
            raise _refuse(what, "spec_json must be a JSON object")
        try:
            spec = spec_from_dict(spec_data)
        except Exception as error:  # a hostile spec may break any rule: each is a refusal
            raise _refuse(what, f"invalid kernel spec: {error}") from None
        target = _json(line, "target_json", what)
        preset, canonical = self._target(target, what)
        key = (spec.digest(), canonical)
        if key not in self._workloads:
            from schedules.variants import compute_for  # loads TVM, as self._tvm does

            try:
                mod = self._tvm.normalize_mod(compute_for(spec, preset.kind))
            except Exception as error:
                raise _refuse(what, f"{spec.name()} has no compute on {preset.name}: "
                                    f"{error}") from None
            tkey = target_key(json.loads(canonical))
            values = dict(
                digest=workload_digest(spec.digest(), tkey), name=spec.name(),
                family=spec.family, spec_digest=spec.digest(), spec_json=spec.to_json(),
                target_key=tkey, target_json=canonical,
                mod_hash=self._tvm.structural_hash(mod),
                mod_json=json.dumps(self._tvm.Workload(mod).as_json()))
            self._workloads[key] = CheckedWorkload(spec, preset, values, mod)
        checked = self._workloads[key]
        for field, ours in (("spec_digest", checked.values["spec_digest"]),
                            ("target_key", checked.values["target_key"])):
            given = line.get(field)
            if given is not None and given != ours:
                raise _refuse(what, f"{field} {_short(given)} does not match its spec and target "
                                    f"({ours[:12]})")
        if not str(line.get("digest", "")).startswith("ms:"):
            _digest_matches(line, checked.digest, what)
        given_hash = line.get("mod_hash")
        if given_hash is not None and str(given_hash) != checked.values["mod_hash"]:
            raise _refuse(what, f"its records were tuned on other TensorIR (structural hash "
                                f"{_short(given_hash)}, this qcompile's is "
                                f"{checked.values['mod_hash']}): they would not replay")
        return checked

    # ---- records ---------------------------------------------------------------------------

    def record(self, line: dict, workload: CheckedWorkload, origin: str, what: str) -> dict:
        """The ``tuning_records`` values of a ``"type": "record"`` line of ``workload``."""
        status = line.get("status")
        if status not in STATUSES:
            raise _refuse(what, f"status must be one of {', '.join(STATUSES)}; "
                                f"got {_short(status)}")
        if status == STATUS_OK:
            run_secs = _run_secs(line.get("run_secs"), what)
            error = None
        else:
            if line.get("run_secs") not in (None, []):
                raise _refuse(what, f"a {status} record has no run times; got "
                                    f"{_short(line.get('run_secs'))}")
            run_secs = None
            error = _printable(line.get("error"), "error", what, MAX_TEXT["error"],
                               allow_newlines=True)
        trace = _json(line, "trace_json", what)
        trace_text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
        digest = record_digest(workload.digest, trace_text)
        what = f"{what}: record {digest[:12]}"
        _digest_matches(line, digest, what)
        check_record_trace(trace, workload.spec, workload.preset.kind, digest=digest)
        target = _json(line, "target_json", what)
        if not isinstance(target, dict) or \
                self._target(target, what)[1] != workload.values["target_json"]:
            raise _refuse(what, "its target is not its workload's target")
        args_info = _json(line, "args_info_json", what)
        expected = self._replayed_args(workload, trace, digest)
        if args_info != expected:
            raise _refuse(what, f"args_info {_short(args_info)} is not what its trace gives "
                                f"({_short(expected)})")
        provenance = _provenance(line, what)
        if not provenance.tvm_version:  # MetaSchedule's files do not say; it replays on ours
            provenance = replace(provenance, tvm_version=self._tvm.TVM_VERSION,
                                 tvm_ffi_version=self._tvm.TVM_FFI_VERSION)
        return record_values(
            workload_id=None, digest=digest, status=status, run_secs=run_secs,
            trace_json=trace_text, args_info_json=json.dumps(expected),
            target_json=workload.values["target_json"], error=error,
            provenance=provenance, origin=origin[:255],
            created_at=_created_at(line.get("created_at"), what), claimed=True,
            seal=_seal(line.get("seal"), what), other_load=_load(line.get("other_load"), what))

    def _replayed_args(self, workload: CheckedWorkload, trace, digest: str) -> list:
        """The argument shapes the trace gives (a trace that does not replay is refused)."""
        from tuning_db.database import _plain_json

        tvm = self._tvm
        try:
            record = tvm.TuningRecord.from_json(
                [trace, None, tvm.target_dict(tvm.Target(workload.preset.tvm_target())), []],
                tvm.Workload(workload.mod))
            sch = tvm.Schedule(workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            args = tvm.ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        except Exception as error:  # TVM's own error types
            reason = (str(error).strip().splitlines() or ["error"])[-1][:200]
            raise _refuse(f"record {digest[:12]}", f"its trace does not replay on "
                                                   f"{workload.spec.name()}: {reason}") from None
        return _plain_json([a.as_json() for a in args])

    # ---- measurements ----------------------------------------------------------------------

    def measurement(self, line: dict, record_digest: str, what: str) -> dict:
        """The ``measurements`` values of a ``"type": "measurement"`` line."""
        purpose = line.get("purpose")
        if purpose not in PURPOSES:
            raise _refuse(what, f"purpose must be one of {', '.join(PURPOSES)}; "
                                f"got {_short(purpose)}")
        run_secs = _run_secs(line.get("run_secs"), what)
        provenance = _provenance(line, what)
        created = _created_at(line.get("created_at"), what)
        digest = measurement_digest(record_digest, purpose, provenance.device_model, run_secs,
                                    created)
        _digest_matches(line, digest, what)
        values = measurement_values(
            record_id=None, digest=digest, purpose=purpose, run_secs=run_secs,
            provenance=provenance, other_load=_load(line.get("other_load"), what),
            seal=_seal(line.get("seal"), what), claimed=True, created_at=created)
        del values["record_id"]
        values["record_digest"] = record_digest
        return values


def store_lines(storage: Storage, lines: Iterable[tuple[str, object]], *, origin: str,
                source: str, count: transfer.TransferCount | None = None
                ) -> transfer.TransferCount:
    """Validate every line, then store them all in one transaction, or refuse them all.

    Parameters
    ----------
    storage : Storage
        Where the records go.
    lines : iterable of (str, object)
        (where, parsed line) pairs: :func:`tuning_db.transfer.read_jsonl`,
        :func:`~tuning_db.transfer.read_metaschedule` or
        :func:`~tuning_db.transfer.database_lines`.
    origin : str
        What the stored records' ``origin`` says ("import FILE", "merge URL").
    source : str
        The file or database, for messages.

    Raises
    ------
    ImportRefused
        Any line breaks a rule: nothing was stored; ``problems`` lists each (up to
        :data:`MAX_PROBLEMS`).
    """
    count = count or transfer.TransferCount()
    checker = RecordChecker()
    workloads: dict[str, CheckedWorkload] = {}
    workload_rows: dict[str, dict] = {}
    record_rows: list[dict] = []
    measurement_rows: list[dict] = []
    record_digests: dict[str, str] = {}  # the line's digest -> recomputed
    problems: list[str] = []
    for where, line in lines:
        try:
            if not isinstance(line, dict):
                raise _refuse("line", "not a JSON object (or not valid JSON)")
            kind = line.get("type")
            if kind == "workload":
                checked = checker.workload(line, "workload")
                workloads[str(line.get("digest", checked.digest))] = checked
                workload_rows.setdefault(checked.digest, checked.values)
                count.workloads += 1
            elif kind == "record":
                workload = workloads.get(str(line.get("workload")))
                if workload is None:
                    raise _refuse("record", f"names workload {_short(line.get('workload'))}, "
                                            "which no earlier line of this source defines")
                row = checker.record(line, workload, origin, "record")
                row = {**{k: v for k, v in row.items() if k != "workload_id"},
                       "workload_digest": workload.digest}
                record_rows.append(row)
                record_digests[str(line.get("digest", row["digest"]))] = row["digest"]
                count.records += 1
            elif kind == "measurement":
                record_digest = record_digests.get(str(line.get("record")))
                if record_digest is None:
                    raise _refuse("measurement", f"names record {_short(line.get('record'))}, "
                                                 "which no earlier line of this source holds")
                measurement_rows.append(checker.measurement(line, record_digest, "measurement"))
                count.measurements += 1
            elif kind == "invalid":
                raise _refuse("line", str(line.get("reason")))
            else:
                raise _refuse("line", f"unknown line type {_short(kind)} (workload, record or "
                                      "measurement)")
        except RecordRefused as error:
            problems.append(f"{where}: {error}")
            if len(problems) >= MAX_PROBLEMS:
                problems.append(f"(stopped reading after {MAX_PROBLEMS} problems)")
                break
    if problems:
        raise ImportRefused(
            f"{source}: nothing was stored: {len(problems)} line(s) break the rules; the first: "
            f"{problems[0]}", problems)
    new_records, new_measurements, present = storage.import_batch(
        list(workload_rows.values()), record_rows, measurement_rows)
    count.duplicates = present
    count.measurements = new_measurements
    return count


def import_file(storage: Storage, path: str | Path, kind: str = "auto"
                ) -> transfer.TransferCount:
    """``qcompile db import``: a JSON lines export, or a MetaSchedule JSONDatabase (a directory
    or either of its files), validated whole, then stored in one transaction."""
    path = Path(path)
    if kind == "auto":
        ms_names = (transfer.MS_WORKLOADS, transfer.MS_RECORDS)
        kind = "metaschedule" if path.is_dir() or path.name in ms_names else "jsonl"
    count = transfer.TransferCount()
    if kind == "metaschedule":
        workloads, _ = transfer.metaschedule_paths(path)
        lines = transfer.read_metaschedule(path, count)
        origin = f"import {workloads.parent.name}/{workloads.name}"
    else:
        lines = transfer.read_jsonl(path)
        origin = f"import {path.name}"
    return store_lines(storage, lines, origin=origin, source=str(path), count=count)


def merge(source: Storage, dest: Storage, *, name: str | None = None) -> transfer.TransferCount:
    """``qcompile db merge``: every workload, record and measurement of ``source`` (whose
    workload name contains ``name``), validated like an import, into ``dest``."""
    lines = ((f"{source.display_url} line {i}", line)
             for i, line in enumerate(transfer.database_lines(source, name=name), 1))
    return store_lines(dest, lines, origin=f"merge {redact(source.url)}",
                       source=source.display_url)
