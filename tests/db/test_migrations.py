"""Schema revisions: the check on open, and one upgrade test per migration, on every backend."""

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect, text

from qcompile.errors import DatabaseError
from tuning_db import Storage, schema
from tuning_db.models import Base

WORKLOAD_0001 = dict(digest="w" * 64, name="uniform_demo", family="uniform", spec_digest="s" * 64,
                     spec_json="{}", target_key="t" * 64, target_json='{"kind":"llvm"}',
                     mod_hash="1234", mod_json="[]")


def _record_0001(workload_id):
    return dict(digest="r" * 64, workload_id=workload_id, status="ok", mean_us=12.5,
                run_secs_json="[1.25e-05]", error=None, trace_json="[]", args_info_json="[]",
                target_json='{"kind":"llvm"}', host="h1", device_model="cpu", tvm_version="0.27.0",
                tvm_ffi_version="0.1.14", qcompile_version="0.1.0", user="alice")


def _bare(url):
    """The database at ``url`` opened without the schema check (as `qcompile db upgrade` does)."""
    return Storage(url, check_schema=False)


def _schema_diff(engine):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    # SQLite reports no server defaults reliably; types are compared where the backend reports.
    return [d for d in diff if not (isinstance(d, list) and d and d[0][0] == "modify_default")]


def test_head_is_alembic_head():
    from alembic.script import ScriptDirectory

    from tuning_db.schema import alembic_config

    script = ScriptDirectory.from_config(alembic_config(None))
    assert script.get_heads() == [schema.HEAD]
    walked = [rev.revision for rev in script.walk_revisions()]
    assert tuple(reversed(walked)) == schema.REVISIONS


def test_fresh_database_is_created_at_head(db_url):
    storage = Storage(db_url)
    assert storage.revision == schema.HEAD
    assert _schema_diff(storage.engine) == []
    with storage.engine.connect() as connection:
        assert schema.current_revision(connection) == schema.HEAD


def test_upgrade_0001_builds_the_first_schema(db_url):
    bare = _bare(db_url)
    before, after = schema.upgrade(bare.engine, bare.display_url, "0001")
    assert (before, after) == (None, "0001")
    names = set(inspect(bare.engine).get_table_names())
    assert {"workloads", "tuning_records", "alembic_version"} <= names
    columns = {c["name"] for c in inspect(bare.engine).get_columns("tuning_records")}
    assert "origin" not in columns and {"host", "user", "tvm_ffi_version"} <= columns
    with pytest.raises(DatabaseError, match=f"revision 0001; this qcompile needs revision "
                                            f"{schema.HEAD}. Run: qcompile db upgrade --db"):
        schema.check(bare.engine, bare.display_url, readonly=False)


def test_upgrade_0002_keeps_records_and_adds_origin(db_url):
    bare = _bare(db_url)
    schema.upgrade(bare.engine, bare.display_url, "0001")
    meta = sa.MetaData()
    workloads = sa.Table("workloads", meta, autoload_with=bare.engine)
    records = sa.Table("tuning_records", meta, autoload_with=bare.engine)
    with bare.engine.begin() as connection:
        wid = connection.execute(workloads.insert().values(**WORKLOAD_0001)).inserted_primary_key[0]
        connection.execute(records.insert().values(**_record_0001(wid)))
    before, after = schema.upgrade(bare.engine, bare.display_url, "0002")
    assert (before, after) == ("0001", "0002")
    columns = {c["name"] for c in inspect(bare.engine).get_columns("tuning_records")}
    assert "origin" in columns and "seal" not in columns
    with bare.engine.connect() as connection:
        row = connection.execute(text("SELECT mean_us, origin FROM tuning_records")).one()
    assert tuple(row) == (12.5, "")
    if bare.dialect in ("mysql", "mariadb"):
        types = {c["name"]: str(c["type"]) for c in inspect(bare.engine).get_columns("workloads")}
        assert types["mod_json"] == "LONGTEXT"
    # upgrading again is a no-op
    assert schema.upgrade(bare.engine, bare.display_url, "0002") == ("0002", "0002")


def test_upgrade_0003_keeps_records_as_unsealed_claims_and_adds_measurements(db_url):
    bare = _bare(db_url)
    schema.upgrade(bare.engine, bare.display_url, "0001")
    meta = sa.MetaData()
    workloads = sa.Table("workloads", meta, autoload_with=bare.engine)
    records = sa.Table("tuning_records", meta, autoload_with=bare.engine)
    with bare.engine.begin() as connection:
        wid = connection.execute(workloads.insert().values(**WORKLOAD_0001)).inserted_primary_key[0]
        connection.execute(records.insert().values(**_record_0001(wid)))
    assert schema.upgrade(bare.engine, bare.display_url) == ("0001", "0003")
    assert _schema_diff(bare.engine) == []
    assert schema.check(bare.engine, bare.display_url, readonly=False) == schema.HEAD
    (record,) = bare.records()
    assert (record.mean_us, record.user, record.host, record.origin) == (12.5, "alice", "h1", "")
    assert (record.claimed, record.seal, record.other_load) == (False, "", None)
    assert "measurements" in inspect(bare.engine).get_table_names()
    assert bare.measurements([record.id]) == {record.id: []}
    assert schema.upgrade(bare.engine, bare.display_url) == ("0003", "0003")


def test_legacy_database_is_refused_then_upgraded(db_url):
    """A database from before migrations (tables from create_all, no alembic_version)."""
    bare = _bare(db_url)
    schema.upgrade(bare.engine, bare.display_url, "0001")
    with bare.engine.begin() as connection:
        connection.execute(text("DROP TABLE alembic_version"))
        assert schema.current_revision(connection) == "legacy"
    with pytest.raises(DatabaseError, match="before schema versions.*qcompile db upgrade"):
        schema.check(bare.engine, bare.display_url, readonly=False)
    assert schema.upgrade(bare.engine, bare.display_url) == ("legacy", schema.HEAD)
    assert schema.check(bare.engine, bare.display_url, readonly=True) == schema.HEAD


def test_newer_revision_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = Storage(url)
    with storage.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(DatabaseError, match="revision 0099, which this qcompile does not know"):
        Storage(url)


def test_readonly_never_creates(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with pytest.raises(DatabaseError, match="no qcompile tables and is opened read-only"):
        Storage(url, readonly=True)
    assert Storage(url, readonly=False).revision == schema.HEAD
    assert Storage(url, readonly=True).revision == schema.HEAD


def test_opening_while_another_process_creates_the_schema_waits(tmp_path):
    """SQLite commits each CREATE TABLE on its own, so a creator shows its tables before its
    version row. An opener that reads in that moment must wait for the creator's lock, not call
    the half-made database legacy (a race CI once hit with eight writers)."""
    import threading

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    creator = _bare(url)
    tables_made = threading.Event()
    release = threading.Event()
    opened = {}

    def create_slowly():
        with schema.schema_lock(creator.engine) as connection:
            Base.metadata.create_all(connection)
            connection.commit()
            tables_made.set()
            release.wait(30)
            schema._VERSION_TABLE.create(connection)
            connection.execute(schema._VERSION_TABLE.insert().values(version_num=schema.HEAD))
            connection.commit()

    def open_storage():
        try:
            opened["revision"] = Storage(url).revision
        except DatabaseError as error:
            opened["error"] = error

    creating = threading.Thread(target=create_slowly)
    creating.start()
    assert tables_made.wait(30)
    with creator.engine.connect() as connection:
        assert schema.current_revision(connection) == "legacy"  # the window is open
    opening = threading.Thread(target=open_storage)
    opening.start()
    opening.join(0.5)
    assert opening.is_alive(), "the opener did not wait for the creator's schema lock"
    release.set()
    creating.join(30)
    opening.join(30)
    assert opened == {"revision": schema.HEAD}


def test_own_cache_file_is_upgraded_in_place(tmp_path, monkeypatch, capsys):
    """The embedded default database belongs to its user alone: an older one is migrated on
    open (with a line on stderr) instead of refused; any other URL is still refused."""
    from tuning_db.url import default_url

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("QCOMPILE_DB", raising=False)
    url = default_url()
    Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True)
    bare = _bare(url)
    schema.upgrade(bare.engine, bare.display_url, "0001")
    with bare.engine.begin() as connection:
        connection.execute(text("DROP TABLE alembic_version"))  # as made before migrations
        workload_id = connection.execute(
            sa.insert(sa.table("workloads", *[sa.column(c) for c in WORKLOAD_0001]))
            .values(**WORKLOAD_0001).returning(sa.column("id"))).scalar_one()
        connection.execute(sa.insert(sa.table("tuning_records",
                                              *[sa.column(c) for c in _record_0001(0)]))
                           .values(**_record_0001(workload_id)))
    bare.close()  # checkpoints SQLite's write-ahead log into the file
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(Path(url.removeprefix("sqlite:///")).read_bytes())
    with pytest.raises(DatabaseError, match="before schema versions"):
        Storage(f"sqlite:///{copy}")
    storage = Storage()
    assert storage.revision == schema.HEAD
    assert "upgraded the tuning database" in capsys.readouterr().err
    with storage.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM tuning_records")).scalar() == 1
