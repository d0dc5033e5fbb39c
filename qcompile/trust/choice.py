"""Which record ``build`` exports: the fastest one whose latency this host believes.

A record's latency is believed only when a seal this process can verify vouches for it on this
device model (:mod:`qcompile.trust.seals`): its own tune, an earlier re-measurement here, or a
team member's measurement on the same machine type. Everything else (an import, a merge, a row
another host wrote into the shared database, a record tuned before seals existed) is a claim.

Choosing among the ``top`` fastest valid records of a workload:

1. If no claim beats the best believed latency, that record wins: nothing is measured.
2. Otherwise, when this host can run the target, the claims that beat it, together with every
   believed record among the ``top``, are built and timed here in one run; the measurements are
   stored (sealed, purpose "verify") and the fastest of this run wins. A fake 1 ns record is
   timed like any other and loses on its real time. All of them are timed because a machine's
   speed drifts between runs: the stored measurements, the newest belief of each, then come
   from one run, and the next build picks the same record without measuring.
3. When this host cannot run the target (a CUDA build on a machine without a GPU, a CPU build
   ``--for-another-host``), only believed records may win; with none, the build stops and says
   how to verify them on a machine that can.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from qcompile.errors import NoRecordError
from qcompile.measure import Measured
from qcompile.trust.seals import Sealer
from tuning_db.storage import (
    MeasurementInfo,
    Provenance,
    RecordInfo,
    Storage,
    WorkloadInfo,
    measurement_digest,
    measurement_values,
    record_values,
)

#: The records build considers: the fastest claims, at most this many.
DEFAULT_TOP = 3


@dataclass(frozen=True)
class Belief:
    """A latency this host believes, and why."""

    mean_us: float
    #: "host key" or "team key": whose seal vouches for it.
    key: str
    device_model: str
    other_load: float | None


@dataclass(frozen=True)
class Candidate:
    """A valid record of the workload in one database layer."""

    storage: Storage
    workload: WorkloadInfo
    record: RecordInfo
    belief: Belief | None


@dataclass(frozen=True)
class Choice:
    """What build exports, and what it based the choice on."""

    workload: WorkloadInfo
    record: RecordInfo
    #: The latency build believes (measured here in this run, or sealed).
    mean_us: float
    #: One line for the user: how the latency is known.
    how: str
    #: Candidates timed here by this choice.
    remeasured: int = 0


def believe(record: RecordInfo, measurements: list[MeasurementInfo], sealer: Sealer,
            device_model: str | None) -> Belief | None:
    """The most recent sealed latency of ``record`` on ``device_model`` (None: any model),
    or None when no seal this process can verify vouches for one."""
    found: list[tuple[int, Belief]] = []
    if record.run_secs:
        key = sealer.verify(record.seal, record.digest, record.device_model, record.run_secs,
                            "tune")
        if key and (device_model is None or record.device_model == device_model):
            found.append((0, Belief(record.mean_us, key, record.device_model,
                                    record.other_load)))
    for order, m in enumerate(measurements, 1):
        key = sealer.verify(m.seal, record.digest, m.device_model, m.run_secs, m.purpose)
        if key and (device_model is None or m.device_model == device_model):
            found.append((order, Belief(m.mean_us, key, m.device_model, m.other_load)))
    return max(found, key=lambda item: item[0])[1] if found else None


def store_measurement(writer: Storage, candidate: Candidate, measured: Measured, *,
                      purpose: str, provenance: Provenance, sealer: Sealer,
                      other_load: float | None) -> None:
    """Store a new measurement of ``candidate`` in ``writer``, sealed. A record that lives in
    another layer (a read-only shared database) is copied into ``writer`` first, marked
    claimed, in the same transaction."""
    seal = sealer.seal(candidate.record.digest, provenance.device_model, measured.run_secs,
                       purpose)

    record = candidate.record
    workload = candidate.workload
    workload_values = {f: getattr(workload, f) for f in (
        "digest", "name", "family", "spec_digest", "spec_json", "target_key", "target_json",
        "mod_hash", "mod_json")}
    record_row = record_values(
        workload_id=None, digest=record.digest, status=record.status, run_secs=record.run_secs,
        trace_json=record.trace_json, args_info_json=record.args_info_json,
        target_json=record.target_json, error=record.error, provenance=Provenance(
            host=record.host, device_model=record.device_model,
            tvm_version=record.tvm_version, tvm_ffi_version=record.tvm_ffi_version,
            qcompile_version=record.qcompile_version, user=record.user),
        origin=record.origin if candidate.storage is writer else
        f"copied from {candidate.storage.display_url} to verify it",
        created_at=record.created_at, claimed=record.claimed or candidate.storage is not writer,
        seal=record.seal, other_load=record.other_load)
    del record_row["workload_id"]
    record_row["workload_digest"] = workload.digest
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None, microsecond=0)
    measurement_row = measurement_values(
        record_id=None, digest=measurement_digest(record.digest, purpose, provenance.device_model,
                                                  measured.run_secs, now),
        purpose=purpose, run_secs=measured.run_secs, provenance=provenance,
        other_load=other_load, seal=seal, created_at=now)
    del measurement_row["record_id"]
    measurement_row["record_digest"] = record.digest
    writer.import_batch([workload_values], [record_row], [measurement_row])


def choose(candidates: list[Candidate], *, label: str,
           measure: Callable[[list[Candidate]], list[Measured]] | None,
           cannot_measure_because: str = "") -> Choice:
    """Pick the record to export from ``candidates`` (fastest claim first; module docstring).

    Parameters
    ----------
    candidates : list of Candidate
        The valid records, fastest claim first (at most a few).
    label : str
        The workload and target, for messages.
    measure : callable or None
        Times candidates here and stores what it measured, in order; None when this host cannot
        run the target (``cannot_measure_because`` says why).
    """
    if not candidates:
        raise NoRecordError(f"no valid record for {label}")
    believed = [c for c in candidates if c.belief is not None]
    best = min(believed, key=lambda c: c.belief.mean_us) if believed else None
    suspects = _suspects(candidates)
    if not suspects:
        return Choice(best.workload, best.record, best.belief.mean_us,
                      f"{best.belief.mean_us:.1f} us measured on {best.belief.device_model} "
                      f"(sealed by the {best.belief.key})")
    if measure is None:
        if best is not None:
            return Choice(best.workload, best.record, best.belief.mean_us,
                          f"{best.belief.mean_us:.1f} us measured on {best.belief.device_model} "
                          f"(sealed by the {best.belief.key}); {len(suspects)} faster claims "
                          f"were not verified because {cannot_measure_because}")
        claims = ", ".join(f"record {c.record.digest[:12]} ({c.record.mean_us:.3g} us, "
                           f"{claimed_by(c.record)})" for c in suspects)
        raise NoRecordError(
            f"{label}: no record's latency is verified for this machine type, and this host "
            f"cannot measure them ({cannot_measure_because}): {claims}. On a machine that runs "
            "the target, `qcompile db verify` re-measures and seals them (with the team key in "
            "$QCOMPILE_TEAM_KEY_FILE, for every machine that holds it)")
    timed = to_time(candidates)
    results = measure(timed)
    ok = [(c, m) for c, m in zip(timed, results, strict=True) if m.run_secs]
    if not ok:
        reasons = "; ".join(f"record {c.record.digest[:12]}: {m.error}"
                            for c, m in zip(timed, results, strict=True))
        raise NoRecordError(f"{label}: none of the {len(timed)} fastest records built and ran "
                            f"here: {reasons}")
    winner, measured = min(ok, key=lambda item: item[1].mean_us)
    return Choice(winner.workload, winner.record, measured.mean_us,
                  f"{measured.mean_us:.1f} us re-measured here against {len(timed) - 1} other "
                  f"candidates (claimed {winner.record.mean_us:.3g} us, "
                  f"{claimed_by(winner.record)})", remeasured=len(timed))


def _suspects(candidates: list[Candidate]) -> list[Candidate]:
    """The claims that beat the best believed latency (all claims when none is believed)."""
    believed = [c.belief.mean_us for c in candidates if c.belief is not None]
    best = min(believed) if believed else None
    return [c for c in candidates if c.belief is None
            and (best is None or c.record.mean_us < best)]


def to_time(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates :func:`choose` times when it can measure (in the order it passes them
    to ``measure``): the suspect claims, then every believed record, fastest first; empty
    when no claim beats the best believed latency. A build of several workloads times all of
    theirs in one batch and hands each :func:`choose` its own results."""
    suspects = _suspects(candidates)
    if not suspects:
        return []
    believed = [c for c in candidates if c.belief is not None]
    return suspects + sorted(believed, key=lambda c: c.belief.mean_us)


def claimed_by(record: RecordInfo) -> str:
    """Who claims ``record``'s latency, for messages."""
    where = f"{record.user or '?'}@{record.host or '?'} on {record.device_model or '?'}"
    return f"claimed by {where}" if record.claimed else f"by {where}, not sealed for this host"
