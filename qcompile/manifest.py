"""The manifest beside every exported kernel: what it computes, for which target, from which
tuning record, built by which versions, and the sha256 of the ``.so`` it describes.

Kept free of TVM so that a manifest can be read (and a kernel refused) without loading anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qcompile.errors import LoadError

MANIFEST_FORMAT = 1
_REQUIRED = ("format", "name", "function", "spec", "target", "record", "versions", "sha256")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(so_path: str | Path) -> Path:
    """``DIR/<name>.json`` for ``DIR/<name>.so``."""
    return Path(so_path).with_suffix(".json")


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest (see :func:`read_manifest`)."""

    data: dict[str, Any]

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def function(self) -> str:
        return self.data["function"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.data["spec"]

    @property
    def preset(self) -> str:
        return self.data["target"]["preset"]

    @property
    def sha256(self) -> str:
        return self.data["sha256"]


def read_manifest(so_path: str | Path) -> Manifest:
    """Read and check the manifest beside ``so_path``; raises :class:`LoadError` if unusable."""
    path = manifest_path(so_path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoadError(f"no manifest {path} beside {so_path}: qcompile build writes both; "
                        "copy them together") from None
    except (OSError, json.JSONDecodeError) as error:
        raise LoadError(f"manifest {path} is unreadable or corrupt: {error}") from None
    if not isinstance(data, dict):
        raise LoadError(f"manifest {path} must hold a JSON object; got {type(data).__name__}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise LoadError(f"manifest {path} lacks {', '.join(missing)}: rebuild with qcompile build")
    if data["format"] != MANIFEST_FORMAT:
        raise LoadError(f"manifest {path} has format {data['format']}; this qcompile reads "
                        f"format {MANIFEST_FORMAT}: rebuild with this version")
    return Manifest(data)


def write_manifest(so_path: Path, data: dict[str, Any]) -> Path:
    path = manifest_path(so_path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, **data}, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
