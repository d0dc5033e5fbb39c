"""Every kernel variant, declared once: its compute, design space, heuristic point, search
settings and weight layout, and the rule for which specs it takes.

A *variant* is one TensorIR compute with the design space that schedules it. A family has one
or more per target class ("cpu", "cuda"); the variant a spec gets on a target class is the first
of :data:`VARIANTS`, in the order declared, whose fit rule takes it (:func:`choose`). Tools that
want another one name it (:func:`get`). Adding a variant means writing its compute (under
``qcompile/kernels/<family>/``) and its space (under ``schedules/<target>/``), and one entry here.

Fields of an entry:

``fit``        spec -> the reason the variant does not take it, or None when it does
``compute``    spec -> the unscheduled PrimFunc (symbol and spec in its attributes)
``space``      (sch, spec, hw) -> the sketches MetaSchedule samples
``heuristic``  (sch, spec, hw) -> one valid schedule without tuning; None: the space's first
               sketch with ``sch``'s seeded decisions
``mutator``    "categorical" (our knobs, MutateCategorical) or "tile_size" (perfect tiles,
               MutateTileSize)
``population`` the evolutionary search's population (None: MetaSchedule's defaults)
``dynamic_loops`` the compute has loops with data-dependent bounds (the mixed family's CSR
               outliers; the fp16 kernel's uneven K slices, whose length depends on the
               block), so DisallowDynamicLoop must not drop its candidates
``layout``     (spec, scheduled PrimFunc) -> the weight layout it reads (a JSON dict for the
               manifest and ``prepare(layout=...)``), None for the format's own
``intrinsics`` registers the tensor intrinsics its schedules (and stored records) name
``verify_gpu_code`` MetaSchedule drops candidates past the target's limits (VerifyGPUCode);
               False for a compute that plans its own launch: the fp16 kernel takes dynamic
               shared memory past the 48 KB that TVM's check allows (TVM opts the kernel in)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qcompile.errors import SpecError
from qcompile.kernels.base import KernelSpec
from qcompile.kernels.bcq import compute_cuda_rotated as bcq_rotated
from qcompile.kernels.bcq.compute import bcq_compute
from qcompile.kernels.layouts import bcq as bcq_layout
from qcompile.kernels.layouts import mixed as mixed_layout
from qcompile.kernels.layouts import uniform as uniform_layout
from qcompile.kernels.mixed.compute import mixed_compute
from qcompile.kernels.mixed.compute_cuda_int8 import mixed_compute_cuda_int8
from qcompile.kernels.mixed.compute_int8 import mixed_compute_int8
from qcompile.kernels.uniform import compute_cuda_gemv_int8 as uniform_gemv
from qcompile.kernels.uniform import compute_cuda_mma as uniform_mma
from qcompile.kernels.uniform import compute_cuda_mma_f16 as uniform_mma_f16
from qcompile.kernels.uniform.compute import uniform_compute
from qcompile.kernels.uniform.compute_cuda import uniform_compute_cuda
from qcompile.kernels.uniform.compute_cuda_int8 import uniform_compute_cuda_int8
from qcompile.kernels.uniform.compute_int8 import uniform_compute_int8
from schedules.cpu import bcq as cpu_bcq
from schedules.cpu import int8_dot
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
from schedules.cuda import uniform_mma_f16 as cuda_uniform_mma_f16

TARGET_CLASSES = ("cpu", "cuda")


@dataclass(frozen=True)
class Variant:
    """One kernel variant (see the module docstring for the fields)."""

    name: str
    family: str
    target: str
    fit: Callable[[KernelSpec], str | None]
    compute: Callable
    space: Callable
    heuristic: Callable | None
    mutator: str
    layout: Callable[[KernelSpec, object], dict | None]
    population: int | None = None
    dynamic_loops: bool = False
    intrinsics: Callable[[], None] | None = None
    verify_gpu_code: bool = True

    def build_compute(self, spec: KernelSpec):
        """The unscheduled PrimFunc of ``spec``, with the tensor intrinsics its schedules name
        registered."""
        if self.intrinsics is not None:
            self.intrinsics()
        return self.compute(spec)

    def untuned(self, sch, spec: KernelSpec, hw):
        """A schedule without tuning: the heuristic point, else the first sketch, seeded."""
        if self.heuristic is not None:
            return self.heuristic(sch, spec, hw)
        return self.space(sch, spec, hw)[0]


# Fit rules: each returns why the variant does not take the spec, or None.

def _float_activations(spec) -> str | None:
    return "int8 activations take the int8 variants" if spec.int8_activations else None


def _int8_activations(spec) -> str | None:
    return None if spec.int8_activations else "float activations take the float variants"


def _any(spec) -> str | None:
    return None


def _both(*rules) -> Callable[[KernelSpec], str | None]:
    """A fit rule that takes what every one of ``rules`` takes (the first reason otherwise)."""

    def fit(spec):
        return next((r for r in (rule(spec) for rule in rules) if r is not None), None)

    return fit


def _problems(problems_with) -> Callable[[KernelSpec], str | None]:
    """A fit rule from a compute's ``problems_with(spec) -> list of str``."""

    def fit(spec):
        return "; ".join(problems_with(spec)) or None

    return fit


def _more_than_one_row(spec) -> str | None:
    return None if spec.m > 1 else "one row of x takes the one-row GEMV"


# Layout readers: (spec, scheduled PrimFunc) -> the weight layout it reads.

def _uniform_tiles(spec, func) -> dict | None:
    return uniform_layout.layout_of(func)


def _mixed_tiles(spec, func) -> dict | None:
    return mixed_layout.layout_of(func)


def _uniform_plane_words(spec, func) -> dict:
    return uniform_layout.plane_words()


def _mixed_plane_words(spec, func) -> dict:
    return mixed_layout.plane_words()


def _uniform_mma_tiles(spec, func) -> dict:
    qweight = next(p for p in func.params if p.name == "qweight")
    return uniform_layout.mma_tiles(spec.bits, int(qweight.shape[2]) // uniform_mma.TILE_N,
                                    uniform_mma.TILES_PER_WARP)


def _uniform_mma_f16(spec, func) -> dict:
    return uniform_layout.mma_f16(spec.bits, uniform_mma_f16.block_rows(spec))


def _bcq_rotated_chunks(spec, func) -> dict:
    return bcq_layout.layout(spec.effective_group_size)


def _format_layout(spec, func) -> None:
    return None


# The compute functions that take the target class or a GPU flag.

def _mixed_compute_cuda(spec):
    return mixed_compute(spec, "cuda")


def _bcq_compute_cuda(spec):
    return bcq_compute(spec, gpu=True)


#: The uniform CPU space holds a few hundred points (t_u fixed per sketch, short knob lists
#: around the QIGen model's point), so a population of 64 covers them; MetaSchedule's default
#: of 512 spends most of a tuning run lowering candidates for the cost model on large layers.
CPU_CATEGORICAL_POPULATION = 64

#: A space of one schedule (the fp16 kernel's: its compute fixes the split) is measured once;
#: MetaSchedule's default population of 512 would apply its long trace hundreds of times
#: looking for other points (minutes a kernel) before it gave up.
ONE_SCHEDULE_POPULATION = 1

#: Every variant, in the order :func:`choose` tries them per (family, target class).
VARIANTS: tuple[Variant, ...] = (
    Variant("uniform_cpu", "uniform", "cpu", fit=_float_activations,
            compute=uniform_compute, space=cpu_uniform.design_space,
            heuristic=cpu_uniform.heuristic_schedule, mutator="categorical",
            population=CPU_CATEGORICAL_POPULATION, layout=_uniform_tiles),
    Variant("uniform_cpu_int8", "uniform", "cpu", fit=_int8_activations,
            compute=uniform_compute_int8, space=cpu_uniform_int8.design_space,
            heuristic=cpu_uniform_int8.heuristic_schedule, mutator="categorical",
            population=CPU_CATEGORICAL_POPULATION, layout=_uniform_tiles,
            intrinsics=int8_dot.register),
    # fp16/bf16 x on tensor cores, where the mma_f16 layout fits.
    Variant("uniform_cuda_mma_f16", "uniform", "cuda",
            fit=_problems(uniform_mma_f16.problems_with),
            compute=uniform_mma_f16.uniform_compute_cuda_mma_f16,
            space=cuda_uniform_mma_f16.design_space,
            heuristic=cuda_uniform_mma_f16.heuristic_schedule, mutator="categorical",
            population=ONE_SCHEDULE_POPULATION, layout=_uniform_mma_f16,
            dynamic_loops=True, verify_gpu_code=False),
    Variant("uniform_cuda", "uniform", "cuda", fit=_float_activations,
            compute=uniform_compute_cuda, space=cuda_uniform.design_space,
            heuristic=cuda_uniform.heuristic_schedule, mutator="categorical",
            layout=_uniform_tiles),
    # One row of x: the GEMV that rounds x inside its one kernel, where it fits.
    Variant("uniform_cuda_int8_gemv", "uniform", "cuda",
            fit=_problems(uniform_gemv.problems_with),
            compute=uniform_gemv.uniform_compute_cuda_gemv_int8,
            space=cuda_uniform_gemv_int8.design_space,
            heuristic=cuda_uniform_gemv_int8.heuristic_schedule, mutator="categorical",
            layout=_uniform_plane_words),
    # From 2 rows: tensor cores, where the mma_tiles layout fits.
    Variant("uniform_cuda_int8_mma", "uniform", "cuda",
            fit=_both(_more_than_one_row, _problems(uniform_mma.problems_with)),
            compute=uniform_mma.uniform_compute_cuda_mma, space=cuda_uniform_mma.design_space,
            heuristic=cuda_uniform_mma.heuristic_schedule, mutator="categorical",
            layout=_uniform_mma_tiles),
    # Everything else with int8 activations: dp4a.
    Variant("uniform_cuda_int8_dp4a", "uniform", "cuda", fit=_int8_activations,
            compute=uniform_compute_cuda_int8, space=cuda_uniform_int8.design_space,
            heuristic=cuda_uniform_int8.heuristic_schedule, mutator="categorical",
            layout=_uniform_plane_words),
    Variant("bcq_cpu", "bcq", "cpu", fit=_any, compute=bcq_compute,
            space=cpu_bcq.design_space, heuristic=None, mutator="tile_size",
            layout=_format_layout),
    # One-row GEMVs at mu = 8: every lookup conflict-free, weights in rotated chunks.
    Variant("bcq_cuda_rotated", "bcq", "cuda", fit=bcq_rotated.unfit_reason,
            compute=bcq_rotated.rotated_compute, space=cuda_bcq_rotated.design_space,
            heuristic=cuda_bcq_rotated.heuristic_schedule, mutator="categorical",
            layout=_bcq_rotated_chunks),
    Variant("bcq_cuda_tables", "bcq", "cuda", fit=_any, compute=_bcq_compute_cuda,
            space=cuda_bcq.design_space, heuristic=cuda_bcq.heuristic_schedule,
            mutator="categorical", layout=_format_layout),
    Variant("mixed_cpu", "mixed", "cpu", fit=_float_activations, compute=mixed_compute,
            space=cpu_mixed.design_space, heuristic=cpu_mixed.heuristic_schedule,
            mutator="tile_size", dynamic_loops=True, layout=_mixed_tiles),
    Variant("mixed_cpu_int8", "mixed", "cpu", fit=_int8_activations,
            compute=mixed_compute_int8, space=cpu_mixed_int8.design_space,
            heuristic=cpu_mixed_int8.heuristic_schedule, mutator="categorical",
            population=CPU_CATEGORICAL_POPULATION, dynamic_loops=True, layout=_mixed_tiles,
            intrinsics=int8_dot.register),
    Variant("mixed_cuda", "mixed", "cuda", fit=_float_activations,
            compute=_mixed_compute_cuda, space=cuda_mixed.design_space,
            heuristic=cuda_mixed.heuristic_schedule, mutator="categorical",
            dynamic_loops=True, layout=_mixed_tiles),
    Variant("mixed_cuda_int8", "mixed", "cuda", fit=_int8_activations,
            compute=mixed_compute_cuda_int8, space=cuda_mixed_int8.design_space,
            heuristic=cuda_mixed_int8.heuristic_schedule, mutator="categorical",
            dynamic_loops=True, layout=_mixed_plane_words),
)

BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}


def get(name: str) -> Variant:
    """The variant called ``name``; raises ``SpecError`` listing the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise SpecError(f"unknown kernel variant {name!r}; known: {', '.join(BY_NAME)}") from None


def choose(spec: KernelSpec, target_class: str) -> Variant:
    """The first variant of ``spec``'s family on ``target_class`` that takes ``spec``."""
    candidates = [v for v in VARIANTS if v.family == spec.family and v.target == target_class]
    if not candidates:
        known = ", ".join(sorted({f"{v.family}/{v.target}" for v in VARIANTS}))
        raise SpecError(f"no kernel variant for family {spec.family!r} on {target_class!r}; "
                        f"known: {known}")
    reasons = []
    for variant in candidates:
        reason = variant.fit(spec)
        if reason is None:
            return variant
        reasons.append(f"{variant.name}: {reason}")
    raise SpecError(f"no {spec.family} variant on {target_class} takes {spec.name()}: "
                    + "; ".join(reasons))


def compute_for(spec: KernelSpec, target_class: str):
    """The PrimFunc to tune and build ``spec`` with on ``target_class`` (its variant's)."""
    return choose(spec, target_class).build_compute(spec)
