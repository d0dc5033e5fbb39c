"""Record packs: a curated JSON lines export of one target and one device model, the fastest
record of each workload, that qcompile ships so that a fresh install builds common shapes with
no tuning.

A pack is a :mod:`tuning_db.transfer` JSON lines file whose header also carries a ``"pack"``
object: its name, the target (as ``qcompile targets`` names it), the device model its records
were measured on, when and by which qcompile it was made. Its records keep their provenance and
seals; its workloads carry their spec, target and the TensorIR's structural hash, not the
TensorIR itself (the reader rebuilds it from the spec, as it does for any import). Nothing in a
pack is trusted for being shipped: its lines are validated like any import
(:mod:`qcompile.trust.records`), and a build times a pack's records on its own machine before
it believes their latency (:mod:`qcompile.trust.choice`), once; the measurement it stores, sealed
with the host's key, serves every later build.

The shipped packs live in ``tuning_db/packs/*.jsonl``; ``qcompile db packs`` lists them and
``qcompile db export --pack NAME`` makes one.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from qcompile.errors import DatabaseError
from tuning_db import transfer
from tuning_db.models import STATUS_OK
from tuning_db.storage import Storage

#: Where the packs that ship with qcompile live.
SHIPPED_DIR = Path(__file__).with_name("packs")
#: The header key that makes an export a pack.
PACK_KEY = "pack"
#: The longest pack name, and its characters (it names a file).
MAX_NAME = 80
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class PackInfo:
    """What a pack's header and lines say about it.

    Attributes
    ----------
    name, target, device_model, created_at, qcompile_version : str
        From the header's ``"pack"`` object.
    path : Path
    workloads, records, measurements : int
        Lines of each kind.
    sealed : int
        Records whose tune measurement carries a seal: the maker's host or team vouched for
        them (a reader believes them only with the same key; others time them once).
    """

    name: str
    target: str
    device_model: str
    created_at: str
    qcompile_version: str
    path: Path
    workloads: int
    records: int
    measurements: int
    sealed: int


def check_name(name: str) -> str:
    """A pack name: lower-case letters, digits, ``-_.``, 1..:data:`MAX_NAME` characters."""
    if not name or len(name) > MAX_NAME or not set(name) <= _NAME_CHARS or name[0] == ".":
        raise DatabaseError(f"pack name {name!r} must be 1-{MAX_NAME} characters of a-z, 0-9, "
                            "'-', '_' and '.', not starting with '.'")
    return name


#: The string fields of a pack's header object.
HEADER_FIELDS = ("name", "target", "device_model", "created_at", "qcompile_version")


def read_pack_header(path: str | Path) -> dict:
    """The ``"pack"`` object of the header of the pack at ``path`` (its first line only);
    DatabaseError (one line) when it is not a pack: not an export, no ``"pack"`` object, or one
    with missing or non-string fields, or a bad name."""
    path = Path(path)
    pack = transfer.read_header(path).get(PACK_KEY)
    if not isinstance(pack, dict) or not all(isinstance(pack.get(f), str)
                                             for f in HEADER_FIELDS):
        raise DatabaseError(f"{path}: not a record pack (its first line needs a \"{PACK_KEY}\" "
                            f"object with string fields {', '.join(HEADER_FIELDS)})")
    check_name(pack["name"])
    return pack


def read_pack_info(path: str | Path) -> PackInfo:
    """The :class:`PackInfo` of the pack at ``path`` (its header, and its lines counted)."""
    path = Path(path)
    pack = read_pack_header(path)
    counts = {"workload": 0, "record": 0, "measurement": 0}
    sealed = 0
    for _, line in transfer.read_jsonl(path):
        kind = line.get("type") if isinstance(line, dict) else None
        if kind in counts:
            counts[kind] += 1
            sealed += kind == "record" and bool(line.get("seal"))
    return PackInfo(**{f: pack[f] for f in HEADER_FIELDS}, path=path,
                    workloads=counts["workload"], records=counts["record"],
                    measurements=counts["measurement"], sealed=sealed)


def pack_files(directory: str | Path = SHIPPED_DIR, *,
               target: str | None = None) -> list[tuple[str, Path]]:
    """(name, path) of every pack in ``directory`` made for ``target`` (as a header names it,
    ``avx2 (2 cores)``; None: every pack), by name, from their headers alone."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    headers = [(read_pack_header(p), p) for p in directory.glob("*.jsonl")]
    return sorted((header["name"], p) for header, p in headers
                  if target is None or header["target"] == target)


def pack_workload_names(path: str | Path) -> set[str]:
    """The names of the workloads a pack holds (``uniform_b4_g128_k4096_n4096_m1_f32``), from
    its workload lines; nothing is validated here."""
    return {line["name"] for _, line in transfer.read_jsonl(path)
            if isinstance(line, dict) and line.get("type") == "workload"
            and isinstance(line.get("name"), str)}


def shipped_packs(directory: str | Path = SHIPPED_DIR) -> list[PackInfo]:
    """Every pack in ``directory`` (default the shipped ones), by name, lines counted."""
    return [read_pack_info(path) for _, path in pack_files(directory)]


def write_pack(storage: Storage, path: str | Path, *, name: str, target_label,
               name_filter: str | None = None, target_filter=None,
               qcompile_version: str = "") -> transfer.TransferCount:
    """Write the fastest successful record of each selected workload of ``storage``, with its
    measurements, as the pack ``name`` at ``path``.

    Parameters
    ----------
    target_label : callable
        ``target_label(target_json) -> str``: the target as the header names it.
    name_filter : str, optional
        Only workloads whose name contains it.
    target_filter : callable, optional
        ``target_filter(target_json) -> bool``: only workloads of the targets it accepts.

    Raises
    ------
    DatabaseError
        Nothing selected, or the selected records span several targets or device models (a pack
        is one of each: the message lists them).
    """
    check_name(name)
    chosen = []
    for workload in storage.workloads():
        if name_filter and name_filter not in workload.name:
            continue
        if target_filter and not target_filter(workload.target_json):
            continue
        best = [r for r in storage.top_records(workload.id, 1) if r.status == STATUS_OK]
        if best:
            chosen.append((workload, best[0]))
    if not chosen:
        raise DatabaseError(f"no successful record in {storage.display_url} matches the pack's "
                            "filters: nothing to pack")
    labels = sorted({target_label(w.target_json) for w, _ in chosen})
    models = sorted({r.device_model for _, r in chosen})
    if len(labels) > 1 or len(models) > 1:
        raise DatabaseError(f"a pack holds one target and one device model; the selection has "
                            f"targets {labels} and device models {models}: narrow it with "
                            "--target or --name")
    workloads = {w.digest for w, _ in chosen}
    records = {r.digest for _, r in chosen}

    def selected(line: dict) -> bool:
        return (line["type"] == "workload" and line["digest"] in workloads
                or line["type"] == "record" and line["digest"] in records
                or line["type"] == "measurement" and line["record"] in records)

    def lines():
        for line in transfer.database_lines(storage, name=name_filter):
            if selected(line):
                if line["type"] == "record":
                    line["origin"] = f"pack {name}"
                if line["type"] == "workload":
                    # the reader rebuilds the TensorIR from the spec and checks its hash
                    # (qcompile.trust.records); the text would be megabytes a kernel on GPUs
                    del line["mod_json"]
                yield line

    header = {PACK_KEY: {"name": name, "target": labels[0], "device_model": models[0],
                         "created_at": datetime.datetime.now(datetime.UTC).isoformat(
                             timespec="seconds"),
                         "qcompile_version": qcompile_version}}
    return transfer.write_jsonl(path, lines(), header=header)
