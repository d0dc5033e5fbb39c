"""Target presets by name, and the identity of a target in the tuning database.

>>> import targets
>>> targets.get("avx2").tvm_target()            # doctest: +SKIP
{'kind': 'llvm', 'mcpu': 'core-avx2', 'num-cores': 2}
"""

from __future__ import annotations

import functools
import hashlib
import json

from targets.cpu import AVX2, AVX512, CpuPreset
from targets.cuda import CUDA, CUDA_SM80, CUDA_SM89, CUDA_SM90, CudaPreset

Preset = CpuPreset | CudaPreset

PRESETS: dict[str, Preset] = {
    preset.name: preset for preset in (AVX2, AVX512, CUDA, CUDA_SM80, CUDA_SM89, CUDA_SM90)
}


def get(name: str) -> Preset:
    """The preset called ``name``; raises ``ValueError`` listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"Unknown target {name!r}; known targets: {', '.join(PRESETS)}") from None


def preset_of(target: dict) -> Preset | None:
    """The preset a target (as TVM prints it, a stored record's) was made from, or None.

    A CPU preset gives its ``mcpu`` with any core count; a CUDA preset its whole GPU model
    (``cuda`` and ``sm90`` share ``sm_90`` and differ in L2 size).
    """
    for preset, wanted in _preset_targets():
        if _holds(target, wanted):
            return preset
    return None


@functools.cache
def _preset_targets() -> tuple[tuple[Preset, dict], ...]:
    return tuple((preset, preset.tvm_target(preset.hardware(cores=1) if preset.kind == "cpu"
                                            else None)) for preset in PRESETS.values())


def preset_label(target: dict) -> str:
    """How the user names a target: the preset as typed, with a CPU target's cores (they are
    part of its identity): ``avx2 (2 cores)``, ``cuda``. A target no preset gives is shown as
    its kind and CPU or architecture (``llvm znver4 8c``)."""
    preset = preset_of(target)
    cores = target.get("num-cores")
    if preset is None:
        detail = target.get("mcpu") or target.get("arch") or ""
        return " ".join(str(p) for p in (target.get("kind"), detail, f"{cores}c" if cores else "")
                        if p)
    if preset.kind == "cpu" and cores:
        return f"{preset.name} ({cores} core{'s' if cores != 1 else ''})"
    return preset.name


def _holds(target: dict, wanted: dict) -> bool:
    """Whether ``target`` has every attribute of ``wanted`` (a CPU's core count aside)."""
    for key, value in wanted.items():
        if key == "num-cores":
            continue
        found = target.get(key)
        if isinstance(value, dict):
            if not isinstance(found, dict) or not _holds(found, value):
                return False
        elif found != value:
            return False
    return True


def canonical_json(target: dict) -> str:
    """Target JSON with sorted keys and no spaces: the same target always prints the same."""
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


def target_key(target: dict) -> str:
    """sha256 of a target's canonical JSON: the target half of a workload's database key.

    ``target`` is the dict TVM prints for a ``Target`` (``json.loads(str(target))``), so every
    attribute counts: an avx2 record never answers an avx512 query, nor a 2-core target a
    16-core one.
    """
    return hashlib.sha256(canonical_json(target).encode()).hexdigest()


__all__ = ["PRESETS", "Preset", "canonical_json", "get", "preset_label", "preset_of",
           "target_key"]
