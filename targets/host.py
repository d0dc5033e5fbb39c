"""What this host is, read from Linux's /proc and /sys. Every probe returns a value or None and
never raises: a missing file or an odd format only means "unknown"."""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from pathlib import Path

_CPU_SYSFS = Path("/sys/devices/system/cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _parse_size(text: str | None) -> int | None:
    """'48K' -> 49152, '2048K' -> 2097152, '32M' -> 33554432 (sysfs cache sizes)."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip().upper())
    if not match:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]
    return int(match.group(1)) * scale


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """ISA flags of the first CPU in /proc/cpuinfo (e.g. 'avx2', 'avx512f'); empty if unknown."""
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name, or the machine type when /proc/cpuinfo does not say."""
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cache_bytes(level: int, kind: str = "Data") -> int | None:
    """Size in bytes of cpu0's cache at ``level`` (kind 'Data' or 'Unified' for L1d/L2/L3)."""
    base = _CPU_SYSFS / "cpu0" / "cache"
    try:
        entries = sorted(base.glob("index*"))
    except OSError:
        return None
    for entry in entries:
        if _read(entry / "level") != str(level):
            continue
        if _read(entry / "type") not in (kind, "Unified"):
            continue
        return _parse_size(_read(entry / "size"))
    return None


def hostname() -> str:
    return platform.node() or "unknown"
