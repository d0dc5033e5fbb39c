"""Shared fixtures: databases over every backend, target presets, fixed-schedule builds."""

from __future__ import annotations

import os
import uuid

import pytest

import targets

#: The PostgreSQL server the tests use (.ci/run starts it; trust auth, database "test").
POSTGRES_URL = os.environ.get("QCOMPILE_TEST_POSTGRES",
                              "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


#: The MariaDB/MySQL server (root, no password). Its tests skip when it is down, unless
#: $QCOMPILE_REQUIRE_MARIADB is set (.ci/run sets it when it could start the server).
MARIADB_URL = os.environ.get("QCOMPILE_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")


def _create_on_server(server_url: str, ddl: str, label: str, require_env: str):
    """An engine on ``server_url`` after running ``ddl`` (creating a schema or database of a
    test's own); skips the test when the server does not answer, unless ``require_env`` is set."""
    from sqlalchemy import create_engine, text

    engine = create_engine(server_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(ddl))
    except Exception as error:
        engine.dispose()
        if os.environ.get(require_env):
            raise
        pytest.skip(f"{label} at {server_url} unavailable: {error}")
    return engine


def _postgres_schema_url():
    """A fresh schema on the test server, and a URL whose connections use it."""
    schema = f"qc_test_{uuid.uuid4().hex[:12]}"
    engine = _create_on_server(POSTGRES_URL, f'CREATE SCHEMA "{schema}"', "PostgreSQL",
                               "QCOMPILE_REQUIRE_POSTGRES")
    sep = "&" if "?" in POSTGRES_URL else "?"
    return engine, schema, f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"


def _mariadb_database_url():
    """A fresh database on the test MariaDB server, and a URL that uses it."""
    from sqlalchemy.engine import make_url

    name = f"qc_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = _create_on_server(MARIADB_URL, f"CREATE DATABASE `{name}`", "MariaDB",
                               "QCOMPILE_REQUIRE_MARIADB")
    url = make_url(MARIADB_URL).set(database=name).render_as_string(hide_password=False)
    return engine, name, url


def _backend_url(backend, tmp_path):
    """(url, cleanup) of an empty database on ``backend``."""
    if backend == "sqlite-memory":
        return "sqlite://", lambda: None
    if backend == "sqlite-file":
        return f"sqlite:///{tmp_path / 'tuning.sqlite'}", lambda: None
    if backend == "mariadb":
        engine, name, url = _mariadb_database_url()
        return url, _dropper(engine, f"DROP DATABASE `{name}`")
    engine, schema, url = _postgres_schema_url()
    return url, _dropper(engine, f'DROP SCHEMA "{schema}" CASCADE')


def _dropper(engine, ddl: str):
    """A cleanup that runs ``ddl`` (dropping a test's schema or database) and closes ``engine``."""
    from sqlalchemy import text

    def drop():
        with engine.begin() as conn:
            conn.execute(text(ddl))
        engine.dispose()
    return drop


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "postgresql", "mariadb"])
def db_url(request, tmp_path):
    """A URL of an empty tuning database, for every backend we support."""
    url, cleanup = _backend_url(request.param, tmp_path)
    yield url
    cleanup()


@pytest.fixture
def postgres_url(tmp_path):
    """A URL of an empty PostgreSQL schema of its own."""
    url, cleanup = _backend_url("postgresql", tmp_path)
    yield url
    cleanup()


@pytest.fixture
def avx2():
    preset = targets.get("avx2")
    supported, reason = preset.host_support()
    if not supported:
        pytest.skip(f"host cannot run avx2 code: {reason}")
    return preset


@pytest.fixture(params=["avx2", "avx512"])
def cpu_preset(request):
    preset = targets.get(request.param)
    supported, reason = preset.host_support()
    if not supported:
        pytest.skip(f"host cannot run {request.param} code: {reason}")
    return preset


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Tests never touch the user's cache or database unless they ask for it, and build without
    the shipped record packs unless they ask for them (a pack holds records of common specs:
    a test that expects no record for one would find it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("QCOMPILE_DB", raising=False)
    monkeypatch.setenv("QCOMPILE_PACKS", "0")
    monkeypatch.delenv("QCOMPILE_PACKS_DIR", raising=False)


# ---- CUDA (tests marked `cuda` run only where a GPU is) --------------------------------------


def _cuda_skip_reason() -> str | None:
    supported, reason = targets.get("cuda").host_support()
    if not supported:
        return f"needs a CUDA GPU: {reason}"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch sees none (a CPU-only torch build?)"
    return None


# ---- slow: every test that tunes or builds a real kernel -------------------------------------

#: Directories whose every test builds a real kernel (tests/cpu and tests/cuda build and run
#: kernels, tests/codegen generates CUDA C and CPU code): marked slow here, once. Tests elsewhere
#: that tune or build carry ``@pytest.mark.slow`` themselves. ``-m "not slow"`` is the fast subset.
SLOW_DIRECTORIES = ("cpu", "cuda", "codegen")
TESTS = os.path.dirname(os.path.abspath(__file__))


def _mark_slow_directories(items):
    for item in items:
        relative = os.path.relpath(str(item.path), TESTS)
        if relative.split(os.sep)[0] in SLOW_DIRECTORIES:
            item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
    _mark_slow_directories(items)
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    reason = _cuda_skip_reason()
    if reason is not None:
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=reason))
