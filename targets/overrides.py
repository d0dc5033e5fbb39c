"""Overrides of the detected CPU hardware model: ``QCOMPILE_HW`` or ``qcompile targets --hw``.

The text is comma-separated ``key=value`` pairs; sizes take K/M/G suffixes (powers of 1024)::

    QCOMPILE_HW="l1d=48K,l2=2M,l3=32M,cores=8"

Keys: ``l1d``, ``l2``, ``l3`` (bytes), ``cores``, ``vector_registers``, ``vector_bits``. An
override replaces a probe; the ISA numbers of a preset (registers, width) can be overridden too,
for modelling another CPU of the same ISA family (a tuning run still measures this host).
"""

from __future__ import annotations

import os
import re

from qcompile.errors import SpecError

#: Environment variable read by every CPU preset's ``hardware()``.
ENV_VAR = "QCOMPILE_HW"

_KEYS = {"l1d": "l1d_bytes", "l2": "l2_bytes", "l3": "l3_bytes", "cores": "cores",
         "vector_registers": "vector_registers", "vector_bits": "vector_bits"}
_SIZE = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?", re.IGNORECASE)


def _value(key: str, text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise SpecError(f"{ENV_VAR}: {key}={text!r} is not a size or count (e.g. 32K, 2M, 8)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    value = int(match.group(1)) * scale
    if value <= 0:
        raise SpecError(f"{ENV_VAR}: {key} must be positive; got {value}")
    if key == "vector_bits" and value not in (128, 256, 512):
        raise SpecError(f"{ENV_VAR}: vector_bits must be 128, 256 or 512; got {value}")
    return value


def parse(text: str | None) -> dict[str, int]:
    """``"l1d=48K,cores=8"`` -> ``{"l1d_bytes": 49152, "cores": 8}``; raises SpecError naming
    the bad pair and the accepted keys."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise SpecError(f"{ENV_VAR}: {item.strip()!r} is not key=value with a key among "
                            f"{', '.join(_KEYS)}")
        out[_KEYS[key]] = _value(key, value)
    return out


def from_environment() -> dict[str, int]:
    """The overrides in ``$QCOMPILE_HW`` (empty when unset)."""
    return parse(os.environ.get(ENV_VAR))
