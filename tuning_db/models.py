"""The schema: workloads (a kernel spec on a target) and their measured tuning records.

A workload is keyed by ``digest`` = sha256(spec digest, target key), never by position, so the
same kernel on the same target is one row in every database, whoever created it. A record is
keyed by ``digest`` = sha256(workload digest, trace), so committing or importing the same
measurement twice stores it once.

These classes are the schema of the newest migration (:data:`tuning_db.schema.HEAD`); every
change here comes with a revision in ``tuning_db/migrations/versions`` that makes it on an
existing database (``qcompile db upgrade``), and a test that the two agree.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
    func,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: Record statuses. Only "ok" records have a latency; failures keep their error text.
STATUS_OK = "ok"
STATUS_BUILD_ERROR = "build_error"
STATUS_RUN_ERROR = "run_error"
STATUSES = (STATUS_OK, STATUS_BUILD_ERROR, STATUS_RUN_ERROR)

#: Why a record was measured again (the ``measurements`` table).
PURPOSE_VERIFY = "verify"  # build or ``db verify`` on a host that did not measure it
PURPOSE_REMEASURE = "remeasure"  # tune, on a quieter machine than its first measurement
PURPOSES = (PURPOSE_VERIFY, PURPOSE_REMEASURE)


#: JSON text: MySQL/MariaDB's TEXT stops at 64 KiB, so it is LONGTEXT there (revision 0002).
JsonText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


class Base(DeclarativeBase):
    pass


class WorkloadRow(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    family: Mapped[str] = mapped_column(String(32), nullable=False)
    spec_digest: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    spec_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    target_key: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    target_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    # MetaSchedule's Workload JSON (structural hash, base64 IRModule): traces replay on it.
    mod_hash: Mapped[str] = mapped_column(String(40), nullable=False)
    mod_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.now())

    records: Mapped[list[RecordRow]] = relationship(back_populates="workload")


class RecordRow(Base):
    __tablename__ = "tuning_records"
    __table_args__ = (Index("ix_records_best", "workload_id", "status", "mean_us"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    mean_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    run_secs_json: Mapped[str | None] = mapped_column(JsonText, nullable=True)
    error: Mapped[str | None] = mapped_column(JsonText, nullable=True)
    trace_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    args_info_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    target_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    # Provenance: where and with what the record was measured.
    host: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    device_model: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    tvm_version: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    tvm_ffi_version: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    qcompile_version: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    user: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    # How the record came here: "tune", "import FILE", "merge URL" (revision 0002).
    origin: Mapped[str] = mapped_column(String(255), nullable=False, default="",
                                        server_default="")
    # Trust (revision 0003): provenance that came by import or merge is only claimed; the seal
    # is an HMAC by the measuring host's or a team's key (qcompile.trust.seals); other_load is
    # how many cores other processes kept busy while it was measured.
    claimed: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                          server_default=false())
    seal: Mapped[str] = mapped_column(String(160), nullable=False, default="", server_default="")
    other_load: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.now())

    workload: Mapped[WorkloadRow] = relationship(back_populates="records")
    measurements: Mapped[list[MeasurementRow]] = relationship(
        back_populates="record", cascade="all, delete-orphan", passive_deletes=True)


class MeasurementRow(Base):
    """A later measurement of a record: build re-measuring candidates on its host, tune
    re-measuring its best on a quieter machine, ``db verify`` (revision 0003)."""

    __tablename__ = "measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    record_id: Mapped[int] = mapped_column(
        ForeignKey("tuning_records.id", ondelete="CASCADE"), nullable=False, index=True)
    purpose: Mapped[str] = mapped_column(String(16), nullable=False)
    run_secs_json: Mapped[str] = mapped_column(JsonText, nullable=False)
    mean_us: Mapped[float] = mapped_column(Float, nullable=False)
    other_load: Mapped[float | None] = mapped_column(Float, nullable=True)
    host: Mapped[str] = mapped_column(String(255), nullable=False, default="", server_default="")
    device_model: Mapped[str] = mapped_column(String(255), nullable=False, default="",
                                              server_default="")
    user: Mapped[str] = mapped_column(String(128), nullable=False, default="", server_default="")
    tvm_version: Mapped[str] = mapped_column(String(64), nullable=False, default="",
                                             server_default="")
    qcompile_version: Mapped[str] = mapped_column(String(64), nullable=False, default="",
                                                  server_default="")
    claimed: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                          server_default=false())
    seal: Mapped[str] = mapped_column(String(160), nullable=False, default="", server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime, server_default=func.now())

    record: Mapped[RecordRow] = relationship(back_populates="measurements")
