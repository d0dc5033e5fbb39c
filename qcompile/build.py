"""Build: replay the best tuning record of a workload and export it.

``DIR/<name>.so`` is the kernel; beside it ``<name>.json`` (the manifest), ``<name>.tir.py`` (the
scheduled TensorIR) and the generated code (``<name>.s`` for CPUs, ``<name>.cu`` for CUDA), so a
surprising kernel can be read without rebuilding it. The ``.so`` is a cache: the record's trace
in the database is the truth, and rebuilding gives the same kernel.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from qcompile import _tvm
from qcompile._version import __version__
from qcompile.errors import NoRecordError
from qcompile.kernels import family_of
from qcompile.kernels.base import KernelSpec
from qcompile.machine_load import LoadMeter
from qcompile.manifest import requires_of, sha256_of, write_manifest
from qcompile.measure import (
    Measured,
    MeasurePolicy,
    measure_modules,
    measuring_provenance,
    this_device_model,
)
from qcompile.trust.choice import (
    DEFAULT_TOP,
    Candidate,
    believe,
    choose,
    store_measurement,
    to_time,
)
from qcompile.trust.seals import Sealer
from qcompile.trust.workloads import workload_database
from schedules import untuned_schedule
from schedules.variants import Variant, compute_for
from schedules.variants import choose as choose_variant
from targets.isa import require_build_host
from tuning_db import Storage
from tuning_db.layers import Layers
from tuning_db.models import PURPOSE_VERIFY
from tuning_db.url import redact


@dataclass(frozen=True)
class BuildResult:
    so_path: Path
    manifest_path: Path
    record_id: int | None
    #: The latency build believes for the record (sealed, or re-measured here): not a claim.
    tuned_us: float | None
    #: The database the record came from (URL, secrets masked), when it was not tuned here.
    source: str = ""
    #: How ``tuned_us`` is known, in one line (qcompile.trust.choice).
    how: str = ""


def build(spec: KernelSpec, preset, out_dir: str | Path, *, storage: Storage | None = None,
          hw=None, layers: Layers | None = None, for_another_host: bool = False,
          top: int = DEFAULT_TOP, policy: MeasurePolicy | None = None) -> BuildResult:
    """Compile the best record of ``spec`` on ``preset`` into ``out_dir/<name>.so`` + manifest.

    ``layers`` (default: ``storage`` alone) are searched together, the shared database first:
    a record a teammate tuned in the shared database builds here with no tuning at all. The
    record is chosen among the ``top`` fastest valid ones by a latency this host believes
    (:mod:`qcompile.trust.choice`): claims that nobody sealed for this machine type are timed
    here first, and those measurements are stored.

    Parameters
    ----------
    for_another_host : bool
        Build for a machine of another kind than this one: nothing is timed here, so only
        records sealed for the target (by any device model) may win. Needed for a CPU preset
        whose instructions this host lacks (without it such a build is refused at once, before
        anything is read); CUDA presets build anywhere (their GPU code runs where loaded).
    top : int
        How many of the fastest valid records are considered.
    policy : MeasurePolicy, optional
        How candidates are timed when they must be.

    Raises
    ------
    NoRecordError
        The database has no successful record for this spec on this target (the message gives
        the ``qcompile tune`` command that makes one), or none whose latency can be believed.
    TargetUnavailableError
        ``preset`` is a CPU preset this host cannot run and ``for_another_host`` is False.
    """
    (result,) = build_set([spec], preset, out_dir, storage=storage, hw=hw, layers=layers,
                          for_another_host=for_another_host, top=top, policy=policy)
    return result


def build_set(specs: list[KernelSpec], preset, out_dir: str | Path, *,
              storage: Storage | None = None, hw=None, layers: Layers | None = None,
              for_another_host: bool = False, top: int = DEFAULT_TOP,
              policy: MeasurePolicy | None = None) -> list[BuildResult]:
    """:func:`build` for several specs (a model's layer set), in their order: every spec's
    records are found first (a spec without one stops the build before anything is timed or
    written), then the claims of all of them are built and timed in one batch (one pool of
    build workers and one runner for the set, not one of each per spec), then each spec's
    record is chosen and exported. Parameters and errors as for :func:`build`."""
    require_build_host(preset, for_another_host)
    layers = layers or Layers.single(storage or Storage())
    hw = hw or preset.hardware()
    target = _tvm.Target(preset.tvm_target(hw))
    sealer = Sealer.load()
    runs_here, why_not = preset.host_support()
    if for_another_host:
        runs_here, why_not = False, "the build is --for-another-host"
    device_model = this_device_model(preset) if runs_here else None
    plans = [_plan(spec, preset, hw, target, layers, top, sealer, device_model)
             for spec in specs]
    measured = (_measure_plans(plans, preset, hw, target, layers, sealer, policy)
                if runs_here else [None] * len(plans))
    results = []
    for plan, timings in zip(plans, measured, strict=True):
        choice = choose(plan.candidates, label=f"{plan.spec.name()} on {preset.name}",
                        measure=(lambda _timed, timings=timings: timings)
                        if runs_here else None, cannot_measure_because=why_not)
        results.append(_export_choice(plan, choice, preset, target, out_dir))
    return results


@dataclass(frozen=True)
class _Plan:
    """One spec of a build, up to the measurement: its compute, its records, their beliefs."""

    spec: KernelSpec
    mod: object
    database: object
    candidates: list[Candidate]


def _plan(spec: KernelSpec, preset, hw, target, layers: Layers, top: int, sealer: Sealer,
          device_model: str | None) -> _Plan:
    mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
    database = workload_database(layers.writer, spec, target, readers=layers.readers)
    found = database.candidates(mod, top)
    if not found:
        refused = ""
        if database.refused:  # records there, none valid: say why (the first one's rule)
            first = next(iter(database.refused.values()))
            refused = f" (none valid: {len(database.refused)} refused, the first as {first})"
        raise NoRecordError(
            f"no tuned record for {spec.name()} on {preset.name} "
            f"({_target_label(preset, hw)}) in {layers.describe()}{refused}; run: qcompile tune "
            f"{spec_cli_args(spec)} --target {preset.name}"
        )
    by_storage: dict[int, dict] = {}
    for storage, _, record in found:
        by_storage.setdefault(id(storage), {}).update(storage.measurements([record.id]))
    candidates = [Candidate(storage, info, record,
                            believe(record, by_storage[id(storage)][record.id], sealer,
                                    device_model))
                  for storage, info, record in found]
    return _Plan(spec, mod, database, candidates)


def _measure_plans(plans: list[_Plan], preset, hw, target, layers: Layers, sealer: Sealer,
                   policy: MeasurePolicy | None) -> list[list[Measured]]:
    """Time what each plan's choice will ask for (trust.choice.to_time), all plans in one
    batch per measuring setup (a family's operand maker), and store the measurements.
    Returns each plan's results in the order its choice asks for them."""
    policy = policy or MeasurePolicy.for_target(
        preset.kind, build_workers=getattr(hw, "cores", None) or 2)
    batches: dict[object, list[tuple[int, Candidate]]] = {}  # operand maker -> (plan, claim)
    for index, plan in enumerate(plans):
        timed = to_time(plan.candidates)
        if timed:
            plan.database.register(plan.mod)  # the writer's workload row from our compute
            f_alloc = family_of(plan.spec).measure_arguments(plan.spec)
            batches.setdefault(f_alloc, []).extend((index, c) for c in timed)
    results: list[list[Measured]] = [[] for _ in plans]
    provenance = measuring_provenance(preset)
    for f_alloc, items in batches.items():
        meter = LoadMeter()
        measured = measure_modules([plans[index].database.replay(plans[index].mod, c.record)
                                    for index, c in items], target, policy, f_alloc)
        load = meter.lap()
        for (index, candidate), result in zip(items, measured, strict=True):
            results[index].append(result)  # a plan's claims sit in one batch, in order
            if result.run_secs:
                store_measurement(layers.writer, candidate, result, purpose=PURPOSE_VERIFY,
                                  provenance=provenance, sealer=sealer, other_load=load)
    return results


def _export_choice(plan: _Plan, choice, preset, target, out_dir) -> BuildResult:
    workload, record = choice.workload, choice.record
    scheduled = plan.database.replay(plan.mod, record)
    so_path, manifest = export(plan.spec, preset, target, scheduled, out_dir, {
        "id": record.id, "digest": record.digest, "mean_us": choice.mean_us,
        "claimed_us": record.mean_us, "how": choice.how,
        "workload_digest": workload.digest, "database": redact(record.database),
        "measured_by": {"host": record.host, "user": record.user, "device": record.device_model,
                        "tvm": record.tvm_version, "qcompile": record.qcompile_version,
                        "claimed": record.claimed},
    })
    return BuildResult(so_path=so_path, manifest_path=manifest, record_id=record.id,
                       tuned_us=choice.mean_us, source=redact(record.database), how=choice.how)


def build_untuned(spec: KernelSpec, preset, out_dir: str | Path, *, hw=None,
                  seed: int = 1, for_another_host: bool = False) -> BuildResult:
    """Compile ``spec`` without tuning and without a database: the first sketch of its design
    space with seeded decisions, or the family's heuristic schedule on GPUs (where seeded
    decisions may break a launch limit). A correct kernel in seconds, for tests and first runs.

    Its speed is whatever those decisions give; the manifest says ``"untuned": true``.
    ``for_another_host`` as for :func:`build`.
    """
    require_build_host(preset, for_another_host)
    hw = hw or preset.hardware()
    target = _tvm.Target(preset.tvm_target(hw))
    mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
    sketch = untuned_schedule(_tvm.Schedule(mod, seed=seed), spec, preset.kind, hw)
    so_path, manifest = export(spec, preset, target, sketch.mod, out_dir,
                               {"id": None, "untuned": True, "seed": seed})
    return BuildResult(so_path=so_path, manifest_path=manifest, record_id=None, tuned_us=None)


def export(spec: KernelSpec, preset, target, scheduled, out_dir: str | Path,
           record: dict, variant: Variant | None = None) -> tuple[Path, Path]:
    """Compile a scheduled module and write ``<name>.so``, its manifest, the scheduled TensorIR
    and the generated code into ``out_dir``; returns the paths of the .so and the manifest.

    ``variant`` is the kernel variant ``scheduled`` was made from (it knows the weight layout
    the schedule reads); None: the one ``spec`` gets on ``preset``'s target class."""
    lib = _tvm.tvm.compile(scheduled, target=target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = spec.name()
    so_path = out / f"{name}.so"
    tmp = out / f".{name}.{os.getpid()}.so"
    lib.export_library(str(tmp))
    tmp.replace(so_path)  # readers never see a half-written library
    (out / f"{name}.tir.py").write_text(scheduled.script())
    func = next(iter(scheduled.functions.values()))
    variant = variant or choose_variant(spec, preset.kind)
    layout = variant.layout(spec, func)  # chosen by the schedule: part of the record
    generated = _write_generated_code(lib, out, name, preset.kind)
    manifest = write_manifest(so_path, {
        "name": name,
        "function": name,
        "spec": spec.to_dict(),
        "spec_digest": spec.digest(),
        "target": {"preset": preset.name, "kind": preset.kind,
                   "tvm": _tvm.target_dict(target)},
        "requires": requires_of(_tvm.target_dict(target)),
        "record": record,
        "layout": layout,
        "versions": {"qcompile": __version__, "tvm": _tvm.TVM_VERSION,
                     "tvm_ffi": _tvm.TVM_FFI_VERSION},
        "files": {"so": so_path.name, "tir": f"{name}.tir.py", "generated": generated},
        "sha256": sha256_of(so_path),
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    })
    return so_path, manifest


def _write_generated_code(lib, out: Path, name: str, kind: str) -> str:
    if kind == "cuda":
        devices = [m for m in lib.mod.imports if m.kind == "cuda"]
        path = out / f"{name}.cu"
        path.write_text(devices[0].inspect_source() if devices else "")
    else:
        path = out / f"{name}.s"
        path.write_text(lib.mod.inspect_source("asm"))
    return path.name


def _target_label(preset, hw) -> str:
    cores = getattr(hw, "cores", None)
    if not cores:
        return preset.name
    return f"{preset.tvm_target(hw).get('mcpu', preset.name)}, {cores} cores"


def spec_cli_args(spec: KernelSpec) -> str:
    """The ``qcompile tune`` flags that name ``spec`` (for messages that say what to run)."""
    data = spec.to_dict()
    args = [f"--family {data.pop('family')}"]
    if "k" in data and "n" in data:
        args.append(f"--shape {data.pop('k')}x{data.pop('n')}")
    renames = {"group_size": "group-size", "m": "batch", "q": "bits"}
    for key, value in data.items():
        flag = f"--{renames.get(key, key).replace('_', '-')}"
        if key in _SWITCHES:
            if value:
                args.append(flag)
            continue
        args.append(f"{flag} {value}")
    return " ".join(args)


#: Spec fields whose flag takes no value (``store_true``): named when True, left out otherwise.
_SWITCHES = {"int8_activations"}
