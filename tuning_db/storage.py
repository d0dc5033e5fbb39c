"""The tuning database's storage layer: the only code that opens SQLAlchemy sessions.

Concurrency contract
--------------------
A :class:`Storage` is safe to share among threads, and any number of processes, on any number of
machines, may open the same database URL at once and tune into it. Nothing one writer commits is
lost, duplicated or corrupted by another:

- **Unique keys, insert-or-get.** A workload is unique by ``digest`` (spec digest + target key),
  a record by ``digest`` (workload digest + trace). :meth:`Storage.get_or_create_workload` and
  :meth:`Storage.add_record` are single dialect upserts (PostgreSQL and SQLite
  ``INSERT ... ON CONFLICT (digest) DO NOTHING``, MySQL/MariaDB ``INSERT IGNORE``) followed by a
  read of the row that won: two processes committing the same workload get the same row, and a
  record committed twice (or imported twice) is stored once. No check-then-insert window exists.
- **Row locks for read-modify-write.** Operations that read rows and then change them on what
  they read (:meth:`Storage.prune`) first lock the workload row (``SELECT ... FOR UPDATE``;
  SQLite's single writer serializes them), so two pruners never interleave.
- **One transaction per call, bounded retries with jitter.** Every method runs in
  :meth:`Storage._run`: commit on success, roll back on any error. Serialization failures and
  deadlocks (PostgreSQL 40001/40P01/55P03, MySQL 1213/1205, SQLite "database is locked") and
  dropped connections are retried up to :data:`MAX_ATTEMPTS` times with exponential backoff and
  random jitter; what still fails becomes a :class:`qcompile.errors.DatabaseError`.
- **SQLite** runs in WAL mode with a busy timeout of :data:`SQLITE_BUSY_TIMEOUT_S` seconds, so
  readers never block the writer and writers wait for each other instead of failing.
- **Schema.** Opening checks the schema revision (:mod:`tuning_db.schema`); an empty database is
  created under a schema lock, once, however many processes open it together.
- **Credentials.** Errors, ``repr`` and :attr:`Storage.display_url` carry the URL through
  :func:`tuning_db.url.redact` (password and secret parameters ``***``), driver messages
  through :func:`tuning_db.url.scrub`; origins are redacted on their way in and out.
- SQL is written only as SQLAlchemy expressions; no text is ever pasted into a statement.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import case, create_engine, delete, event, func, insert, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from qcompile.errors import DatabaseError
from tuning_db import schema
from tuning_db.models import (
    PURPOSES,
    STATUS_OK,
    STATUSES,
    MeasurementRow,
    RecordRow,
    WorkloadRow,
)
from tuning_db.url import UNPARSEABLE, default_url, redact, redact_origin, resolve_url, scrub

#: SQLite waits this long for a lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30
#: Attempts of one transaction that hits a serialization failure or a deadlock.
MAX_ATTEMPTS = 8
_BACKOFF_S = 0.02
_BACKOFF_MAX_S = 2.0
_RETRY_PGCODES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available
_RETRY_MYSQL_ERRNOS = {1205, 1213}  # lock wait timeout, deadlock


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
    tvm_ffi_version: str = ""
    origin: str = ""
    #: The database it was read from (its URL, secrets masked: tuning_db.url.redact).
    database: str = ""
    #: Provenance came by an import or a merge: what the source said, not what we saw.
    claimed: bool = False
    #: HMAC of the measuring host's or a team's key (qcompile.trust.seals); "" when none.
    seal: str = ""
    #: Cores other processes kept busy while it was measured (None: not recorded).
    other_load: float | None = None


@dataclass(frozen=True)
class MeasurementInfo:
    """A later measurement of a record (build's re-measurement, tune's quieter re-measure,
    ``db verify``), with its own provenance and seal."""

    id: int
    digest: str
    record_id: int
    purpose: str
    run_secs: list[float]
    mean_us: float
    other_load: float | None
    host: str
    device_model: str
    user: str
    tvm_version: str
    qcompile_version: str
    claimed: bool
    seal: str
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


def _record_info(row: RecordRow, database: str = "") -> RecordInfo:
    return RecordInfo(
        id=row.id, digest=row.digest, workload_id=row.workload_id, status=row.status,
        mean_us=row.mean_us,
        run_secs=json.loads(row.run_secs_json) if row.run_secs_json else None,
        error=row.error, trace_json=row.trace_json, args_info_json=row.args_info_json,
        target_json=row.target_json, host=row.host, device_model=row.device_model,
        tvm_version=row.tvm_version, qcompile_version=row.qcompile_version, user=row.user,
        created_at=row.created_at, tvm_ffi_version=row.tvm_ffi_version,
        origin=redact_origin(row.origin),  # an older database may hold a secret there
        database=database, claimed=bool(row.claimed), seal=row.seal or "",
        other_load=row.other_load,
    )


def _measurement_info(row: MeasurementRow) -> MeasurementInfo:
    return MeasurementInfo(
        id=row.id, digest=row.digest, record_id=row.record_id, purpose=row.purpose,
        run_secs=json.loads(row.run_secs_json), mean_us=row.mean_us, other_load=row.other_load,
        host=row.host, device_model=row.device_model, user=row.user,
        tvm_version=row.tvm_version, qcompile_version=row.qcompile_version,
        claimed=bool(row.claimed), seal=row.seal or "", created_at=row.created_at)


def mean_us_of(run_secs: list[float]) -> float:
    """The latency a record ranks by: the mean of its run times, in microseconds."""
    return sum(run_secs) / len(run_secs) * 1e6


def _retryable(error: DBAPIError) -> bool:
    """A serialization failure, deadlock, busy database or dropped connection: try again."""
    if error.connection_invalidated:
        return True
    orig = error.orig
    if getattr(orig, "pgcode", None) in _RETRY_PGCODES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _RETRY_MYSQL_ERRNOS:
        return True
    message = str(orig).lower()
    return "database is locked" in message or "database table is locked" in message


def _sqlite_directory(url: str, database: str) -> None:
    """Only the default database (the user's cache) creates its directory; any other SQLite
    file's directory must exist, so a typo in ``--db`` never makes directories."""
    directory = Path(database).expanduser().parent
    if url == default_url():
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DatabaseError(f"tuning database {redact(url)}: cannot create its directory "
                                f"{directory}: {error.strerror}") from None
        return
    if not directory.is_dir():
        state = "is not a directory" if directory.exists() else "does not exist"
        raise DatabaseError(f"tuning database {redact(url)}: directory {directory} {state}; "
                            "create it first (only the default database in the user's cache "
                            "creates its directory)")


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
        _sqlite_directory(url, database)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        if database not in ("", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def record_values(*, workload_id: int | None, digest: str, status: str,
                  run_secs: list[float] | None, trace_json: str, args_info_json: str,
                  target_json: str, error: str | None = None,
                  provenance: Provenance | None = None, origin: str = "tune",
                  created_at: datetime | None = None, claimed: bool = False, seal: str = "",
                  other_load: float | None = None) -> dict:
    """The column values of one ``tuning_records`` row, checked: a known status, and an ok
    record's run times finite and positive (a failure has none)."""
    if status not in STATUSES:
        raise ValueError(f"record status must be one of {STATUSES}; got {status!r}")
    if status == STATUS_OK:
        _check_run_secs(run_secs, digest)
    p = provenance or Provenance()
    values = dict(
        digest=digest, workload_id=workload_id, status=status,
        mean_us=mean_us_of(run_secs) if status == STATUS_OK else None,
        run_secs_json=json.dumps(run_secs) if status == STATUS_OK else None, error=error,
        trace_json=trace_json, args_info_json=args_info_json, target_json=target_json,
        host=p.host, device_model=p.device_model, tvm_version=p.tvm_version,
        tvm_ffi_version=p.tvm_ffi_version, qcompile_version=p.qcompile_version, user=p.user,
        origin=redact_origin(origin)[:255], claimed=claimed, seal=seal, other_load=other_load,
    )
    if created_at is not None:
        values["created_at"] = created_at
    return values


def measurement_values(*, record_id: int | None, digest: str, purpose: str,
                       run_secs: list[float], provenance: Provenance,
                       other_load: float | None = None, seal: str = "", claimed: bool = False,
                       created_at: datetime | None = None) -> dict:
    """The column values of one ``measurements`` row, checked like :func:`record_values`."""
    if purpose not in PURPOSES:
        raise ValueError(f"measurement purpose must be one of {PURPOSES}; got {purpose!r}")
    _check_run_secs(run_secs, digest)
    values = dict(
        digest=digest, record_id=record_id, purpose=purpose, run_secs_json=json.dumps(run_secs),
        mean_us=mean_us_of(run_secs), other_load=other_load, host=provenance.host,
        device_model=provenance.device_model, user=provenance.user,
        tvm_version=provenance.tvm_version, qcompile_version=provenance.qcompile_version,
        claimed=claimed, seal=seal)
    if created_at is not None:
        values["created_at"] = created_at
    return values


def workload_digest(spec_digest: str, target_key: str) -> str:
    """The database key of a workload: (kernel spec, target)."""
    return hashlib.sha256(f"{spec_digest}:{target_key}".encode()).hexdigest()


def record_digest(workload_digest_: str, trace_json: str) -> str:
    """The database key of a record: its workload and its decisions."""
    return hashlib.sha256(f"{workload_digest_}:{trace_json}".encode()).hexdigest()


def measurement_digest(record_digest: str, purpose: str, device_model: str,
                       run_secs: list[float], created_at: datetime | None) -> str:
    """The database key of a measurement: what was measured, why, on what, how fast, when."""
    stamp = created_at.isoformat() if created_at else ""
    text = json.dumps([record_digest, purpose, device_model, [repr(float(s)) for s in run_secs],
                       stamp], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _check_run_secs(run_secs, digest: str) -> None:
    if not isinstance(run_secs, list) or not run_secs:
        raise ValueError(f"record {digest[:12]}: a measurement needs its run times; "
                         f"got {run_secs!r}")
    for value in run_secs:
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"record {digest[:12]}: run times must be finite positive seconds; "
                             f"got {value!r}")


class Storage:
    """Workloads and tuning records in a SQLAlchemy database (see the module's contract).

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL; ``None`` means $QCOMPILE_DB, else the SQLite file in the user's cache.
    readonly : bool
        Refuse every write with a clear error (a shared database you may only read).
    check_schema : bool
        Check the schema revision on open (and create an empty database's tables). Only
        ``qcompile db upgrade``/``info``/``check`` open a database without it.
    """

    def __init__(self, url: str | None = None, *, readonly: bool = False,
                 check_schema: bool = True) -> None:
        self.url = resolve_url(url)
        self.readonly = readonly
        #: Transactions retried after a serialization failure or deadlock (since open).
        self.retries = 0
        self.revision: str | None = None
        try:
            try:
                self._engine = _make_engine(self.url)
            except ImportError as error:  # create_engine imports the URL's driver
                raise DatabaseError(
                    f"tuning database {redact(self.url)}: its driver is not installed "
                    f"({error}); qcompile ships psycopg2 and pymysql: write postgresql://, "
                    "mysql:// or mariadb:// without a driver") from None
            self._sessions = sessionmaker(self._engine, expire_on_commit=False)
            if check_schema:
                own_cache = self.url == default_url()
                self.revision = self._with_retries(
                    lambda: schema.check(self._engine, self.display_url, readonly=readonly,
                                         auto_upgrade=own_cache))
        except (SQLAlchemyError, ValueError) as error:  # ValueError: make_url, a bad port
            raise DatabaseError(self._describe(error)) from None

    def __repr__(self) -> str:
        return f"Storage({redact(self.url)!r})"

    @property
    def display_url(self) -> str:
        """The URL with its secrets masked (:func:`tuning_db.url.redact`)."""
        return redact(self.url)

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def schema_revision(self) -> str | None:
        """The database's schema revision (:func:`tuning_db.schema.current_revision`)."""
        def read():
            with self._engine.connect() as connection:
                return schema.current_revision(connection)

        try:
            return self._with_retries(read)
        except SQLAlchemyError as error:
            raise DatabaseError(self._describe(error)) from None

    def upgrade_schema(self) -> tuple[str | None, str | None]:
        """Run the migrations up to :data:`tuning_db.schema.HEAD`; returns (before, after)."""
        try:
            return schema.upgrade(self._engine, self.display_url)
        except SQLAlchemyError as error:
            raise DatabaseError(self._describe(error)) from None

    def _describe(self, error: Exception) -> str:
        """One line for a driver's error, with the URL's secrets scrubbed out of it."""
        shown = redact(self.url)
        if shown == UNPARSEABLE:  # the parser's message may quote a piece of the password
            return (f"tuning database {shown}: not a database URL (the form is dialect"
                    "[+driver] :// user : password @ host : port / database ? parameters, with "
                    "a password's @ : / ? written %40 %3A %2F %3F)")
        text = str(getattr(error, "orig", None) or error).strip().splitlines()
        text = text[0] if text else type(error).__name__
        return f"tuning database {shown}: {scrub(text, self.url)}"

    # ---- transactions ----------------------------------------------------------------------

    def _with_retries(self, attempt: Callable[[], object]):
        """Run ``attempt`` until it succeeds, retrying serialization failures, deadlocks and
        busy databases up to :data:`MAX_ATTEMPTS` times with exponential backoff and jitter."""
        for number in range(1, MAX_ATTEMPTS + 1):
            try:
                return attempt()
            except DBAPIError as error:
                if number == MAX_ATTEMPTS or not _retryable(error):
                    raise
                self.retries += 1
                delay = min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (number - 1))
                time.sleep(delay * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    def _run(self, work: Callable[[Session], object], *, write: bool = False):
        """``work(session)`` in one transaction: commit, or roll back (retrying what the
        contract retries) and raise :class:`DatabaseError` without the password."""
        if write and self.readonly:
            raise DatabaseError(f"tuning database {redact(self.url)} is opened read-only "
                                "(--db-readonly); writes go to the local database")

        def attempt():
            session = self._sessions()
            try:
                result = work(session)
                session.commit()
                return result
            except BaseException:
                session.rollback()
                raise
            finally:
                session.close()

        try:
            return self._with_retries(attempt)
        except SQLAlchemyError as error:
            raise DatabaseError(self._describe(error)) from None

    def _insert_ignore(self, session: Session, table, values: dict) -> int | None:
        """Insert a row unless its unique digest exists: the id of the new row, or None."""
        dialect = self.dialect
        if dialect in ("postgresql", "sqlite"):
            module = postgresql if dialect == "postgresql" else sqlite
            stmt = (module.insert(table).values(**values)
                    .on_conflict_do_nothing(index_elements=[table.c.digest])
                    .returning(table.c.id))
            return session.execute(stmt).scalar()
        if dialect in ("mysql", "mariadb"):
            result = session.execute(mysql.insert(table).values(**values).prefix_with("IGNORE"))
            return result.lastrowid if result.rowcount == 1 else None
        # Any other backend: a plain insert inside a savepoint, the unique key deciding.
        from sqlalchemy.exc import IntegrityError

        try:
            with session.begin_nested():
                return session.execute(insert(table).values(**values)).inserted_primary_key[0]
        except IntegrityError:
            return None

    # ---- workloads -------------------------------------------------------------------------

    def get_or_create_workload(self, *, digest: str, name: str, family: str, spec_digest: str,
                               spec_json: str, target_key: str, target_json: str,
                               mod_hash: str, mod_json: str) -> WorkloadInfo:
        """The workload with ``digest``, inserted first if absent (idempotent, race-safe)."""
        existing = self.find_workload(digest)
        if existing is not None:
            return existing
        values = dict(digest=digest, name=name, family=family, spec_digest=spec_digest,
                      spec_json=spec_json, target_key=target_key, target_json=target_json,
                      mod_hash=mod_hash, mod_json=mod_json)

        def work(session):
            self._insert_ignore(session, WorkloadRow.__table__, values)
            row = session.scalar(select(WorkloadRow).where(WorkloadRow.digest == digest))
            return _workload_info(row) if row else None

        info = self._run(work, write=True)
        if info is None:  # the winner committed after our snapshot: read again
            info = self.find_workload(digest)
        if info is None:
            raise DatabaseError(f"workload {name} vanished after a concurrent insert")
        return info

    def find_workload(self, digest: str) -> WorkloadInfo | None:
        def work(session):
            row = session.scalar(select(WorkloadRow).where(WorkloadRow.digest == digest))
            return _workload_info(row) if row else None

        return self._run(work)

    def workloads(self, target_key: str | None = None) -> list[WorkloadInfo]:
        def work(session):
            query = select(WorkloadRow).order_by(WorkloadRow.id)
            if target_key is not None:
                query = query.where(WorkloadRow.target_key == target_key)
            return [_workload_info(row) for row in session.scalars(query)]

        return self._run(work)

    def summaries(self) -> list[WorkloadSummary]:
        """One line per workload: its name, target, record counts and best latency."""
        def work(session):
            ok_count = func.sum(case((RecordRow.status == STATUS_OK, 1), else_=0))
            query = (
                select(WorkloadRow.digest, WorkloadRow.name, WorkloadRow.family,
                       WorkloadRow.target_json, func.count(RecordRow.id), ok_count,
                       func.min(RecordRow.mean_us))
                .outerjoin(RecordRow, RecordRow.workload_id == WorkloadRow.id)
                .group_by(WorkloadRow.id, WorkloadRow.digest, WorkloadRow.name,
                          WorkloadRow.family, WorkloadRow.target_json)
                .order_by(WorkloadRow.name, WorkloadRow.id)
            )
            return [
                WorkloadSummary(digest=digest, name=name, family=family, target_json=target,
                                records=int(n or 0), ok_records=int(ok or 0), best_us=best)
                for digest, name, family, target, n, ok, best in session.execute(query)
            ]

        return self._run(work)

    # ---- records ---------------------------------------------------------------------------

    def add_record(self, *, workload_id: int, digest: str, status: str,
                   run_secs: list[float] | None, trace_json: str, args_info_json: str,
                   target_json: str, error: str | None = None,
                   provenance: Provenance | None = None, origin: str = "tune",
                   created_at: datetime | None = None, claimed: bool = False, seal: str = "",
                   other_load: float | None = None) -> int | None:
        """Store one measured candidate; returns its id, or None if that digest was stored before.

        ``status`` is "ok" (``run_secs`` required) or a failure status with ``error`` text;
        failures have no latency, so they can never rank as a best record. ``created_at`` is
        the database's clock unless given (an imported record keeps its own). ``claimed``,
        ``seal`` and ``other_load``: see :class:`RecordInfo`.
        """
        values = record_values(
            workload_id=workload_id, digest=digest, status=status, run_secs=run_secs,
            trace_json=trace_json, args_info_json=args_info_json, target_json=target_json,
            error=error, provenance=provenance, origin=origin, created_at=created_at,
            claimed=claimed, seal=seal, other_load=other_load)
        return self._run(
            lambda session: self._insert_ignore(session, RecordRow.__table__, values), write=True)

    def add_measurement(self, *, record_id: int, digest: str, purpose: str,
                        run_secs: list[float], provenance: Provenance,
                        other_load: float | None = None, seal: str = "",
                        claimed: bool = False, created_at: datetime | None = None) -> int | None:
        """Store a later measurement of record ``record_id``; returns its id, or None if that
        digest was stored before."""
        values = measurement_values(
            record_id=record_id, digest=digest, purpose=purpose, run_secs=run_secs,
            provenance=provenance, other_load=other_load, seal=seal, claimed=claimed,
            created_at=created_at)
        return self._run(
            lambda session: self._insert_ignore(session, MeasurementRow.__table__, values),
            write=True)

    def measurements(self, record_ids: list[int]) -> dict[int, list[MeasurementInfo]]:
        """The later measurements of each record in ``record_ids``, oldest first."""
        if not record_ids:
            return {}

        def work(session):
            out: dict[int, list[MeasurementInfo]] = {rid: [] for rid in record_ids}
            for start in range(0, len(record_ids), 500):
                chunk = record_ids[start:start + 500]
                query = (select(MeasurementRow).where(MeasurementRow.record_id.in_(chunk))
                         .order_by(MeasurementRow.id))
                for row in session.scalars(query):
                    out[row.record_id].append(_measurement_info(row))
            return out

        return self._run(work)

    def import_batch(self, workloads: list[dict], records: list[dict],
                     measurements: list[dict]) -> tuple[int, int, int]:
        """Insert-or-get workloads, records and measurements in ONE transaction: all or nothing.

        ``workloads``: column values (:data:`tuning_db.models.WorkloadRow` columns).
        ``records``: :func:`record_values` dicts whose ``workload_id`` is replaced by
        ``workload_digest``. ``measurements``: :func:`measurement_values` dicts whose
        ``record_id`` is replaced by ``record_digest``. Returns how many records and
        measurements were new, and how many records were there already.
        """
        def work(session):
            workload_ids = {}
            for values in workloads:
                self._insert_ignore(session, WorkloadRow.__table__, values)
                row = session.scalar(select(WorkloadRow).where(
                    WorkloadRow.digest == values["digest"]))
                if row.mod_hash != values["mod_hash"]:
                    raise DatabaseError(
                        f"workload {values['name']} ({values['digest'][:12]}) exists in "
                        f"{self.display_url} with different TensorIR (structural hash "
                        f"{row.mod_hash} != {values['mod_hash']})")
                workload_ids[values["digest"]] = row.id
            new_records = present = 0
            record_ids = {}
            for values in records:
                values = dict(values)
                values["workload_id"] = workload_ids[values.pop("workload_digest")]
                inserted = self._insert_ignore(session, RecordRow.__table__, values)
                new_records += inserted is not None
                present += inserted is None
                record_ids[values["digest"]] = inserted if inserted is not None else \
                    session.scalar(select(RecordRow.id).where(
                        RecordRow.digest == values["digest"]))
            new_measurements = 0
            for values in measurements:
                values = dict(values)
                record_digest = values.pop("record_digest")
                record_id = record_ids.get(record_digest) or session.scalar(
                    select(RecordRow.id).where(RecordRow.digest == record_digest))
                values["record_id"] = record_id
                new_measurements += self._insert_ignore(
                    session, MeasurementRow.__table__, values) is not None
            return new_records, new_measurements, present

        return self._run(work, write=True)

    def top_records(self, workload_id: int, k: int,
                    tvm_series: str | None = None) -> list[RecordInfo]:
        """The ``k`` fastest successful records of a workload, fastest first.

        ``tvm_series`` ("0.27"): only records measured with that TVM major.minor, whose traces
        replay here.
        """
        def work(session):
            query = (
                select(RecordRow)
                .where(RecordRow.workload_id == workload_id, RecordRow.status == STATUS_OK)
                .order_by(RecordRow.mean_us, RecordRow.id)
                .limit(k)
            )
            if tvm_series:
                query = query.where((RecordRow.tvm_version == tvm_series)
                                    | RecordRow.tvm_version.startswith(f"{tvm_series}."))
            return [_record_info(row, self.display_url) for row in session.scalars(query)]

        return self._run(work)

    def records(self, workload_id: int | None = None) -> list[RecordInfo]:
        """Every record (failures included), oldest first."""
        def work(session):
            query = select(RecordRow).order_by(RecordRow.id)
            if workload_id is not None:
                query = query.where(RecordRow.workload_id == workload_id)
            return [_record_info(row, self.display_url) for row in session.scalars(query)]

        return self._run(work)

    def count_records(self, workload_id: int | None = None, status: str | None = None,
                      tvm_series: str | None = None) -> int:
        def work(session):
            query = select(func.count(RecordRow.id))
            if tvm_series:
                query = query.where((RecordRow.tvm_version == tvm_series)
                                    | RecordRow.tvm_version.startswith(f"{tvm_series}."))
            if workload_id is not None:
                query = query.where(RecordRow.workload_id == workload_id)
            if status is not None:
                query = query.where(RecordRow.status == status)
            return int(session.scalar(query) or 0)

        return self._run(work)

    def count_workloads(self) -> int:
        return self._run(lambda session: int(session.scalar(select(func.count(WorkloadRow.id)))))

    def contributors(self) -> list[tuple[str, str, str, int, datetime | None]]:
        """(user, host, device model, records, newest creation time), most records first."""
        def work(session):
            count = func.count(RecordRow.id)
            query = (select(RecordRow.user, RecordRow.host, RecordRow.device_model, count,
                            func.max(RecordRow.created_at))
                     .group_by(RecordRow.user, RecordRow.host, RecordRow.device_model)
                     .order_by(count.desc()))
            return [tuple(row) for row in session.execute(query)]

        return self._run(work)

    # ---- maintenance -----------------------------------------------------------------------

    def prune(self, keep: int, *, dry_run: bool = False) -> int:
        """Keep the ``keep`` fastest successful records of every workload (a workload is one
        spec on one target) and delete the rest, failures included; returns how many go.

        Each workload is one transaction that first locks its row (``SELECT ... FOR UPDATE``),
        so two pruners never interleave; a record committed meanwhile is never deleted (only
        the ids read under the lock are).
        """
        if keep < 1:
            raise ValueError(f"prune keeps at least 1 record per workload; got keep={keep}")
        removed = 0
        for workload in self.workloads():
            def work(session, workload_id=workload.id):
                session.execute(select(WorkloadRow.id).where(WorkloadRow.id == workload_id)
                                .with_for_update())
                ranked = session.scalars(
                    select(RecordRow.id).where(RecordRow.workload_id == workload_id)
                    .order_by(case((RecordRow.status == STATUS_OK, 0), else_=1),
                              RecordRow.mean_us, RecordRow.id)).all()
                doomed = ranked[keep:]
                if doomed and not dry_run:
                    for start in range(0, len(doomed), 500):
                        chunk = doomed[start:start + 500]
                        session.execute(delete(MeasurementRow).where(
                            MeasurementRow.record_id.in_(chunk)))
                        session.execute(delete(RecordRow).where(RecordRow.id.in_(chunk)))
                return len(doomed)

            removed += self._run(work, write=not dry_run)
        return removed

    def integrity_problems(self) -> list[str]:
        """What is wrong with the stored data (empty when nothing is): the backend's own check
        (SQLite ``PRAGMA integrity_check``), records without a workload, duplicate digests,
        ok records without a latency, failed records with one."""
        def work(session):
            problems = []
            if self.dialect == "sqlite":
                from sqlalchemy import text

                result = [r[0] for r in session.execute(text("PRAGMA integrity_check"))]
                if result != ["ok"]:
                    problems.append("SQLite integrity_check: " + "; ".join(result[:5]))
            orphans = session.scalar(
                select(func.count(RecordRow.id)).where(
                    ~RecordRow.workload_id.in_(select(WorkloadRow.id))))
            if orphans:
                problems.append(f"{orphans} records belong to no workload")
            orphans = session.scalar(
                select(func.count(MeasurementRow.id)).where(
                    ~MeasurementRow.record_id.in_(select(RecordRow.id))))
            if orphans:
                problems.append(f"{orphans} measurements belong to no record")
            for row, table in ((WorkloadRow, "workloads"), (RecordRow, "tuning_records"),
                               (MeasurementRow, "measurements")):
                dupes = session.execute(
                    select(row.digest).group_by(row.digest).having(func.count(row.id) > 1)
                ).scalars().all()
                if dupes:
                    problems.append(f"{len(dupes)} duplicate digests in {table}")
            bad_ok = session.scalar(select(func.count(RecordRow.id)).where(
                RecordRow.status == STATUS_OK, RecordRow.mean_us.is_(None)))
            if bad_ok:
                problems.append(f"{bad_ok} ok records have no latency")
            bad_failed = session.scalar(select(func.count(RecordRow.id)).where(
                RecordRow.status != STATUS_OK, RecordRow.mean_us.is_not(None)))
            if bad_failed:
                problems.append(f"{bad_failed} failed records carry a latency")
            return problems

        return self._run(work)
