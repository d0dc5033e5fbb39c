"""Design spaces: for each (kernel family, target class) a function that turns an unscheduled
workload into one or more schedules whose tile sizes are MetaSchedule sampling decisions.

Every module exposes ``design_space(sch, spec, hw) -> list[Schedule]``; :func:`space_generator`
wraps it into the ``ScheduleFn`` MetaSchedule tunes over.
"""

from __future__ import annotations

from collections.abc import Callable

from qcompile.errors import SpecError
from qcompile.kernels.base import KernelSpec
from schedules.cpu import bcq as cpu_bcq
from schedules.cpu import mixed as cpu_mixed
from schedules.cpu import mixed_int8 as cpu_mixed_int8
from schedules.cpu import uniform as cpu_uniform
from schedules.cpu import uniform_int8 as cpu_uniform_int8
from schedules.cuda import bcq as cuda_bcq
from schedules.cuda import bcq_rotated as cuda_bcq_rotated
from schedules.cuda import mixed as cuda_mixed
from schedules.cuda import mixed_int8 as cuda_mixed_int8
from schedules.cuda import uniform as cuda_uniform
from schedules.cuda import uniform_gemv_int8 as cuda_uniform_gemv_int8
from schedules.cuda import uniform_int8 as cuda_uniform_int8
from schedules.cuda import uniform_mma as cuda_uniform_mma

DesignSpace = Callable  # (Schedule, spec, hardware) -> list[Schedule]


def _by_activations(float32, int8) -> DesignSpace:
    """A space function that runs ``int8`` for int8-activation specs (another compute) and
    ``float32`` for the others."""

    def space(sch, spec, hw):
        return (int8 if spec.int8_activations else float32)(sch, spec, hw)

    return space


def _by_int8_compute(mma, gemv, dp4a) -> DesignSpace:
    """A space function for int8-activation uniform workloads on CUDA, by the compute handed
    over (its compute attribute; the family picks it, a tool may pass any): ``mma`` for the
    tensor-core compute, ``gemv`` for the one-row GEMV that rounds x inside, else ``dp4a``."""
    from qcompile.kernels.uniform.compute_cuda import compute_name
    from qcompile.kernels.uniform.compute_cuda_gemv_int8 import COMPUTE_NAME as GEMV
    from qcompile.kernels.uniform.compute_cuda_mma import COMPUTE_NAME as MMA

    def space(sch, spec, hw):
        return {MMA: mma, GEMV: gemv}.get(compute_name(sch.mod["main"]), dp4a)(sch, spec, hw)

    return space


def _by_bcq_compute(rotated, tables) -> DesignSpace:
    """A space function for BCQ workloads on CUDA, by the compute handed over: ``rotated`` for
    the rotated-chunk GEMV (compute_cuda_rotated.py), else ``tables``."""
    from qcompile.kernels.bcq.compute_cuda_rotated import COMPUTE_NAME as ROTATED
    from qcompile.kernels.uniform.compute_cuda import compute_name

    def space(sch, spec, hw):
        chosen = rotated if compute_name(sch.mod["main"]) == ROTATED else tables
        return chosen(sch, spec, hw)

    return space


_cpu_uniform_space = _by_activations(cpu_uniform.design_space, cpu_uniform_int8.design_space)
_cpu_uniform_heuristic = _by_activations(cpu_uniform.heuristic_schedule,
                                         cpu_uniform_int8.heuristic_schedule)
_cpu_mixed_space = _by_activations(cpu_mixed.design_space, cpu_mixed_int8.design_space)
_cpu_mixed_heuristic = _by_activations(cpu_mixed.heuristic_schedule,
                                       cpu_mixed_int8.heuristic_schedule)


_SPACES: dict[tuple[str, str], DesignSpace] = {
    ("uniform", "cpu"): _cpu_uniform_space,
    ("uniform", "cuda"): _by_activations(
        cuda_uniform.design_space,
        _by_int8_compute(cuda_uniform_mma.design_space, cuda_uniform_gemv_int8.design_space,
                         cuda_uniform_int8.design_space)),
    ("bcq", "cpu"): cpu_bcq.design_space,
    ("bcq", "cuda"): _by_bcq_compute(cuda_bcq_rotated.design_space, cuda_bcq.design_space),
    ("mixed", "cpu"): _cpu_mixed_space,
    ("mixed", "cuda"): _by_activations(cuda_mixed.design_space, cuda_mixed_int8.design_space),
}

#: Families whose compute has a loop with data-dependent bounds by design (the mixed family's
#: CSR outliers): their candidates must not be dropped by DisallowDynamicLoop.
_DATA_DEPENDENT_LOOPS = {"mixed"}

#: A valid, reasonable schedule without tuning, where seeded sampling could pick an invalid one
#: (GPU spaces: too many threads, too much shared memory). Others use the first sketch, seeded.
_UNTUNED: dict[tuple[str, str], Callable] = {
    ("uniform", "cpu"): _cpu_uniform_heuristic,
    ("uniform", "cuda"): _by_activations(
        cuda_uniform.heuristic_schedule,
        _by_int8_compute(cuda_uniform_mma.heuristic_schedule,
                         cuda_uniform_gemv_int8.heuristic_schedule,
                         cuda_uniform_int8.heuristic_schedule)),
    ("bcq", "cuda"): _by_bcq_compute(cuda_bcq_rotated.heuristic_schedule,
                                     cuda_bcq.heuristic_schedule),
    ("mixed", "cuda"): _by_activations(cuda_mixed.heuristic_schedule,
                                       cuda_mixed_int8.heuristic_schedule),
    ("mixed", "cpu"): _cpu_mixed_heuristic,
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


def untuned_schedule(sch, spec: KernelSpec, target_class: str, hw):
    """A schedule of ``spec`` without tuning: the family's heuristic for ``target_class`` if it
    has one, else the first sketch of its design space with ``sch``'s seeded decisions."""
    heuristic = _UNTUNED.get((spec.family, target_class))
    if heuristic is not None:
        return heuristic(sch, spec, hw)
    return get_design_space(spec, target_class)(sch, spec, hw)[0]


#: CPU spaces whose knobs are categorical (the uniform family's, seeded by QIGen's model, and
#: the int8-activation spaces, :func:`space_kind`); the other CPU spaces sample perfect tiles.
_CATEGORICAL_CPU = {"uniform", "uniform_int8", "mixed_int8"}


def space_kind(spec: KernelSpec) -> str:
    """The family, with ``_int8`` for an int8-activation spec (its own space and search)."""
    return spec.family + ("_int8" if getattr(spec, "int8_activations", False) else "")


def _search_settings(target_class: str, family: str = ""):
    """(postprocs, mutator probabilities) for ``family``'s space on ``target_class`` (``family``:
    a :func:`space_kind`).

    GPU spaces and the uniform CPU space sample categorical knobs (MutateCategorical); the other
    CPU spaces sample perfect tiles (MutateTileSize). On GPUs a candidate whose launch breaks the
    GPU's limits (threads, shared memory, registers) is dropped before it is built
    (VerifyGPUCode).
    """
    from qcompile._tvm import ms
    from schedules.knobs import MutateCategorical

    if target_class == "cuda":
        return ([ms.postproc.DisallowDynamicLoop(), ms.postproc.VerifyGPUCode()],
                {MutateCategorical(): 1.0})
    if family in _CATEGORICAL_CPU:
        return [ms.postproc.DisallowDynamicLoop()], {MutateCategorical(): 1.0}
    return [ms.postproc.DisallowDynamicLoop()], {ms.mutator.MutateTileSize(): 1.0}


def search_strategy(target_class: str, family: str = ""):
    """The evolutionary search for ``family``'s space on ``target_class`` (``family``: a
    :func:`space_kind`).

    The uniform CPU space holds a few hundred points (t_u fixed per sketch, short knob lists
    around the QIGen model's point), so a population of 64 covers them; MetaSchedule's default
    of 512 spends most of a tuning run lowering candidates for the cost model on large layers.
    Other spaces keep MetaSchedule's defaults.
    """
    from qcompile._tvm import ms

    if target_class == "cpu" and family in _CATEGORICAL_CPU:
        return ms.search_strategy.EvolutionarySearch(
            population_size=64, init_min_unmeasured=16, genetic_num_iters=3)
    return "evolutionary"


def space_generator(spec: KernelSpec, target_class: str, hw):
    """MetaSchedule ``ScheduleFn`` over our design space: only our sampled knobs are tuned."""
    from qcompile._tvm import ms

    design_space = get_design_space(spec, target_class)

    def schedule_fn(sch):
        return design_space(sch, spec, hw)

    postprocs, mutators = _search_settings(target_class, space_kind(spec))
    if spec.family in _DATA_DEPENDENT_LOOPS:
        postprocs = [p for p in postprocs if not isinstance(p, ms.postproc.DisallowDynamicLoop)]
    return ms.space_generator.ScheduleFn(
        schedule_fn, sch_rules=[], postprocs=postprocs, mutator_probs=mutators)
