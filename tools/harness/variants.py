"""Building one pinned variant of a CUDA design space in a worker process (the sweep tools).

``tools/sweep_cuda.py`` and ``tools/bench_bcq_cuda.py`` enumerate sketches and knob values
instead of sampling them; each variant is built by :func:`build_variant` in a pool of processes
and exported like a tuned kernel (``.so`` with its manifest), so the GPU side loads it through
``qcompile.load``.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def build_variant(job: dict, make_spec: Callable, schedule: Callable,
                  variant: str | None = None) -> dict:
    """Build ``job`` into ``job["dir"]``: ``job`` plus ``so`` and ``build_s``, or ``error``.

    Parameters
    ----------
    job : dict
        The variant (JSON-able); ``job["dir"]`` is its output directory, and the whole job is
        recorded in the manifest.
    make_spec : callable
        ``() -> KernelSpec``, called inside the error capture (a spec rule is a result too).
    schedule : callable
        ``(Schedule, spec, GpuHardware) -> Schedule``: the variant's pinned sketch.
    variant : str, optional
        The kernel variant (schedules/variants.py) whose compute the sketch schedules (default:
        the one the spec gets on CUDA).
    """
    import targets
    from qcompile import _tvm
    from qcompile.build import export
    from schedules import variants

    started = time.monotonic()
    try:
        spec = make_spec()
        preset = targets.get("cuda")
        hw = preset.hardware()
        target = _tvm.Target(preset.tvm_target(hw))
        chosen = variants.get(variant) if variant else variants.choose(spec, "cuda")
        mod = _tvm.normalize_mod(chosen.build_compute(spec))
        sch = schedule(_tvm.Schedule(mod), spec, hw)
        so, _ = export(spec, preset, target, sch.mod, job["dir"], {"id": None, "sweep": job},
                       variant=chosen)
        return {**job, "so": str(so), "build_s": time.monotonic() - started}
    except Exception as error:  # noqa: BLE001 - a variant that does not build is a result
        return {**job, "error": f"{type(error).__name__}: {str(error)[-300:]}"}
