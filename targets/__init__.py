"""Target presets by name, and the identity of a target in the tuning database.

>>> import targets
>>> targets.get("avx2").tvm_target()            # doctest: +SKIP
{'kind': 'llvm', 'mcpu': 'core-avx2', 'num-cores': 2}
"""

from __future__ import annotations

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


__all__ = ["PRESETS", "Preset", "canonical_json", "get", "target_key"]
