"""Kernels for benchmarks, loaded the way a user gets them: through qcompile's kernel cache.

:func:`load` returns the kernel of a spec and where it came from: a prebuilt library
(``so_dir/<name>.so``, exported on another machine) when given; else the database's best record
(``qcompile.kernel_cache.KernelCache``: built once into the user's cache, reused by later runs),
tuned first when ``tune_trials`` asks for it; else the design space's untuned heuristic point.
"""

from __future__ import annotations

import warnings
from pathlib import Path

_CACHES: dict[tuple, object] = {}


def kernel_cache(target: str, db: str | None, tune_trials: int = 0):
    """One ``KernelCache`` per (target, database, tuning) in this process."""
    from qcompile.kernel_cache import KernelCache

    key = (target, db, tune_trials)
    if key not in _CACHES:
        _CACHES[key] = KernelCache(target, db, on_missing="tune" if tune_trials else "untuned",
                                   tune_trials=tune_trials or 64)
    return _CACHES[key]


def load(spec, target: str, *, db: str | None = None, so_dir: str | Path | None = None,
         tune_trials: int = 0):
    """(loaded ``qcompile.runtime.Kernel``, origin dict) for ``spec`` on preset ``target``."""
    import qcompile

    if so_dir:
        so = Path(so_dir) / f"{spec.name()}.so"
        if so.exists():
            return qcompile.load(so), {"source": "prebuilt", "path": str(so)}
    cache = kernel_cache(target, db, tune_trials)
    with warnings.catch_warnings():  # the origin says "untuned" in the result instead
        warnings.simplefilter("ignore")
        kernel = cache.get(spec)
    record = kernel.manifest.data.get("record") or {}
    if record.get("id") is None:
        return kernel, {"source": "untuned heuristic"}
    return kernel, {"source": "tuned record", "record": record.get("id"),
                    "tuned_us": record.get("mean_us")}
