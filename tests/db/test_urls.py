"""Database URLs as people type them: driver-less ``postgresql://``, ``mysql://`` and
``mariadb://`` use the drivers that ship with qcompile (psycopg2, pymysql), against the real
servers; what is not a URL, or not a backend we speak, is one clear error; a SQLite file
outside the default cache needs its directory to exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from qcompile.errors import DatabaseError
from tuning_db import Storage, default_url, resolve_url
from tuning_db.url import ENV_VAR

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("typed, resolved", [
    ("postgresql://u@h/db", "postgresql+psycopg2://u@h/db"),
    ("postgres://u@h:5433/db", "postgresql+psycopg2://u@h:5433/db"),
    ("mysql://root@h/db", "mysql+pymysql://root@h/db"),
    ("mariadb://root@h/db", "mariadb+pymysql://root@h/db"),
    ("postgres+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
    # Named drivers and SQLite are left as typed.
    ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
    ("mysql+pymysql://root@h/db?charset=utf8mb4", "mysql+pymysql://root@h/db?charset=utf8mb4"),
    ("sqlite:////tmp/x.sqlite", "sqlite:////tmp/x.sqlite"),
    ("sqlite://", "sqlite://"),
])
def test_driverless_urls_get_the_shipped_drivers(typed, resolved):
    assert resolve_url(typed) == resolved


def test_rewriting_keeps_password_query_and_port():
    url = make_url(resolve_url("postgresql://alice:p%40ss%2Fw@db.example:6543/team"
                               "?sslmode=require&options=-csearch_path%3Dx"))
    assert url.drivername == "postgresql+psycopg2"
    assert (url.username, url.password, url.host, url.port, url.database) == \
        ("alice", "p@ss/w", "db.example", 6543, "team")
    assert dict(url.query) == {"sslmode": "require", "options": "-csearch_path=x"}


def test_environment_variable_is_resolved_the_same_way(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "mysql://root@h/db")
    assert resolve_url() == "mysql+pymysql://root@h/db"
    monkeypatch.delenv(ENV_VAR)
    assert resolve_url() == default_url()


@pytest.mark.parametrize("typed, message", [
    ("notaurl", "--db 'notaurl' is not a database URL"),
    ("foo://host/db", "database kind 'foo' is not supported"),
    ("mssql+pyodbc://u@h/db", "database kind 'mssql' is not supported"),
])
def test_what_is_not_a_usable_url(typed, message):
    with pytest.raises(DatabaseError, match=message):
        resolve_url(typed)


def test_an_unparseable_url_is_not_echoed_when_it_may_hold_a_password():
    with pytest.raises(DatabaseError) as raised:
        resolve_url("user:secret@:not a url")
    assert "secret" not in str(raised.value)


# ---- SQLite directories ---------------------------------------------------------------------

def test_missing_sqlite_directory_is_an_error_and_nothing_is_created(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(DatabaseError, match=f"directory {missing} does not exist"):
        Storage(f"sqlite:///{missing / 'x.sqlite'}")
    assert not (tmp_path / "no").exists()
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(DatabaseError, match=f"directory {a_file} is not a directory"):
        Storage(f"sqlite:///{a_file / 'x.sqlite'}")


def test_the_default_cache_database_creates_its_directory(tmp_path):
    cache = tmp_path / "cache" / "qcompile"  # XDG_CACHE_HOME of this test (conftest)
    assert not cache.exists()
    storage = Storage()
    assert storage.url == default_url() and (cache / "tuning.sqlite").is_file()
    storage.close()


def test_an_existing_directory_is_enough(tmp_path):
    storage = Storage(f"sqlite:///{tmp_path / 'x.sqlite'}")
    assert storage.count_records() == 0
    storage.close()


# ---- against the real servers ---------------------------------------------------------------

def _without_driver(url: str, scheme: str) -> str:
    """``url`` (a test server's, with its driver) as a user types it: ``scheme://...``."""
    return scheme + url[url.index("://"):]


def _cli(args, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(ENV_VAR, None)
    return subprocess.run([sys.executable, "-m", "qcompile.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _round_trip(typed: str, tmp_path) -> None:
    storage = Storage(typed)
    assert storage.count_workloads() == 0 and storage.count_records() == 0
    storage.close()
    result = _cli(["db", "check", "--db", typed], tmp_path)
    assert result.returncode == 0 and ": ok (schema" in result.stdout, result.stderr


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_driverless_postgresql_url_against_the_server(scheme, postgres_url, tmp_path):
    typed = _without_driver(postgres_url, scheme)
    assert "+" not in typed.split("://")[0]
    _round_trip(typed, tmp_path)


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
def test_driverless_mysql_and_mariadb_urls_against_the_server(scheme, db_url, tmp_path):
    _round_trip(_without_driver(db_url, scheme), tmp_path)
