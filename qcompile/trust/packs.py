"""The shipped record packs as a read-only database layer (:mod:`tuning_db.record_packs`).

Build reads a pack like any other database below the user's own: its lines are validated as an
import is (:func:`qcompile.trust.records.store_lines`, all of a pack or none of it) into a SQLite
file in the cache, named by a digest of the packs' bytes, so a changed or added pack makes a new
one and an unchanged set is validated once. The records stay claims: build times them here
before it believes them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import targets
from qcompile.trust.records import store_lines
from tuning_db import transfer
from tuning_db.record_packs import SHIPPED_DIR, pack_files, pack_workload_names
from tuning_db.storage import Storage
from tuning_db.url import cache_dir

#: Set to 0 to build without record packs.
PACKS_ENV = "QCOMPILE_PACKS"
#: A directory of packs to read instead of the shipped ones (a team's own, say).
PACKS_DIR_ENV = "QCOMPILE_PACKS_DIR"


def packs_enabled() -> bool:
    return os.environ.get(PACKS_ENV, "1").strip() not in ("0", "off", "false", "no")


def packs_dir() -> Path:
    """``$QCOMPILE_PACKS_DIR``, else the shipped packs' directory."""
    return Path(os.environ.get(PACKS_DIR_ENV) or SHIPPED_DIR)


def pack_layer(directory: str | Path | None = None, *, preset=None,
               names: Iterable[str] | None = None) -> Storage | None:
    """A read-only :class:`Storage` holding every pack of ``directory`` (default
    :func:`packs_dir`) made for ``preset``'s target on this host (None: every pack) that holds
    one of the workloads ``names`` (None: any), validated; None when there are none or
    ``$QCOMPILE_PACKS`` is 0. (A build validates only the packs it can use: the first build in
    a fresh cache pays for them.)"""
    if not packs_enabled():
        return None
    target = None if preset is None else targets.preset_label(
        preset.tvm_target(preset.hardware()))
    packs = pack_files(directory or packs_dir(), target=target)  # headers only: every build
    if names is not None:
        wanted = set(names)
        packs = [(name, pack) for name, pack in packs if wanted & pack_workload_names(pack)]
    if not packs:
        return None
    digest = hashlib.sha256()
    for name, pack in packs:
        digest.update(name.encode() + b"\0" + pack.read_bytes())
    folder = cache_dir() / "packs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest.hexdigest()[:24]}.sqlite"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        storage = Storage(f"sqlite:///{tmp}")
        try:
            for name, pack in packs:
                store_lines(storage, transfer.read_jsonl(pack), origin=f"pack {name}",
                            source=str(pack))
        finally:
            storage.close()
        tmp.replace(path)
    return Storage(f"sqlite:///{path}", readonly=True)
