"""What this host is, read from Linux's /proc and /sys. Every probe returns a value or None and
never raises: a missing file or an odd format only means "unknown"."""

from __future__ import annotations

import fnmatch
import os
import platform
import re
import subprocess
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


#: A testing aid: /proc/cpuinfo flags to treat as absent, comma- or space-separated, shell
#: patterns allowed (``QCOMPILE_HIDE_CPU_FLAGS="avx512*"`` presents an AVX2-only host). It can
#: only remove flags, so it can only make qcompile refuse more (a library, a tuning run), never
#: run code the CPU lacks.
HIDE_FLAGS_ENV = "QCOMPILE_HIDE_CPU_FLAGS"


def hidden_patterns() -> tuple[str, ...]:
    """The flag patterns to treat as absent.

    Returns
    -------
    tuple of str
        The items of ``$QCOMPILE_HIDE_CPU_FLAGS`` (empty when unset).
    """
    text = os.environ.get(HIDE_FLAGS_ENV, "")
    return tuple(item for item in re.split(r"[\s,]+", text) if item)


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """ISA flags of the first CPU in /proc/cpuinfo (e.g. 'avx2', 'avx512f'); empty if unknown.

    Flags matching ``$QCOMPILE_HIDE_CPU_FLAGS`` (:data:`HIDE_FLAGS_ENV`, read once) are left
    out, so tests can present a host with fewer features than this one.
    """
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            hidden = hidden_patterns()
            return frozenset(flag for flag in flags
                             if not any(fnmatch.fnmatchcase(flag, pattern) for pattern in hidden))
    return frozenset()


def hidden_note() -> str:
    """A note for messages that describe this host's CPU.

    Returns
    -------
    str
        ``", flags hidden by $QCOMPILE_HIDE_CPU_FLAGS=..."`` when the variable is set, else "".
    """
    hidden = hidden_patterns()
    return f", flags hidden by ${HIDE_FLAGS_ENV}={','.join(hidden)}" if hidden else ""


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


_GETCONF_NAMES = {1: "LEVEL1_DCACHE_SIZE", 2: "LEVEL2_CACHE_SIZE", 3: "LEVEL3_CACHE_SIZE"}


@lru_cache(maxsize=1)
def _getconf_all() -> dict[str, str]:
    """``getconf -a`` as a dict; glibc answers the cache sizes from the CPUID instruction."""
    try:
        result = subprocess.run(["getconf", "-a"], capture_output=True, text=True, timeout=5,
                                check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def cpuid_cache_bytes(level: int) -> int | None:
    """Cache size at ``level`` (1 = L1d, 2, 3) as CPUID reports it through glibc's ``getconf``;
    None when unknown. The fallback when sysfs says nothing (containers without /sys)."""
    value = _getconf_all().get(_GETCONF_NAMES.get(level, ""))
    try:
        size = int(value) if value is not None else 0
    except ValueError:
        return None
    return size if size > 0 else None


def detected_cache_bytes(level: int) -> int | None:
    """sysfs first, then CPUID (``getconf``); None if neither knows."""
    return cache_bytes(level) or cpuid_cache_bytes(level)


def hostname() -> str:
    return platform.node() or "unknown"
