"""Kernel families by name, and specs from their JSON."""

from __future__ import annotations

from typing import Any

from qcompile.errors import SpecError
from qcompile.kernels.base import KernelFamily, KernelSpec, PreparedWeights
from qcompile.kernels.bcq import FAMILY as BCQ
from qcompile.kernels.bcq import BcqSpec
from qcompile.kernels.mixed import FAMILY as MIXED
from qcompile.kernels.mixed import MixedSpec
from qcompile.kernels.uniform import FAMILY as UNIFORM
from qcompile.kernels.uniform import UniformSpec

FAMILIES: dict[str, KernelFamily] = {family.name: family for family in (UNIFORM, BCQ, MIXED)}


def get_family(name: str) -> KernelFamily:
    """The family called ``name``; raises ``SpecError`` listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise SpecError(f"Unknown kernel family {name!r}; known: {', '.join(FAMILIES)}") from None


def family_of(spec: KernelSpec) -> KernelFamily:
    return get_family(spec.family)


def spec_from_dict(data: dict[str, Any]) -> KernelSpec:
    """Rebuild a spec from ``spec.to_dict()`` (a manifest, a database row)."""
    if "family" not in data:
        raise SpecError(f"spec {data} names no family")
    return get_family(data["family"]).spec_type.from_dict(data)


__all__ = [
    "FAMILIES",
    "BcqSpec",
    "KernelFamily",
    "KernelSpec",
    "MixedSpec",
    "PreparedWeights",
    "UniformSpec",
    "family_of",
    "get_family",
    "spec_from_dict",
]
