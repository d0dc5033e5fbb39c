"""Where the tuning database lives, and how to print its URL without its password."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from qcompile.errors import DatabaseError

#: Environment variable naming the database URL when ``--db`` is not given.
ENV_VAR = "QCOMPILE_DB"


def cache_dir() -> Path:
    """qcompile's per-user cache: $XDG_CACHE_HOME/qcompile, else ~/.cache/qcompile."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qcompile"


def default_url() -> str:
    """The embedded SQLite file in the user's cache directory."""
    return f"sqlite:///{cache_dir() / 'tuning.sqlite'}"


#: Backends the storage layer speaks (its upserts are written for these dialects).
BACKENDS = ("sqlite", "postgresql", "mysql", "mariadb")

#: Backends named without a driver (the URL forms people type) -> the drivers that ship with
#: qcompile (setup.cfg: psycopg2-binary, pymysql). SQLAlchemy's own defaults (psycopg for
#: ``postgresql://`` since 2.1, mysqlclient for ``mysql://`` and ``mariadb://``) are not
#: installed with qcompile. ``postgres://`` (libpq's and Heroku's spelling) is read as
#: ``postgresql://``.
SHIPPED_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql",
                   "mariadb": "mariadb+pymysql"}

#: What a database URL looks like, for messages.
URL_EXAMPLES = ("sqlite:////path/to/tuning.sqlite, postgresql://user@host/db, "
                "mysql://user@host/db, mariadb://user@host/db")


def resolve_url(url: str | None = None) -> str:
    """The database URL to open: ``url`` if given, else $QCOMPILE_DB, else :func:`default_url`,
    with a driver-less ``postgresql://``, ``postgres://``, ``mysql://`` or ``mariadb://``
    rewritten to the driver qcompile ships (:data:`SHIPPED_DRIVERS`).

    Parameters
    ----------
    url : str, optional
        A SQLAlchemy URL (``--db``).

    Returns
    -------
    str
        The URL, unchanged when it names a driver or is SQLite.

    Raises
    ------
    qcompile.errors.DatabaseError
        When the text is not a URL, or names a backend the tuning database does not support.
    """
    text = url or os.environ.get(ENV_VAR) or default_url()
    source = "--db" if url else f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the default URL"
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        # Echo the text only when it cannot hold a password (no user part, no query).
        shown = f" {text!r}" if "@" not in text and "?" not in text else ""
        raise DatabaseError(f"{source}{shown} is not a database URL; expected e.g. "
                            f"{URL_EXAMPLES}") from None
    backend, _, driver = parsed.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in BACKENDS:
        raise DatabaseError(f"{source}: database kind {backend!r} is not supported; supported: "
                            f"{', '.join(BACKENDS)} (e.g. {URL_EXAMPLES})")
    drivername = f"{backend}+{driver}" if driver else SHIPPED_DRIVERS.get(backend, backend)
    if drivername == parsed.drivername:
        return text
    return parsed.set(drivername=drivername).render_as_string(hide_password=False)


def redact(url: str) -> str:
    """The URL with any password replaced by ***; safe for output, logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable database URL>"
