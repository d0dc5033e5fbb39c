"""The schema version of a tuning database: check it on open, create it, upgrade it.

A database holds its Alembic revision in ``alembic_version``. Opening one:

- empty (no qcompile tables): the newest schema is created and stamped :data:`HEAD` (unless the
  database is opened read-only);
- at :data:`HEAD`: used as it is;
- older, or made before migrations existed (tables, no ``alembic_version``): refused with the
  command that upgrades it, ``qcompile db upgrade --db URL`` (the embedded default cache file,
  which only its user reads, is upgraded in place instead);
- newer than this qcompile knows: refused, naming the revision (upgrade qcompile).

Creating and upgrading hold a schema lock (PostgreSQL advisory lock, MySQL ``GET_LOCK``, a lock
file beside a SQLite file), so that many processes opening one new database create it once.
The version check itself reads one row and imports no Alembic.
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Column, MetaData, String, Table, inspect, select, text
from sqlalchemy.engine import Connection, Engine

from qcompile.errors import DatabaseError
from tuning_db.models import Base
from tuning_db.url import db_option

#: The newest revision (``tuning_db/migrations/versions``); a test keeps it equal to Alembic's.
HEAD = "0003"
#: Revisions oldest first: what ``qcompile db upgrade`` walks through.
REVISIONS = ("0001", "0002", "0003")
#: The revision whose tables match a database made before migrations (``create_all``).
BASELINE = "0001"

_VERSION_TABLE = Table("alembic_version", MetaData(),
                       Column("version_num", String(32), primary_key=True))
_TABLES = ("workloads", "tuning_records", "measurements")
_LOCK_KEY = 0x71636F6D  # "qcom": the advisory lock id of schema changes
_LOCK_NAME = "qcompile_tuning_db_schema"


def current_revision(connection: Connection) -> str | None:
    """The database's revision; ``"legacy"`` for qcompile tables without a version; None if
    the database has no qcompile tables."""
    names = set(inspect(connection).get_table_names())
    if "alembic_version" in names:
        rows = connection.execute(select(_VERSION_TABLE.c.version_num)).scalars().all()
        if len(rows) == 1:
            return rows[0]
        if len(rows) > 1:
            return "+".join(sorted(rows))
    if any(name in names for name in _TABLES):
        return "legacy"
    return None


def upgrade_command(display_url: str) -> str:
    """The command that upgrades the database at ``display_url`` (a redacted URL: when it hides
    a secret, the command says which URL to pass instead of showing ``***`` as if runnable)."""
    return f"qcompile db upgrade {db_option(display_url)}"


def check(engine: Engine, display_url: str, *, readonly: bool,
          auto_upgrade: bool = False) -> str:
    """Make sure the database is at :data:`HEAD` (creating an empty one); returns its revision.

    ``auto_upgrade`` migrates an older (or pre-migration) database in place instead of refusing
    it: for the user's own embedded cache file, which nobody else shares, and which an upgrade
    of qcompile should not leave unusable.

    Raises
    ------
    DatabaseError
        The schema is older (the message gives the upgrade command), newer, or missing on a
        read-only database.
    """
    with engine.connect() as connection:
        revision = current_revision(connection)
        connection.rollback()
    if revision == HEAD:
        return revision
    if not readonly:
        # Read again under the lock: SQLite and MySQL commit each CREATE TABLE on its own, so
        # a process creating the schema shows its tables before its version row, and the read
        # above may have caught that moment ("legacy"). Under the lock the creator is done.
        with schema_lock(engine) as connection:
            revision = current_revision(connection)
            if revision is None:
                Base.metadata.create_all(connection)
                _VERSION_TABLE.create(connection)
                connection.execute(_VERSION_TABLE.insert().values(version_num=HEAD))
                connection.commit()
                return HEAD
            connection.rollback()
        if revision == HEAD:
            return revision
        if auto_upgrade and (revision == "legacy" or revision in REVISIONS):
            before, after = upgrade(engine, display_url)
            print(f"qcompile: upgraded the tuning database {display_url} from schema "
                  f"revision {before} to {after}", file=sys.stderr)
            return after
    _refuse(revision, display_url)
    return revision  # unreachable: _refuse raises


def _refuse(revision: str | None, display_url: str) -> None:
    fix = upgrade_command(display_url)
    if revision is None:
        raise DatabaseError(
            f"tuning database {display_url} has no qcompile tables and is opened read-only; "
            f"create them with: {fix}")
    if revision == "legacy":
        raise DatabaseError(
            f"tuning database {display_url} was made before schema versions (no "
            f"alembic_version table); this qcompile needs revision {HEAD}. Run: {fix}")
    if revision in REVISIONS:
        raise DatabaseError(
            f"tuning database {display_url} has schema revision {revision}; this qcompile needs "
            f"revision {HEAD}. Run: {fix}")
    raise DatabaseError(
        f"tuning database {display_url} has schema revision {revision}, which this qcompile "
        f"does not know (it knows {', '.join(REVISIONS)}): a newer qcompile wrote it; upgrade "
        "qcompile")


def alembic_config(connection: Connection):
    """An Alembic config that runs the packaged migrations on ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, display_url: str,
            revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database to ``revision`` (default the newest); returns (before, after).

    A database made before migrations is first stamped :data:`BASELINE` (its tables are that
    revision's); an empty one is built revision by revision.
    """
    from alembic import command

    with schema_lock(engine) as connection:
        before = current_revision(connection)
        if before is not None and before != "legacy" and before not in REVISIONS:
            _refuse(before, display_url)
        config = alembic_config(connection)
        if before == "legacy":
            command.stamp(config, BASELINE)
        command.upgrade(config, revision)
        connection.commit()
        after = current_revision(connection)
        connection.commit()
    return before, after


@contextlib.contextmanager
def schema_lock(engine: Engine) -> Iterator[Connection]:
    """A connection that holds the database's schema lock until the block ends."""
    dialect = engine.dialect.name
    with engine.connect() as connection:
        if dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _LOCK_KEY})
            connection.commit()
            try:
                yield connection
            finally:
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _LOCK_KEY})
                connection.commit()
        elif dialect in ("mysql", "mariadb"):
            got = connection.execute(text("SELECT GET_LOCK(:name, 120)"),
                                     {"name": _LOCK_NAME}).scalar()
            if got != 1:
                raise DatabaseError("timed out after 120 s waiting for another process to "
                                    "finish changing the tuning database's schema")
            try:
                yield connection
            finally:
                connection.rollback()
                connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": _LOCK_NAME})
        else:
            database = engine.url.database or ""
            if database in ("", ":memory:"):
                yield connection
                return
            lock_path = Path(database).expanduser().with_name(Path(database).name + ".lock")
            with open(lock_path, "a") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    yield connection
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)
