"""Where the tuning database lives, and how to print its URL without its password."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

#: Environment variable naming the database URL when ``--db`` is not given.
ENV_VAR = "QCOMPILE_DB"


def cache_dir() -> Path:
    """qcompile's per-user cache: $XDG_CACHE_HOME/qcompile, else ~/.cache/qcompile."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qcompile"


def default_url() -> str:
    """The embedded SQLite file in the user's cache directory."""
    return f"sqlite:///{cache_dir() / 'tuning.sqlite'}"


def resolve_url(url: str | None = None) -> str:
    """``url`` if given, else $QCOMPILE_DB, else :func:`default_url`."""
    return url or os.environ.get(ENV_VAR) or default_url()


def redact(url: str) -> str:
    """The URL with any password replaced by ***; safe for output, logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable database URL>"
