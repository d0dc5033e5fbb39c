"""The manifest beside every exported kernel: what it computes, for which target, what the
library needs of the machine that runs it, from which tuning record, built by which versions,
and the sha256 of the ``.so`` it describes.

Kept free of TVM so that a manifest can be read (and a kernel refused) without loading anything.
:func:`read_manifest` validates all of it before the loader looks at the library: every field's
type, the names that may become file names or symbols, the sha256, the target preset against the
target's kind and ``mcpu``, the spec (by the spec classes' own checks, the ones the command line
uses), and the CPU features it records against those its ``mcpu`` implies. A manifest that fails
any of these is refused with one line (:class:`~qcompile.errors.LoadError`) naming the field.

Format 2 (this one) adds ``requires``: the /proc/cpuinfo flags the library needs
(``cpu_flags``, targets/isa.py) and, for CUDA, the GPU architecture (``cuda_arch``). Format 1
manifests are refused with "rebuild with qcompile build".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import targets
from qcompile.errors import LoadError
from qcompile.kernels import FAMILIES, family_of, spec_from_dict
from targets import cuda, isa
from targets.isa import target_cpu_flags

MANIFEST_FORMAT = 2
_REQUIRED = ("format", "name", "function", "spec", "target", "record", "versions", "sha256",
             "requires")

#: Bounds on what a manifest may hold (ours are about 2 KB, 5 levels deep).
MAX_BYTES = 1 << 20
_MAX_DEPTH = 12
_MAX_NODES = 10_000
_MAX_STRING = 4096
_MAX_INT = (1 << 63) - 1

#: A kernel name and its symbol: what ``KernelSpec.name()`` makes (C identifier, lower case).
_NAME = re.compile(r"[a-z][a-z0-9_]{0,199}")
#: A file name beside the .so: no directory part, no leading dot.
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FLAG = re.compile(r"[a-z0-9_]{1,40}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")

#: Keys of a TVM target dict that qcompile's presets produce, besides those checked by value
#: (``kind``, ``mcpu``, ``arch``, ``host``). Any other key (``mattr``, ``mtriple``, ...) could
#: change the instructions in the library, so a manifest that has one is refused.
_TARGET_INT_KEYS = {
    "cpu": ("num-cores",),
    "cuda": ("max_num_threads", "registers_per_block", "thread_warp_size",
             "max_shared_memory_per_block", "l2_cache_size_bytes", "max_threads_per_block"),
}


def sha256_of(path: Path) -> str:
    """The sha256 of a file.

    Parameters
    ----------
    path : Path

    Returns
    -------
    str
        64 lower-case hex digits (the file read in 1 MiB chunks).
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(so_path: str | Path) -> Path:
    """Where a library's manifest is.

    Parameters
    ----------
    so_path : str or Path
        ``DIR/<name>.so``.

    Returns
    -------
    Path
        ``DIR/<name>.json``.
    """
    return Path(so_path).with_suffix(".json")


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest (see :func:`read_manifest`).

    Attributes
    ----------
    data : dict
        The JSON object as read.
    kernel_spec : KernelSpec
        The spec, parsed and validated.
    target_preset : targets.Preset
        The preset the library was built for, consistent with ``data["target"]``.
    cpu_flags : tuple of str
        /proc/cpuinfo flags the library needs on the CPU that runs it (for CUDA: its host code).
    cuda_arch : str or None
        The GPU architecture of a CUDA library (``"sm_90"``); None for CPU libraries.
    """

    data: dict[str, Any]
    kernel_spec: Any = None
    target_preset: Any = None
    cpu_flags: tuple[str, ...] = ()
    cuda_arch: str | None = None

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

    @property
    def tvm_target(self) -> dict[str, Any]:
        return self.data["target"]["tvm"]


class _Refusal(Exception):
    """A rule a manifest breaks (turned into a LoadError naming the manifest)."""


def _show(value: Any) -> str:
    """A short one-line repr of a manifest value, for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    """The JSON type name of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _expect(value: Any, kind: type | tuple, where: str, what: str) -> Any:
    """``value`` if it is of ``kind`` (bools never count as numbers), else refuse."""
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)))
    if not ok:
        raise _Refusal(f"{where} must be {what}; got {_kind(value)} {_show(value)}")
    return value


def _match(value: Any, pattern: re.Pattern, where: str, what: str) -> str:
    _expect(value, str, where, what)
    if not pattern.fullmatch(value):
        raise _Refusal(f"{where} must be {what}; got {_show(value)}")
    return value


def _object(value: Any, where: str) -> dict:
    return _expect(value, dict, where, "a JSON object")


def _count(value: Any, where: str, low: int = 1, high: int = 1 << 31) -> int:
    _expect(value, int, where, "an integer")
    if not low <= value <= high:
        raise _Refusal(f"{where} must be between {low} and {high}; got {value}")
    return value


def _walk(value: Any, where: str, depth: int, budget: list[int]) -> None:
    """Bounds on any JSON value: nesting, size, integers within int64, finite numbers."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Refusal(f"holds more than {_MAX_NODES} values")
    if depth > _MAX_DEPTH:
        raise _Refusal(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if abs(value) > _MAX_INT:
            raise _Refusal(f"{where} is a number beyond 64 bits ({len(str(abs(value)))} digits)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Refusal(f"{where} is a number too large to represent ({value})")
    elif isinstance(value, str):
        if len(value) > _MAX_STRING:
            raise _Refusal(f"{where} is a string of {len(value)} characters (at most "
                           f"{_MAX_STRING})")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{where}[{index}]", depth + 1, budget)
    elif isinstance(value, dict):
        for key, item in value.items():
            if len(key) > 256:
                raise _Refusal(f"{where} has a key of {len(key)} characters")
            _walk(item, f"{where}.{key}" if where else key, depth + 1, budget)


def _parse(path: Path) -> Any:
    """The JSON value in ``path``; raises LoadError for anything but a readable, bounded,
    UTF-8 JSON document."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise LoadError(f"no manifest {path} beside {path.with_suffix('.so')}: qcompile build "
                        "writes both; copy them together") from None
    except OSError as error:
        raise LoadError(f"manifest {path} cannot be read: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise LoadError(f"manifest {path} is not a regular file")
    if info.st_size > MAX_BYTES:
        raise LoadError(f"manifest {path} is {info.st_size} bytes; a manifest has at most "
                        f"{MAX_BYTES} (qcompile build writes about 2 KB)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise LoadError(f"manifest {path} cannot be read: {error.strerror or error}") from None
    if len(raw) > MAX_BYTES:
        raise LoadError(f"manifest {path} is over {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LoadError(f"manifest {path} is unreadable or corrupt: not UTF-8 text (byte "
                        f"0x{raw[error.start]:02x} at offset {error.start})") from None

    def no_constants(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as error:
        raise LoadError(f"manifest {path} is unreadable or corrupt: {error.msg} (line "
                        f"{error.lineno}, column {error.colno})") from None
    except (ValueError, RecursionError) as error:  # huge integers, NaN, deep nesting
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if isinstance(error, RecursionError):
            reason = "nested too deeply"
        raise LoadError(f"manifest {path} is unreadable or corrupt: {reason}") from None


def _check_spec(data: Any):
    """The spec object -> a KernelSpec, through the spec classes' own validation (the one the
    command line's flags go through), after checking each field's JSON type."""
    data = _object(data, "spec")
    family = _match(data.get("family"), _IDENT, "spec.family", "a family name")
    if family not in FAMILIES:
        raise _Refusal(f"spec.family {family!r} is not a kernel family; known: "
                       f"{', '.join(FAMILIES)}")
    spec_type = FAMILIES[family].spec_type
    types = {field.name: str(field.type) for field in fields(spec_type)}
    for key, value in data.items():
        if key == "family":
            continue
        if key not in types:
            raise _Refusal(f"spec has field {_show(key)}, which a {family} spec does not have; "
                           f"known: {', '.join(sorted(types))}")
        expected = types[key]
        where = f"spec.{key}"
        if expected == "int":
            _expect(value, int, where, "an integer")
        elif expected == "float":
            _expect(value, (int, float), where, "a number")
        elif expected == "bool":
            _expect(value, bool, where, "true or false")
        elif expected == "str":
            _expect(value, str, where, "a string")
    try:
        return spec_from_dict(data)
    except Exception as error:  # the spec's own rules (SpecError), or any surprise in them
        reason = " ".join(str(error).split()) or type(error).__name__
        raise _Refusal(f"spec is invalid: {reason}") from None


def _check_llvm(tvm: dict, where: str, mcpu: str, extra_int_keys: tuple[str, ...]) -> None:
    """An ``llvm`` target dict as our presets make it: ``mcpu`` and nothing that could change
    the instructions (``mattr``, ``mtriple``, ...)."""
    if tvm.get("kind") != "llvm":
        raise _Refusal(f"{where}.kind must be 'llvm'; got {_show(tvm.get('kind'))}")
    if tvm.get("mcpu") != mcpu:
        raise _Refusal(f"{where}.mcpu is {_show(tvm.get('mcpu'))}, but the preset builds for "
                       f"mcpu {mcpu!r}")
    _check_common_keys(tvm, where, {"kind", "mcpu", *extra_int_keys})


def _check_common_keys(tvm: dict, where: str, checked: set[str]) -> None:
    for key, value in tvm.items():
        if key in checked:
            continue
        if key == "tag":
            _expect(value, str, f"{where}.tag", "a string")
        elif key == "keys":
            _expect(value, list, f"{where}.keys", "an array of strings")
            for item in value:
                _match(item, _IDENT, f"{where}.keys[]", "a target key")
        else:
            raise _Refusal(f"{where} has {_show(key)}, which no target of qcompile's presets "
                           "has (it may change the code the library holds)")


def _check_target(data: Any, requires: Any) -> tuple[Any, tuple[str, ...], str | None]:
    """The target and requires objects -> (preset, needed CPU flags, CUDA arch)."""
    target = _object(data, "target")
    name = _match(target.get("preset"), _IDENT, "target.preset", "a target preset name")
    try:
        preset = targets.get(name)
    except ValueError as error:
        raise _Refusal(f"target.preset: {error}") from None
    if target.get("kind") != preset.kind:
        raise _Refusal(f"target.kind is {_show(target.get('kind'))}, but preset {name!r} is a "
                       f"{preset.kind} target")
    tvm = _object(target.get("tvm"), "target.tvm")
    for key in _TARGET_INT_KEYS[preset.kind]:
        if key in tvm:
            _count(tvm[key], f"target.tvm.{key}", 1, _MAX_INT)
    requires = _object(requires, "requires")
    flags = _expect(requires.get("cpu_flags"), list, "requires.cpu_flags",
                    "an array of /proc/cpuinfo flags")
    if len(flags) > 256:
        raise _Refusal(f"requires.cpu_flags lists {len(flags)} flags (at most 256)")
    for flag in flags:
        _match(flag, _FLAG, "requires.cpu_flags[]", "a /proc/cpuinfo flag name")
    arch = requires.get("cuda_arch")
    if preset.kind == "cpu":
        _check_llvm(tvm, "target.tvm", preset.mcpu, _TARGET_INT_KEYS["cpu"])
        mcpu = preset.mcpu
        if arch is not None:
            raise _Refusal(f"requires.cuda_arch is {_show(arch)}, but {name!r} is a CPU target")
    else:
        expected_arch = preset.gpu.arch
        if tvm.get("kind") != "cuda":
            raise _Refusal(f"target.tvm.kind must be 'cuda'; got {_show(tvm.get('kind'))}")
        if tvm.get("arch") != expected_arch:
            raise _Refusal(f"target.tvm.arch is {_show(tvm.get('arch'))}, but preset {name!r} "
                           f"builds for {expected_arch}")
        if arch != expected_arch:
            raise _Refusal(f"requires.cuda_arch is {_show(arch)}, but the target's arch is "
                           f"{expected_arch}")
        mcpu = cuda.HOST_TARGET["mcpu"]
        host = _object(tvm.get("host"), "target.tvm.host")
        _check_llvm(host, "target.tvm.host", mcpu, ())
        _check_common_keys(tvm, "target.tvm", {"kind", "arch", "host",
                                               *_TARGET_INT_KEYS["cuda"]})
    implied = isa.implied_flags(mcpu) or ()
    left_out = sorted(set(implied) - set(flags))
    if left_out:
        raise _Refusal(f"is inconsistent: mcpu {mcpu} implies CPU flags {', '.join(left_out)}, "
                       "which requires.cpu_flags leaves out")
    return preset, tuple(sorted(set(flags))), arch


def _check_layout(layout: Any, spec) -> None:
    if layout is None:
        return
    layout = _object(layout, "layout")
    _match(layout.get("kind"), _IDENT, "layout.kind", "a layout name")
    for key, value in layout.items():
        _match(key, _IDENT, "layout key", "a name")
        if key != "kind":
            _count(value, f"layout.{key}", 0)

    try:
        family_of(spec).describe_layout(layout)
    except Exception:  # a layout its family cannot read (a missing field, say)
        raise _Refusal(f"layout {_show(layout)} is not a layout of the {spec.family} "
                       "family") from None


def _validate(data: Any) -> Manifest:
    """Check a parsed manifest completely; raises ``_Refusal`` naming the rule it breaks.

    Parameters
    ----------
    data : Any
        ``json.loads`` of the manifest.

    Returns
    -------
    Manifest
    """
    if not isinstance(data, dict):
        raise _Refusal(f"must hold a JSON object; got {_kind(data)}")
    _walk(data, "", 0, [_MAX_NODES])
    if "format" not in data:
        raise _Refusal("lacks format: rebuild with qcompile build")
    version = _expect(data["format"], int, "format", "an integer")
    if version != MANIFEST_FORMAT:
        newer = "a newer" if version > MANIFEST_FORMAT else "an older"
        raise _Refusal(f"has format {version}, from {newer} qcompile; this one reads format "
                       f"{MANIFEST_FORMAT} (it records the CPU features the library needs): "
                       "rebuild with qcompile build")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise _Refusal(f"lacks {', '.join(missing)}: rebuild with qcompile build")
    _match(data["sha256"], _HEX64, "sha256", "64 lower-case hex digits")
    name = _match(data["name"], _NAME, "name", "a kernel name ([a-z][a-z0-9_]*)")
    function = _match(data["function"], _NAME, "function", "a symbol ([a-z][a-z0-9_]*)")
    record = _object(data["record"], "record")
    if record.get("id") is not None:
        _count(record["id"], "record.id", 0, _MAX_INT)
    for key, value in _object(data["versions"], "versions").items():
        _expect(value, str, f"versions.{key}", "a string")
    for key, value in _object(data.get("files", {}), "files").items():
        _match(value, _FILE, f"files.{key}", "a file name without a directory")
    if "built_at" in data:
        _expect(data["built_at"], str, "built_at", "a string")
    preset, flags, arch = _check_target(data["target"], data["requires"])
    spec = _check_spec(data["spec"])
    if name != spec.name():
        raise _Refusal(f"name {name!r} is not its spec's name {spec.name()!r}")
    if function != name:
        raise _Refusal(f"function {function!r} is not the kernel's name {name!r}")
    if "spec_digest" in data:
        digest = _match(data["spec_digest"], _HEX64, "spec_digest", "64 lower-case hex digits")
        if digest != spec.digest():
            raise _Refusal("spec_digest does not match its spec (built by another version of "
                           "the kernel's TensorIR): rebuild with qcompile build")
    _check_layout(data.get("layout"), spec)
    return Manifest(data, kernel_spec=spec, target_preset=preset, cpu_flags=flags,
                    cuda_arch=arch)


def read_manifest(so_path: str | Path) -> Manifest:
    """Read and check the manifest beside ``so_path``.

    Parameters
    ----------
    so_path : str or Path
        The library; its manifest is ``<name>.json`` beside it.

    Returns
    -------
    Manifest
        Validated completely (module docstring); the host is not consulted.

    Raises
    ------
    LoadError
        One line naming the manifest and the rule it breaks: missing, unreadable, not UTF-8,
        not JSON, out of bounds, a field missing or of the wrong type, an old format, or fields
        inconsistent with each other.
    """
    path = manifest_path(so_path)
    data = _parse(path)
    try:
        return _validate(data)
    except _Refusal as refusal:
        message = " ".join(str(refusal).split())
        raise LoadError(f"manifest {path} {message}" if message.startswith(
            ("lacks", "has format", "is ", "must ", "holds")) else
            f"manifest {path}: {message}") from None


def requires_of(tvm_target: dict) -> dict[str, Any]:
    """The manifest's ``requires`` for a library built for ``tvm_target``: the /proc/cpuinfo
    flags its CPU code needs (through LLVM, targets/isa.py; loads TVM) and, for a CUDA target,
    the GPU architecture.

    Parameters
    ----------
    tvm_target : dict
        The target as ``qcompile._tvm.target_dict`` prints it.

    Returns
    -------
    dict
        ``{"cpu_flags": [...], "cuda_arch": "sm_90" or None}``.
    """
    cuda = tvm_target.get("kind") == "cuda"
    return {"cpu_flags": list(target_cpu_flags(tvm_target)),
            "cuda_arch": tvm_target.get("arch") if cuda else None}


def write_manifest(so_path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` (plus ``format``) as the manifest beside ``so_path``, atomically.

    Parameters
    ----------
    so_path : Path
        The library the manifest describes.
    data : dict
        Every field but ``format`` (qcompile/build.py's ``export`` lists them).

    Returns
    -------
    Path
        The manifest's path.
    """
    path = manifest_path(so_path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, **data}, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
