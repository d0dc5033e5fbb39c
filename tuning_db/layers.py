"""The layered lookup: a shared team database first, then the local one.

``qcompile tune/build --db URL`` read records from the shared database at URL and from the
user's local SQLite file, in that order. Writes go to the shared database, unless it is opened
read-only (``--db-readonly``): then new records go to the local database, and a read-only
shared database still serves every lookup. With no shared database there is one layer, the
local one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tuning_db.storage import Storage
from tuning_db.url import ENV_VAR, default_url, resolve_url


@dataclass
class Layers:
    """Where records are read from (in order) and where new ones are written.

    Attributes
    ----------
    writer : Storage
        Receives new workloads and records.
    readers : list of Storage
        Lookup order: the shared database first, then the local one; ``writer`` is among them.
    """

    writer: Storage
    readers: list[Storage]
    #: The record packs' layer (tuning_db.record_packs), the last reader, when build reads them.
    packs: Storage | None = None

    @classmethod
    def single(cls, storage: Storage) -> Layers:
        return cls(writer=storage, readers=[storage])

    def describe(self) -> str:
        """The databases in lookup order, secrets masked (``display_url``); the writer marked."""
        parts = []
        for storage in self.readers:
            mark = ("" if storage is self.writer else
                    " (record packs)" if storage is self.packs else " (read-only)")
            parts.append(storage.display_url + mark)
        return " then ".join(parts)


def _same_database(a: str, b: str) -> bool:
    try:
        pa, pb = make_url(a), make_url(b)
    except (ArgumentError, ValueError):  # Storage says so, without the URL's secrets
        return False
    if pa.get_backend_name() == pb.get_backend_name() == "sqlite":
        return Path(pa.database or "").expanduser().resolve() == \
            Path(pb.database or "").expanduser().resolve()
    return pa == pb


def open_layers(url: str | None = None, *, readonly: bool = False,
                local_url: str | None = None) -> Layers:
    """Open the shared database ``url`` (default $QCOMPILE_DB) layered over the local one.

    Parameters
    ----------
    url : str, optional
        The shared database. With neither it nor $QCOMPILE_DB, only the local one is used.
    readonly : bool
        Open the shared database read-only: writes go to the local database.
    local_url : str, optional
        The local database; default the SQLite file in the user's cache directory.
    """
    import os

    local = local_url or default_url()
    shared = url or os.environ.get(ENV_VAR)
    if not shared or _same_database(resolve_url(shared), local):
        storage = Storage(shared or local, readonly=readonly)
        return Layers.single(storage)
    shared_storage = Storage(shared, readonly=readonly)
    if not readonly:
        local_path = make_url(local).database
        if local_path and not Path(local_path).expanduser().exists():
            # Nothing local to read: the shared database is the only layer.
            return Layers.single(shared_storage)
    local_storage = Storage(local)
    writer = local_storage if readonly else shared_storage
    return Layers(writer=writer, readers=[shared_storage, local_storage])
