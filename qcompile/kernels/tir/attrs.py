"""The attribute a PrimFunc names its compute by (a workload names its compute; see tuning_db)."""

from __future__ import annotations

#: Marks the PrimFunc as this factorisation (a workload names its compute; see tuning_db).
COMPUTE_ATTR = "qcompile.compute"


def compute_name(func) -> str:
    """The compute a PrimFunc is (its :data:`COMPUTE_ATTR`), or "" when it names none."""
    return str(func.attrs.get(COMPUTE_ATTR, "")) if func.attrs is not None else ""
