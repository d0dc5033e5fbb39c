"""Kernels on demand for running models: spec -> best tuned record -> built ``.so`` -> loaded.

A built library is a cache of its record (the trace in the database is the truth), so it is kept
under ``$XDG_CACHE_HOME/qcompile/kernels/<target>/<record digest>/`` and reused by every later
process that finds the same best record; a better record (more tuning) gets a new directory.
Within a process each spec is resolved once. A spec with no record in the database is looked
up in the record packs (:mod:`qcompile.trust.packs`; ``$QCOMPILE_PACKS=0``: not), whose record
the build times once here before it believes it.

What happens when a spec has no tuned record is the caller's explicit choice (``on_missing``):

``"error"`` (default)
    :class:`~qcompile.errors.NoRecordError` with the command that tunes it.
``"untuned"``
    a kernel from the design space's seeded decisions (correct, not tuned: ``build_untuned``),
    with a warning.
``"tune"``
    tune it now (``tune_trials`` candidates, minutes for a large layer on a small machine),
    store the records, then build the best.

Light: importing this module loads no TVM (``qcompile.nn`` builds layers before any kernel is
needed); ``qcompile._tvm`` and the modules that load it (tune, build, the database's view)
are imported inside the methods that resolve a kernel.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import targets
from qcompile.errors import NoRecordError, SpecError
from qcompile.runtime import load_kernel
from tuning_db.layers import Layers
from tuning_db.storage import Storage, workload_digest
from tuning_db.url import cache_dir, db_option

ON_MISSING = ("error", "untuned", "tune")


def cache_root() -> Path:
    return cache_dir() / "kernels"


class KernelCache:
    """Resolves specs to loaded kernels for one target and one tuning database.

    Parameters
    ----------
    target : str
        A target preset name ("avx2", ...).
    db : str, optional
        SQLAlchemy URL of the tuning database (default: $QCOMPILE_DB, else the user's SQLite).
    on_missing : str
        "error", "untuned" or "tune" (module docstring).
    tune_trials : int
        Candidates measured per spec when ``on_missing="tune"``.
    """

    def __init__(self, target: str = "avx2", db: str | None = None, *,
                 on_missing: str = "error", tune_trials: int = 64) -> None:
        if on_missing not in ON_MISSING:
            raise SpecError(f"on_missing must be one of {ON_MISSING}; got {on_missing!r}")
        self.preset = targets.get(target)
        supported, reason = self.preset.host_support()
        if not supported:
            raise SpecError(f"target {target!r} cannot run on this host: {reason}")
        self.storage = Storage(db)
        self.on_missing = on_missing
        self.tune_trials = tune_trials
        self._kernels: dict[str, object] = {}
        self._untuned: set[str] = set()  # digests of the kernels built without a record
        self._has_record: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._packs = None  # the record packs' layer, opened on first need (False: none)

    def packs(self):
        """The record packs' read-only Storage, or None (none shipped, or turned off)."""
        if self._packs is None:
            from qcompile.trust.packs import pack_layer  # the record checks: on first need

            self._packs = pack_layer(preset=self.preset) or False
        return self._packs or None

    def best_record(self, spec):
        """(workload, record) of the fastest successful record of ``spec`` in the database,
        else in the record packs; None when neither has one."""
        from qcompile import _tvm
        from qcompile.trust.workloads import workload_database
        from schedules.variants import compute_for

        target = _tvm.Target(self.preset.tvm_target(self.preset.hardware()))
        mod = _tvm.normalize_mod(compute_for(spec, self.preset.kind))
        best = workload_database(self.storage, spec, target).best(mod)
        if best is None and self.packs() is not None:
            best = workload_database(self.packs(), spec, target).best(mod)
        return best

    def has_record(self, spec) -> bool:
        """Whether ``spec`` has a successful record here: a key lookup, no TensorIR built."""
        if spec.digest() in self._kernels and spec.digest() not in self._untuned:
            return True
        if spec.digest() not in self._has_record:
            from qcompile import _tvm

            target = _tvm.Target(self.preset.tvm_target(self.preset.hardware()))
            key = targets.target_key(_tvm.target_dict(target))
            found = False
            for storage in filter(None, (self.storage, self.packs())):
                workload = storage.find_workload(workload_digest(spec.digest(), key))
                found = found or (workload is not None
                                  and bool(storage.top_records(workload.id, 1)))
            if not found:  # a record may arrive later (tuning elsewhere): ask again then
                return False
            self._has_record[spec.digest()] = True
        return True

    def get(self, spec, hint: str = ""):
        """The loaded :class:`~qcompile.runtime.Kernel` for ``spec`` (see ``on_missing``).

        ``hint`` is appended to the error of a missing record (the checkpoint command, say).
        """
        with self._lock:
            kernel = self._kernels.get(spec.digest())
            if kernel is None:
                kernel = self._resolve(spec, hint)
                self._kernels[spec.digest()] = kernel
            return kernel

    def _resolve(self, spec, hint: str):
        from qcompile.build import build, build_untuned, spec_cli_args

        best = self.best_record(spec)
        if best is None and self.on_missing == "tune":
            from qcompile.tune import tune

            tune(spec, self.preset, trials=self.tune_trials, storage=self.storage,
                 progress=False)
            best = self.best_record(spec)
        if best is None:
            if self.on_missing == "untuned":
                warnings.warn(f"no tuned record for {spec.name()} on {self.preset.name} in "
                              f"{self.storage.display_url}: running an untuned kernel",
                              stacklevel=3)
                out = cache_root() / self.preset.name / "untuned" / spec.digest()[:24]
                so_path = out / f"{spec.name()}.so"
                if not so_path.is_file():
                    so_path = build_untuned(spec, self.preset, out).so_path
                self._untuned.add(spec.digest())
                return load_kernel(str(so_path))
            raise NoRecordError(
                f"no tuned record for {spec.name()} on {self.preset.name} in "
                f"{self.storage.display_url}; run: qcompile tune {spec_cli_args(spec)} "
                f"--target {self.preset.name} {db_option(self.storage.display_url)}{hint}"
            )
        record = best[1]
        out = cache_root() / self.preset.name / record.digest[:24]
        so_path = out / f"{spec.name()}.so"
        if not so_path.is_file():
            so_path = build(spec, self.preset, out, layers=self._layers(best[1])).so_path
        return load_kernel(str(so_path))

    def _layers(self, record):
        """The database alone, or with the packs below it when ``record`` came from them (the
        build then times the pack's record once and stores that in the database)."""
        packs = self.packs()
        if packs is None or record.database != packs.display_url:
            return Layers.single(self.storage)
        return Layers(writer=self.storage, readers=[self.storage, packs], packs=packs)

