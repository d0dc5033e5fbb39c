"""MetaSchedule hooks: store every candidate with its status, and show progress as it goes."""

from __future__ import annotations

from qcompile._tvm import TuningRecord, derived_object, ms
from qcompile.machine_load import LoadMeter
from tuning_db.models import STATUS_BUILD_ERROR, STATUS_OK, STATUS_RUN_ERROR

#: MetaSchedule's run time of a failed candidate (seconds).
_FAILED_RUN_SECS = 1e9


def _first_line(text: str | None, limit: int = 500) -> str:
    text = (text or "").strip()
    return text[:limit]


@derived_object
class RecordMeasurements(ms.measure_callback.PyMeasureCallback):
    """Commit each measured candidate through a :class:`tuning_db.database.SqlDatabase` with a
    status ("ok", "build_error", "run_error") and the error text, never as a 1e10 latency.

    Replaces MetaSchedule's ``AddToDatabase``, which keeps no error message.
    """

    def __init__(self, database, remote: bool = False) -> None:
        super().__init__()
        self.database = database
        #: Measured on RPC servers: this host's load says nothing of theirs, so none is kept.
        self.remote = remote
        self.stored = 0
        self.measured = 0
        self.failed = 0
        self.best_us: float | None = None
        #: Candidates measured while others kept the machine busy (machine_load.BUSY_SHARE).
        self.busy = 0
        #: The most cores others kept busy during one batch.
        self.max_other_load = 0.0
        self.load_meter = LoadMeter()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        task = task_scheduler.tasks_[task_id]
        workload = self.database.commit_workload(task.ctx.mod)
        target = task.ctx.target
        # How busy others kept the machine since the last batch: this batch's build and run.
        load = self.load_meter.lap()
        busy = self.load_meter.busy(load)
        if self.remote:
            # The candidates ran on another machine: this host's load (its builders, its other
            # tenants) did not compete with them, and the remote's is not seen from here.
            load, busy = None, False
        else:
            self.max_other_load = max(self.max_other_load, load)
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results,
                                         strict=True):
            self.measured += 1
            if built.error_msg:
                status, error, secs = STATUS_BUILD_ERROR, _first_line(built.error_msg), None
            elif ran.error_msg or not ran.run_secs:
                status, error, secs = STATUS_RUN_ERROR, _first_line(ran.error_msg), None
            else:
                status, error = STATUS_OK, None
                secs = [float(s) for s in ran.run_secs]
            if status != STATUS_OK:
                self.failed += 1
            record = TuningRecord(candidate.sch.trace, workload, secs, target,
                                  candidate.args_info)
            if self.database.commit_measurement(record, status, error, load) is not None:
                self.stored += 1
            self.busy += busy
            if secs:
                mean_us = sum(secs) / len(secs) * 1e6
                self.best_us = mean_us if self.best_us is None else min(self.best_us, mean_us)


@derived_object
class ShowProgress(ms.measure_callback.PyMeasureCallback):
    """After each batch is stored, tell the progress (:class:`qcompile.progress.TuneProgress`)
    that the next search begins."""

    def __init__(self, progress) -> None:
        super().__init__()
        self.progress = progress
        self.batches = 0

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        self.batches += 1
        if self.progress.measured < self.progress.total:
            self.progress.set_phase(f"searching (batch {self.batches + 1})")
        else:
            self.progress.set_phase("finishing")


@derived_object
class ProgressBuilder(ms.builder.PyBuilder):
    """``builder``, saying when a batch is built and counting the candidates that fail to
    build (they are never run)."""

    def __init__(self, builder, progress) -> None:
        super().__init__()
        self.builder = builder
        self.progress = progress

    def build(self, build_inputs):
        self.progress.set_phase(f"building {len(build_inputs)} candidates")
        results = self.builder.build(build_inputs)
        for result in results:
            if result.error_msg:
                self.progress.candidate(None)
        return results


@derived_object
class ProgressRunner(ms.runner.PyRunner):
    """``runner`` (MetaSchedule's LocalRunner times one candidate after another), one candidate
    at a time, so that each measured candidate shows as it is done."""

    def __init__(self, runner, progress, concurrent: bool = False) -> None:
        super().__init__()
        self.runner = runner
        self.progress = progress
        #: Hand the whole batch to the runner at once (RPCRunner: one session per candidate,
        #: spread over the tracker's servers), then show each as it is done.
        self.concurrent = concurrent

    def run(self, runner_inputs):
        if self.concurrent:
            self.progress.set_phase(f"measuring {len(runner_inputs)} on the RPC servers")
            futures = list(self.runner.run(list(runner_inputs)))
            for future in futures:
                self._show(future.result())
            return futures
        futures = []
        for index, runner_input in enumerate(runner_inputs, 1):
            self.progress.set_phase(f"measuring {index}/{len(runner_inputs)}")
            (future,) = self.runner.run([runner_input])
            self._show(future.result())
            futures.append(future)
        return futures

    def _show(self, result) -> None:
        secs = [float(s) for s in result.run_secs or []]
        ok = not result.error_msg and secs and max(secs) < _FAILED_RUN_SECS
        self.progress.candidate(sum(secs) / len(secs) * 1e6 if ok else None)
