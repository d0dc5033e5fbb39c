"""Design spaces: for each kernel variant (schedules/variants.py) a function that turns an
unscheduled workload into one or more schedules whose tile sizes are MetaSchedule sampling
decisions, and the search MetaSchedule runs over them.

Every space module exposes ``design_space(sch, spec, hw) -> list[Schedule]``;
:func:`space_generator` wraps the chosen variant's into the ``ScheduleFn`` MetaSchedule tunes
over.
"""

from __future__ import annotations

from collections.abc import Callable

from qcompile._tvm import ms
from qcompile.kernels.base import KernelSpec
from schedules import variants
from schedules.knobs import MutateCategorical
from schedules.variants import Variant

DesignSpace = Callable  # (Schedule, spec, hardware) -> list[Schedule]


def get_design_space(spec: KernelSpec, target_class: str) -> DesignSpace:
    """The design-space function of ``spec``'s variant on ``target_class`` ("cpu", "cuda")."""
    return variants.choose(spec, target_class).space


def untuned_schedule(sch, spec: KernelSpec, target_class: str, hw):
    """A schedule of ``spec`` without tuning: its variant's heuristic point if it has one,
    else the first sketch of its design space with ``sch``'s seeded decisions."""
    return variants.choose(spec, target_class).untuned(sch, spec, hw)


def search_settings(variant: Variant):
    """(postprocs, mutator probabilities) for ``variant``'s space.

    Categorical spaces (all GPU spaces, the uniform CPU space and the int8-activation CPU
    spaces) sample our knobs (MutateCategorical); the other CPU spaces sample perfect tiles
    (MutateTileSize). On GPUs a candidate whose launch breaks the GPU's limits (threads,
    shared memory, registers) is dropped before it is built (VerifyGPUCode), unless the
    variant plans its own launch (``verify_gpu_code`` False). A compute with data-dependent
    loops keeps its candidates (no DisallowDynamicLoop).
    """
    postprocs = [] if variant.dynamic_loops else [ms.postproc.DisallowDynamicLoop()]
    if variant.target == "cuda" and variant.verify_gpu_code:
        postprocs.append(ms.postproc.VerifyGPUCode())
    mutator = (MutateCategorical() if variant.mutator == "categorical"
               else ms.mutator.MutateTileSize())
    return postprocs, {mutator: 1.0}


def search_strategy(spec: KernelSpec, target_class: str):
    """The evolutionary search for ``spec``'s variant on ``target_class``: its population
    where the variant names one (small spaces), else MetaSchedule's defaults."""
    variant = variants.choose(spec, target_class)
    if variant.population is not None:
        return ms.search_strategy.EvolutionarySearch(
            population_size=variant.population,
            init_min_unmeasured=min(16, variant.population), genetic_num_iters=3)
    return "evolutionary"


def space_generator(spec: KernelSpec, target_class: str, hw):
    """MetaSchedule ``ScheduleFn`` over our design space: only our sampled knobs are tuned."""
    variant = variants.choose(spec, target_class)
    design_space = variant.space

    def schedule_fn(sch):
        return design_space(sch, spec, hw)

    postprocs, mutators = search_settings(variant)
    return ms.space_generator.ScheduleFn(
        schedule_fn, sch_rules=[], postprocs=postprocs, mutator_probs=mutators)
