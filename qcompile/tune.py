"""The tuning driver: one kernel spec on one target, measured by MetaSchedule over our design
space, every candidate stored in the tuning database."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from typing import NamedTuple

from qcompile import _tvm
from qcompile._tvm import derived_object
from qcompile.callbacks import ProgressBuilder, ProgressRunner, RecordMeasurements, ShowProgress
from qcompile.errors import TargetUnavailableError, UsageError
from qcompile.kernels import family_of
from qcompile.kernels.base import KernelSpec
from qcompile.measure import (
    MeasurePolicy,
    measure_modules,
    measuring_provenance,
    this_device_model,
)
from qcompile.progress import TuneProgress
from qcompile.remote import query_remote, remote_provenance
from qcompile.trust.choice import (
    DEFAULT_TOP,
    Candidate,
    believe,
    claimed_by,
    store_measurement,
)
from qcompile.trust.seals import Sealer
from qcompile.trust.workloads import workload_database
from schedules import search_strategy, space_generator
from schedules.variants import compute_for
from targets.host import usable_cores
from targets.isa import require_tune_host
from tuning_db import Storage
from tuning_db.database import SqlDatabase, WorkloadSetDatabase
from tuning_db.layers import Layers
from tuning_db.models import PURPOSE_REMEASURE

log = logging.getLogger(__name__)

#: Candidates per batch: built and measured together, committed together.
BATCH = 8
#: A spec of a layer set stops when its best improved by less than this share ...
FLAT_GAIN = 0.01
#: ... over this many of its measured candidates (4 batches).
FLAT_PATIENCE = 4 * BATCH
#: After a busy run, how many of the best candidates are measured again.
REMEASURE_TOP = 3
#: How long a busy run waits for a quieter machine before re-measuring (seconds).
QUIET_WAIT_S = 60.0


@dataclass(frozen=True)
class TuneSummary:
    """What a tuning run did and found (the CLI prints it)."""

    name: str
    target: str
    trials: int
    failed: int
    stored: int
    best_us: float | None
    gbps: float | None
    record_id: int | None
    elapsed_s: float
    database: str
    #: Records already there (every layer) that counted toward the budget.
    reused: int = 0
    #: Where the best record lives (URL, secrets masked), when it was reused.
    source: str = ""
    #: When reused: how its latency is known ("sealed by the host key", or "claimed by ...,
    #: not verified here": what ``qcompile build`` would re-measure).
    how: str = ""
    #: Candidates measured while other processes kept the machine busy.
    busy: int = 0
    #: The most cores others kept busy during a batch.
    max_other_load: float = 0.0
    #: After a busy run: how many of the best were re-measured, and the load then.
    remeasured: int = 0
    remeasure_load: float | None = None
    #: Measured through an RPC tracker: "<host> (<device model>) via tracker H:P, key K".
    measured_on: str = ""

    def lines(self) -> list[str]:
        best = f"{self.best_us:.1f} us" if self.best_us is not None else "none (no valid record)"
        rate = f"{self.gbps:.1f} GB/s effective" if self.gbps is not None else "-"
        if self.reused and self.trials == 0:
            return [
                f"tuned {self.name} for {self.target}: 0 trials, reused {self.reused} records "
                f"(--force tunes anyway)",
                f"  best      {best}   {rate}   (record {self.record_id} in {self.source}; "
                f"{self.how})",
            ]
        resumed = f", after {self.reused} records already there" if self.reused else ""
        lines = [
            f"tuned {self.name} for {self.target}: {self.trials} trials in {self.elapsed_s:.0f} s "
            f"({self.failed} failed{resumed})",
            f"  best      {best}   {rate}   (record {self.record_id})",
            f"  stored    {self.stored} records in {self.database}",
        ]
        if self.measured_on:
            lines.append(f"  measured  on {self.measured_on}")
        if self.busy:
            lines.append(
                f"  warning   {self.busy} of {self.trials} candidates were measured while other "
                f"processes kept up to {self.max_other_load:.1f} cores busy: their latencies "
                "may be inflated")
            if self.remeasured:
                quiet = "" if self.remeasure_load is None else \
                    f" (others then used {self.remeasure_load:.1f} cores)"
                lines.append(f"            re-measured the {self.remeasured} best{quiet}; the "
                             "best above is from that run")
        return lines


def tune(spec: KernelSpec, preset, *, trials: int = 64, storage: Storage | None = None,
         seed: int = 0, hw=None, policy: MeasurePolicy | None = None,
         progress: bool | TuneProgress = True, work_dir: str | None = None,
         layers: Layers | None = None,
         force: bool = False, quiet_wait_s: float = QUIET_WAIT_S) -> TuneSummary:
    """Tune ``spec`` for ``preset`` with a budget of ``trials`` measured candidates.

    Parameters
    ----------
    spec : KernelSpec
    preset : targets.Preset
        ``targets.get("avx2")``, ...
    trials : int
        Candidates to build and measure (MetaSchedule's ``max_trials_global``).
    storage : tuning_db.Storage, optional
        Where records go; default: $QCOMPILE_DB or the SQLite file in the user's cache.
    seed : int
        Seeds the search (same seed, same candidates, given the same measurements).
    hw : hardware model, optional
        Overrides the preset's host-detected model.
    policy : MeasurePolicy, optional
        Build and timing settings; with ``remote`` (:class:`~qcompile.measure.RemoteDevices`)
        candidates are measured on the RPC tracker's servers under its key, and the records
        carry the remote device's host and model (this host need not run the target's code).
    progress : bool or TuneProgress
        Draw a progress bar on stderr (True), or draw on this one (the CLI's, shown before
        TVM loaded: its start is the run's start); False: none. It is closed when tuning ends.
    work_dir : str, optional
        Keeps MetaSchedule's logs there; default: a temporary directory.
    layers : tuning_db.layers.Layers, optional
        Shared database then local one (lookups), and where writes go; overrides ``storage``.
    force : bool
        Tune ``trials`` candidates whatever the databases hold. Without it, the records already
        measured for this spec on this target (every layer, this TVM series) count toward the
        budget: when they reach ``trials`` and one succeeded, nothing is tuned ("0 trials,
        reused"); when fewer, only the rest is tuned, seeded by them (a killed run resumes).
    quiet_wait_s : float
        When candidates were measured on a busy machine, wait up to this long for it to
        quieten, then re-measure the :data:`REMEASURE_TOP` best and store those measurements.

    Records are committed after every batch of :data:`BATCH` candidates, so a killed tuner loses
    at most one batch; its builder and runner processes end with it.

    Raises
    ------
    TargetUnavailableError
        This host cannot run ``preset``'s code (a CPU without its instructions, or no GPU for
        a CUDA preset): tuning measures every candidate here, so it stops before starting.
        With ``policy.remote``: no server under the key, a server that is not a ``qcompile
        rpc-server``, or one that cannot run the target's code.
    """
    if trials <= 0:
        raise UsageError(f"trials must be positive; got {trials}")
    if policy is not None and policy.remote is not None:
        pass  # measured on the RPC servers: _tune checks their device before tuning
    elif preset.kind == "cpu":
        require_tune_host(preset)
    elif preset.kind == "cuda":
        supported, reason = preset.host_support()
        if not supported:
            raise TargetUnavailableError(
                f"tuning for {preset.name} measures every candidate on a GPU, and this host "
                f"cannot run one: {reason}. Tune on a GPU machine (tools/studies/tune_cuda.py) and "
                f"bring its records here; qcompile build --target {preset.name} needs no GPU")
    if not isinstance(progress, TuneProgress):
        progress = TuneProgress(trials, f"{spec.name()} @{preset.name}", enabled=progress)
    with progress:
        return _tune(spec, preset, trials, storage, seed, hw, policy, progress, work_dir,
                     layers, force, quiet_wait_s)


def _tune(spec: KernelSpec, preset, trials: int, storage: Storage | None, seed: int, hw,
          policy: MeasurePolicy | None, progress: TuneProgress, work_dir: str | None,
          layers: Layers | None, force: bool, quiet_wait_s: float) -> TuneSummary:
    started = progress.started
    _tvm.quiet_meta_schedule()
    layers = layers or Layers.single(storage or Storage())
    storage = layers.writer
    remote = policy.remote if policy is not None else None
    device = None
    if remote is not None:
        progress.set_phase(f"asking the RPC tracker {remote.address} for a device")
        device = query_remote(remote, preset)
    # The measuring machine's model: the RPC servers' cores and caches when measured there.
    hw = hw or (device.hardware(preset) if device is not None else preset.hardware())
    target = _tvm.Target(preset.tvm_target(hw))
    # The search and the builds run on this host's cores, whatever cores the kernel is made
    # for (a GPU's, an RPC server's, or a CPU target of fewer cores: QCOMPILE_HW="cores=2").
    cores = usable_cores()
    policy = policy or MeasurePolicy.for_target(preset.kind, build_workers=cores)
    measured_on = ""
    if device is not None:
        provenance, device_model = remote_provenance(device), device.device_model
        measured_on = f"{device.describe()} via the RPC tracker {remote.address}, key {remote.key}"
    else:
        provenance, device_model = measuring_provenance(preset), this_device_model(preset)
    family = family_of(spec)
    mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
    sealer = Sealer.load()
    # Records (and their seals) name the device that measured them: the remote one under RPC.
    database = workload_database(storage, spec, target, provenance=provenance,
                                 readers=layers.readers, sealer=sealer)
    progress.set_phase("reading the database")
    reused = 0 if force else database.measured(mod)
    if reused:
        found = database.candidates(mod, DEFAULT_TOP)
        if found and reused >= trials:
            log.info("%s: %d records already measured; 0 trials", spec.name(), reused)
            record, best_us, how = _reused_best(found, device_model, sealer)
            progress.close(f"reused {reused} records")
            return TuneSummary(
                name=spec.name(), target=preset.name, trials=0, failed=0, stored=0,
                best_us=best_us, gbps=family.bytes_read(spec) / (best_us * 1e3),
                record_id=record.id, elapsed_s=time.monotonic() - started,
                database=layers.describe(), reused=reused, source=record.database, how=how)
        trials = max(1, trials - reused)
    progress.set_total(trials)
    database.register(mod)  # fail here, with our error, before MetaSchedule's FFI wraps it
    recorder = RecordMeasurements(database, remote=remote is not None)
    callbacks = [recorder, _tvm.ms.measure_callback.RemoveBuildArtifact(),
                 _tvm.ms.measure_callback.UpdateCostModel(), ShowProgress(progress)]
    progress.set_phase("searching (batch 1)")
    with tempfile.TemporaryDirectory(prefix="qcompile-tune-") as scratch:
        context = _tvm.tune_context(
            mod=mod, target=target, space_generator=space_generator(spec, preset.kind, hw),
            search_strategy=search_strategy(spec, preset.kind),
            task_name=spec.name(),
            rand_state=seed,
            num_threads=cores,
            logger=_tvm.ms.logging.get_logger(f"qcompile.tune.{spec.name()}"),
        )
        _tvm.ms.tune.tune_tasks(
            tasks=[context], task_weights=[1.0], work_dir=work_dir or scratch,
            max_trials_global=trials, num_trials_per_iter=min(trials, BATCH),
            builder=ProgressBuilder(policy.builder(), progress),
            runner=ProgressRunner(policy.runner(family.measure_arguments(spec)), progress,
                                  concurrent=remote is not None),
            database=database,
            cost_model="xgb", measure_callbacks=callbacks, task_scheduler="round-robin",
        )
    best = database.best(mod)
    best_us = best[1].mean_us if best else None
    record_id = best[1].id if best else None
    remeasured, remeasure_load = 0, None
    # Never under RPC: recorder.busy stays 0 (this host's load does not touch the remote's).
    if recorder.busy and best is not None:
        progress.set_phase("waiting for a quiet machine to re-measure the best")
        remeasure_load = recorder.load_meter.wait_for_quiet(quiet_wait_s)
        progress.set_phase(f"re-measuring the {REMEASURE_TOP} best")
        remeasured, record_id, best_us = _remeasure_best(
            database, mod, spec, preset, target, policy, sealer, remeasure_load)
    return TuneSummary(
        name=spec.name(), target=preset.name, trials=recorder.measured, failed=recorder.failed,
        stored=recorder.stored, best_us=best_us,
        gbps=family.bytes_read(spec) / (best_us * 1e3) if best_us else None,
        record_id=record_id, elapsed_s=time.monotonic() - started,
        database=storage.display_url, reused=reused, busy=recorder.busy,
        max_other_load=recorder.max_other_load, remeasured=remeasured,
        remeasure_load=remeasure_load, measured_on=measured_on,
    )


def _reused_best(found, device_model: str | None, sealer: Sealer):
    """The record a 0-trial tune reports, as ``build`` judges it: the fastest latency believed
    for ``device_model`` (the device that would measure: this host's, or the RPC servers');
    when none is believed, the fastest claim, said to be one. Returns (record, latency in us,
    how it is known)."""
    believed = []
    for storage, _, record in found:
        measurements = storage.measurements([record.id])[record.id]
        belief = believe(record, measurements, sealer, device_model)
        if belief is not None:
            believed.append((belief.mean_us, record, belief))
    if believed:
        mean_us, record, belief = min(believed, key=lambda item: item[0])
        return record, mean_us, f"sealed by the {belief.key}"
    _, _, record = min(found, key=lambda item: item[2].mean_us)
    return record, record.mean_us, (f"{claimed_by(record)}: not verified here, `qcompile "
                                    "build` re-measures it")


def _remeasure_best(database: SqlDatabase, mod, spec: KernelSpec, preset, target,
                    policy: MeasurePolicy, sealer: Sealer,
                    load: float) -> tuple[int, int | None, float | None]:
    """Measure the :data:`REMEASURE_TOP` best records again and store the measurements;
    returns (how many were measured, the fastest's id, its latency)."""
    candidates = [Candidate(storage, info, record, None)
                  for storage, info, record in database.candidates(mod, REMEASURE_TOP)]
    results = measure_modules([database.replay(mod, c.record) for c in candidates],
                              target, policy, family_of(spec).measure_arguments(spec))
    provenance = measuring_provenance(preset)
    timed = [(c, m) for c, m in zip(candidates, results, strict=True) if m.run_secs]
    for candidate, measured in timed:
        store_measurement(database.storage, candidate, measured, purpose=PURPOSE_REMEASURE,
                          provenance=provenance, sealer=sealer, other_load=load)
    if not timed:
        return 0, None, None
    fastest, measured = min(timed, key=lambda item: item[1].mean_us)
    return len(timed), fastest.record.id, measured.mean_us


class LayerSetRow(NamedTuple):
    """One spec of a layer-set job."""

    spec: str
    calls: float
    #: Candidates this job measured for it (0: its records were reused).
    trials: int
    best_us: float | None
    #: It stopped early, its best flat.
    stopped: bool


@dataclass(frozen=True)
class LayerSetSummary:
    """What :func:`tune_layer_set` did: the trials each spec got, its best, and the job's."""

    target: str
    elapsed_s: float
    rows: list[LayerSetRow]
    database: str

    def lines(self) -> list[str]:
        trials = sum(r.trials for r in self.rows)
        weighted = sum(r.calls * r.best_us for r in self.rows if r.best_us is not None)
        lines = [f"tuned {len(self.rows)} layer shapes for {self.target} as one job: {trials} "
                 f"trials in {self.elapsed_s:.0f} s; the layers' time per forward pass (each "
                 f"best times its calls): {weighted:.1f} us",
                 f"  {'spec':44s} {'calls':>5s} {'trials':>6s} {'best us':>9s}"]
        for name, weight, measured, best_us, stopped in self.rows:
            best = f"{best_us:9.1f}" if best_us is not None else f"{'-':>9s}"
            flat = "  (stopped: flat)" if stopped else "  (reused its records)" if \
                measured == 0 and best_us is not None else ""
            lines.append(f"  {name:44s} {weight:5.0f} {measured:6d} {best}{flat}")
        lines.append(f"  stored in {self.database}")
        return lines


@derived_object
class StopWhenFlat(_tvm.ms.measure_callback.PyMeasureCallback):
    """Terminate a task whose best latency has not improved by :data:`FLAT_GAIN` over its last
    ``patience`` measured candidates (its share of the budget then goes to the others)."""

    def __init__(self, patience: int, budget: int) -> None:
        super().__init__()
        self.patience = patience
        #: The job's trial budget: no task is stopped once it is all sent.
        self.budget = budget
        self.best: dict[int, float] = {}
        self.since: dict[int, int] = {}
        self.measured: dict[int, int] = {}
        self.stopped: set[int] = set()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        for built, ran in zip(builder_results, runner_results, strict=True):
            self.measured[task_id] = self.measured.get(task_id, 0) + 1
            secs = None if built.error_msg or ran.error_msg else ran.run_secs
            mean = sum(float(s) for s in secs) / len(secs) if secs else None
            best = self.best.get(task_id)
            gained = mean is not None and (best is None or mean < best * (1 - FLAT_GAIN))
            self.since[task_id] = 0 if gained else self.since.get(task_id, 0) + 1
            if mean is not None:
                self.best[task_id] = mean if best is None else min(best, mean)
        tasks = task_scheduler.tasks_
        # Only after every task had its first batch: MetaSchedule's gradient scheduler hands the
        # first round out in turn, terminated or not, and terminates a task twice then. And
        # only while the budget is not all sent: past it the scheduler joins the batches still
        # running (this callback among them) and then terminates every task it finds alive,
        # a second time for one stopped here.
        warmed = all(self.measured.get(i, 0) > 0 for i in range(len(tasks)))
        in_flight = sum(len(t.runner_futures) for i, t in enumerate(tasks)
                        if i != task_id and t.runner_futures is not None)
        sent = sum(self.measured.values()) + in_flight
        if warmed and sent < self.budget and self.since.get(task_id, 0) >= self.patience and \
                not tasks[task_id].is_terminated:
            self.stopped.add(task_id)
            task_scheduler.terminate_task(task_id)


def tune_layer_set(specs: list[KernelSpec], weights: list[float], preset, *, trials: int,
                   layers: Layers | None = None, seed: int = 0,
                   progress: bool | TuneProgress = True, force: bool = False,
                   patience: int = FLAT_PATIENCE) -> LayerSetSummary:
    """Tune a model's distinct layer shapes as one MetaSchedule job that shares ``trials``.

    MetaSchedule's gradient task scheduler gives each next batch to the spec whose weighted
    latency is still falling fastest: ``weights`` are how often a forward pass calls each spec
    (its layers), so a shape the model calls 32 times a token is worth more trials than one it
    calls once. Every spec's search starts from its design space's seeded points (the QIGen
    model's and the heuristic's), candidates are built in parallel processes (one per core), and
    a spec whose best stops moving (by :data:`FLAT_GAIN` over ``patience`` candidates) stops
    early. Records are stored per spec as :func:`tune` stores them.

    Parameters
    ----------
    specs : list of KernelSpec
        Distinct specs of one family kind, all measured with MetaSchedule's random operands.
    weights : list of float
        Calls per forward pass of each spec.
    trials : int
        Candidates measured in all (at least one batch per spec).
    force : bool
        Tune every spec. Without it a spec whose databases already hold ``trials / len(specs)``
        measured records is not tuned again (its row says so), as :func:`tune` reuses them.

    Raises
    ------
    UsageError
        No specs, weights that do not match them, or a spec whose operands need a family's
        own filling (tune those one by one).
    """
    if not specs or len(weights) != len(specs) or min(weights) <= 0:
        raise UsageError(f"a layer set needs specs and a positive weight for each; got "
                         f"{len(specs)} specs and weights {weights}")
    if any(family_of(s).measure_arguments(s) is not None for s in specs):
        raise UsageError("a layer set is measured with random operands; these specs need their "
                         "family's own (act_order permutations, say): tune them one by one")
    trials = max(trials, BATCH * len(specs))
    if preset.kind == "cpu":
        require_tune_host(preset)
    if not isinstance(progress, TuneProgress):
        progress = TuneProgress(trials, f"{len(specs)} shapes @{preset.name}",
                                enabled=progress)
    with progress:
        started = progress.started
        _tvm.quiet_meta_schedule()
        layers = layers or Layers.single(Storage())
        hw = preset.hardware()
        target = _tvm.Target(preset.tvm_target(hw))
        sealer = Sealer.load()
        provenance = measuring_provenance(preset)
        every = []  # (spec, weight, module, view) of every spec
        for spec, weight in zip(specs, weights, strict=True):
            mod = _tvm.normalize_mod(compute_for(spec, preset.kind))
            view = workload_database(layers.writer, spec, target, provenance=provenance,
                                     readers=layers.readers, sealer=sealer)
            every.append((spec, weight, mod, view))
        share = trials / len(specs)
        tuned = [e for e in every if force or e[3].measured(e[2]) < share
                 or e[3].best(e[2]) is None]
        budget = max(BATCH * len(tuned), round(share * len(tuned)))
        stopper = StopWhenFlat(patience, budget)
        if tuned:
            _tune_together(tuned, preset, target, hw, budget, seed, progress, stopper)
    rows = []
    for spec, weight, mod, view in every:
        index = next((i for i, e in enumerate(tuned) if e[0] is spec), None)
        best = view.best(mod)
        rows.append(LayerSetRow(spec.name(), float(weight), stopper.measured.get(index, 0),
                                best[1].mean_us if best else None, index in stopper.stopped))
    return LayerSetSummary(target=preset.name, elapsed_s=time.monotonic() - started,
                           rows=rows, database=layers.writer.display_url)


def _tune_together(tuned: list, preset, target, hw, trials: int, seed: int,
                   progress: TuneProgress, stopper: StopWhenFlat) -> None:
    """One MetaSchedule job over ``tuned`` [(spec, weight, module, view)]: the gradient task
    scheduler, records stored through each spec's view."""
    cores = usable_cores()  # the search and the builds: this host's cores (as in tune)
    policy = MeasurePolicy.for_target(preset.kind, build_workers=cores)
    progress.set_total(trials)
    for _, _, mod, view in tuned:
        view.register(mod)  # our errors (a read-only database), before MetaSchedule's FFI
    database = WorkloadSetDatabase([(mod, view) for _, _, mod, view in tuned])
    recorder = RecordMeasurements(database)
    callbacks = [recorder, stopper, _tvm.ms.measure_callback.RemoveBuildArtifact(),
                 _tvm.ms.measure_callback.UpdateCostModel(), ShowProgress(progress)]
    progress.set_phase("searching (batch 1)")
    with tempfile.TemporaryDirectory(prefix="qcompile-tune-") as scratch:
        contexts = [_tvm.tune_context(
            mod=mod, target=target, space_generator=space_generator(spec, preset.kind, hw),
            search_strategy=search_strategy(spec, preset.kind), task_name=spec.name(),
            rand_state=seed + index, num_threads=cores,
            logger=_tvm.ms.logging.get_logger(f"qcompile.tune.{spec.name()}"))
            for index, (spec, _, mod, _) in enumerate(tuned)]
        _tvm.ms.tune.tune_tasks(
            tasks=contexts, task_weights=[float(e[1]) for e in tuned], work_dir=scratch,
            max_trials_global=trials, num_trials_per_iter=BATCH,
            builder=ProgressBuilder(policy.builder(), progress),
            runner=ProgressRunner(policy.runner(None), progress),
            database=database, cost_model="xgb", measure_callbacks=callbacks,
            task_scheduler="gradient")
