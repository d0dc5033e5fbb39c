"""Design spaces: for each (kernel family, target class) a function that turns an unscheduled
workload into one or more schedules whose tile sizes are MetaSchedule sampling decisions.

Every module exposes ``design_space(sch, spec, hw) -> list[Schedule]``; :func:`space_generator`
wraps it into the ``ScheduleFn`` MetaSchedule tunes over.
"""

from __future__ import annotations

from collections.abc import Callable

from qcompile.errors import SpecError
from qcompile.kernels.base import KernelSpec
from schedules.cpu import uniform as cpu_uniform

DesignSpace = Callable  # (Schedule, spec, hardware) -> list[Schedule]

_SPACES: dict[tuple[str, str], DesignSpace] = {
    ("uniform", "cpu"): cpu_uniform.design_space,
}


def get_design_space(spec: KernelSpec, target_class: str) -> DesignSpace:
    """The design-space function for ``spec``'s family on ``target_class`` ("cpu", "cuda")."""
    try:
        return _SPACES[(spec.family, target_class)]
    except KeyError:
        known = ", ".join(f"{f}/{t}" for f, t in sorted(_SPACES))
        raise SpecError(
            f"no design space for family {spec.family!r} on {target_class!r}; known: {known}"
        ) from None


def space_generator(spec: KernelSpec, target_class: str, hw):
    """MetaSchedule ``ScheduleFn`` over our design space: only our sampled knobs are tuned."""
    from qcompile._tvm import ms

    design_space = get_design_space(spec, target_class)

    def schedule_fn(sch):
        return design_space(sch, spec, hw)

    return ms.space_generator.ScheduleFn(
        schedule_fn,
        sch_rules=[],
        postprocs=[ms.postproc.DisallowDynamicLoop()],
        mutator_probs={ms.mutator.MutateTileSize(): 1.0},
    )
