"""The tuning database's storage layer: the only code that opens SQLAlchemy sessions.

Concurrency contract
--------------------
A :class:`Storage` is safe to share among threads, and any number of processes may open the same
database URL at once:

- workloads are unique by digest; :meth:`Storage.get_or_create_workload` is an insert-or-get that
  recovers from a concurrent insert of the same digest (the unique constraint decides, the loser
  reads the winner's row);
- records are unique by digest; :meth:`Storage.add_record` is idempotent (a record committed twice,
  or imported twice, is stored once);
- every call is one transaction (:meth:`Storage._transaction`): commit on success, rollback on any
  error, database errors translated into :class:`qcompile.errors.DatabaseError` with the password
  removed from the URL;
- SQLite runs in WAL mode with a busy timeout, so readers never block the writer.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import case, create_engine, event, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from qcompile.errors import DatabaseError
from tuning_db.models import STATUS_OK, STATUSES, Base, RecordRow, WorkloadRow
from tuning_db.url import redact, resolve_url

_SQLITE_BUSY_TIMEOUT_S = 30


@dataclass(frozen=True)
class WorkloadInfo:
    id: int
    digest: str
    name: str
    family: str
    spec_digest: str
    spec_json: str
    target_key: str
    target_json: str
    mod_hash: str
    mod_json: str


@dataclass(frozen=True)
class RecordInfo:
    id: int
    digest: str
    workload_id: int
    status: str
    mean_us: float | None
    run_secs: list[float] | None
    error: str | None
    trace_json: str
    args_info_json: str
    target_json: str
    host: str
    device_model: str
    tvm_version: str
    qcompile_version: str
    user: str
    created_at: datetime | None


@dataclass(frozen=True)
class WorkloadSummary:
    digest: str
    name: str
    family: str
    target_json: str
    records: int
    ok_records: int
    best_us: float | None


@dataclass(frozen=True)
class Provenance:
    """Where a record was measured (stored on every record)."""

    host: str = ""
    device_model: str = ""
    tvm_version: str = ""
    tvm_ffi_version: str = ""
    qcompile_version: str = ""
    user: str = ""


def _workload_info(row: WorkloadRow) -> WorkloadInfo:
    return WorkloadInfo(id=row.id, digest=row.digest, name=row.name, family=row.family,
                        spec_digest=row.spec_digest, spec_json=row.spec_json,
                        target_key=row.target_key, target_json=row.target_json,
                        mod_hash=row.mod_hash, mod_json=row.mod_json)


def _record_info(row: RecordRow) -> RecordInfo:
    return RecordInfo(
        id=row.id, digest=row.digest, workload_id=row.workload_id, status=row.status,
        mean_us=row.mean_us,
        run_secs=json.loads(row.run_secs_json) if row.run_secs_json else None,
        error=row.error, trace_json=row.trace_json, args_info_json=row.args_info_json,
        target_json=row.target_json, host=row.host, device_model=row.device_model,
        tvm_version=row.tvm_version, qcompile_version=row.qcompile_version, user=row.user,
        created_at=row.created_at,
    )


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        # One shared connection, or every session would see its own empty database.
        engine = create_engine(url, poolclass=StaticPool,
                               connect_args={"check_same_thread": False})
    else:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        if database not in ("", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


class Storage:
    """Workloads and tuning records in a SQLAlchemy database (see the module's contract).

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL; ``None`` means $QCOMPILE_DB, else the SQLite file in the user's cache.
    readonly : bool
        Refuse every write with a clear error (a shared database you may only read).
    """

    def __init__(self, url: str | None = None, *, readonly: bool = False) -> None:
        self.url = resolve_url(url)
        self.readonly = readonly
        try:
            self._engine = _make_engine(self.url)
            self._sessions = sessionmaker(self._engine, expire_on_commit=False)
            if not readonly:
                Base.metadata.create_all(self._engine)
        except SQLAlchemyError as error:
            raise DatabaseError(self._describe(error)) from None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Storage({redact(self.url)!r})"

    @property
    def display_url(self) -> str:
        """The URL without its password."""
        return redact(self.url)

    def close(self) -> None:
        self._engine.dispose()

    def _describe(self, error: Exception) -> str:
        text = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        password = make_url(self.url).password
        if password:
            text = text.replace(str(password), "***")
        return f"tuning database {redact(self.url)}: {text}"

    @contextlib.contextmanager
    def _transaction(self, write: bool = False) -> Iterator[Session]:
        """One session, one transaction: commit, or roll back and translate the error."""
        if write and self.readonly:
            raise DatabaseError(f"tuning database {redact(self.url)} is opened read-only")
        session = self._sessions()
        try:
            yield session
            session.commit()
        except IntegrityError:
            session.rollback()
            raise  # callers that expect races (insert-or-get) handle it
        except SQLAlchemyError as error:
            session.rollback()
            raise DatabaseError(self._describe(error)) from None
        finally:
            session.close()

    # ---- workloads -------------------------------------------------------------------------

    def get_or_create_workload(self, *, digest: str, name: str, family: str, spec_digest: str,
                               spec_json: str, target_key: str, target_json: str,
                               mod_hash: str, mod_json: str) -> WorkloadInfo:
        """The workload with ``digest``, inserted first if absent (idempotent, race-safe)."""
        existing = self.find_workload(digest)
        if existing is not None:
            return existing
        row = WorkloadRow(digest=digest, name=name, family=family, spec_digest=spec_digest,
                          spec_json=spec_json, target_key=target_key, target_json=target_json,
                          mod_hash=mod_hash, mod_json=mod_json)
        try:
            with self._transaction(write=True) as session:
                session.add(row)
                session.flush()
                info = _workload_info(row)
            return info
        except IntegrityError:
            found = self.find_workload(digest)  # another process inserted it first
            if found is None:
                raise DatabaseError(f"workload {name} vanished after a concurrent insert") from None
            return found

    def find_workload(self, digest: str) -> WorkloadInfo | None:
        with self._transaction() as session:
            row = session.scalar(select(WorkloadRow).where(WorkloadRow.digest == digest))
            return _workload_info(row) if row else None

    def workloads(self, target_key: str | None = None) -> list[WorkloadInfo]:
        with self._transaction() as session:
            query = select(WorkloadRow).order_by(WorkloadRow.id)
            if target_key is not None:
                query = query.where(WorkloadRow.target_key == target_key)
            return [_workload_info(row) for row in session.scalars(query)]

    def summaries(self) -> list[WorkloadSummary]:
        """One line per workload: its name, target, record counts and best latency."""
        with self._transaction() as session:
            ok_count = func.sum(case((RecordRow.status == STATUS_OK, 1), else_=0))
            query = (
                select(WorkloadRow, func.count(RecordRow.id), ok_count, func.min(RecordRow.mean_us))
                .outerjoin(RecordRow, RecordRow.workload_id == WorkloadRow.id)
                .group_by(WorkloadRow.id)
                .order_by(WorkloadRow.name, WorkloadRow.id)
            )
            return [
                WorkloadSummary(digest=w.digest, name=w.name, family=w.family,
                                target_json=w.target_json, records=int(n or 0),
                                ok_records=int(ok or 0), best_us=best)
                for w, n, ok, best in session.execute(query)
            ]

    # ---- records ---------------------------------------------------------------------------

    def add_record(self, *, workload_id: int, digest: str, status: str,
                   run_secs: list[float] | None, trace_json: str, args_info_json: str,
                   target_json: str, error: str | None = None,
                   provenance: Provenance | None = None) -> int | None:
        """Store one measured candidate; returns its id, or None if that digest was stored before.

        ``status`` is "ok" (``run_secs`` required) or a failure status with ``error`` text;
        failures have no latency, so they can never rank as a best record.
        """
        if status not in STATUSES:
            raise ValueError(f"record status must be one of {STATUSES}; got {status!r}")
        if status == STATUS_OK and not run_secs:
            raise ValueError("an ok record needs its measured run_secs")
        mean_us = sum(run_secs) / len(run_secs) * 1e6 if status == STATUS_OK else None
        p = provenance or Provenance()
        row = RecordRow(
            digest=digest, workload_id=workload_id, status=status, mean_us=mean_us,
            run_secs_json=json.dumps(run_secs) if run_secs else None, error=error,
            trace_json=trace_json, args_info_json=args_info_json, target_json=target_json,
            host=p.host, device_model=p.device_model, tvm_version=p.tvm_version,
            tvm_ffi_version=p.tvm_ffi_version, qcompile_version=p.qcompile_version, user=p.user,
        )
        try:
            with self._transaction(write=True) as session:
                session.add(row)
                session.flush()
                return row.id
        except IntegrityError:
            return None  # the same measurement was stored before: idempotent

    def top_records(self, workload_id: int, k: int) -> list[RecordInfo]:
        """The ``k`` fastest successful records of a workload, fastest first."""
        with self._transaction() as session:
            query = (
                select(RecordRow)
                .where(RecordRow.workload_id == workload_id, RecordRow.status == STATUS_OK)
                .order_by(RecordRow.mean_us, RecordRow.id)
                .limit(k)
            )
            return [_record_info(row) for row in session.scalars(query)]

    def records(self, workload_id: int | None = None) -> list[RecordInfo]:
        """Every record (failures included), oldest first."""
        with self._transaction() as session:
            query = select(RecordRow).order_by(RecordRow.id)
            if workload_id is not None:
                query = query.where(RecordRow.workload_id == workload_id)
            return [_record_info(row) for row in session.scalars(query)]

    def count_records(self, workload_id: int | None = None, status: str | None = None) -> int:
        with self._transaction() as session:
            query = select(func.count(RecordRow.id))
            if workload_id is not None:
                query = query.where(RecordRow.workload_id == workload_id)
            if status is not None:
                query = query.where(RecordRow.status == status)
            return int(session.scalar(query) or 0)
