"""MetaSchedule measure callbacks: store every candidate with its status, and show progress."""

from __future__ import annotations

import sys
import time

from qcompile._tvm import TuningRecord, derived_object, ms
from tuning_db.models import STATUS_BUILD_ERROR, STATUS_OK, STATUS_RUN_ERROR


def _first_line(text: str | None, limit: int = 500) -> str:
    text = (text or "").strip()
    return text[:limit]


@derived_object
class RecordMeasurements(ms.measure_callback.PyMeasureCallback):
    """Commit each measured candidate through a :class:`tuning_db.database.SqlDatabase` with a
    status ("ok", "build_error", "run_error") and the error text, never as a 1e10 latency.

    Replaces MetaSchedule's ``AddToDatabase``, which keeps no error message.
    """

    def __init__(self, database) -> None:
        super().__init__()
        from qcompile.machine_load import LoadMeter

        self.database = database
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
class ProgressBar(ms.measure_callback.PyMeasureCallback):
    """A one-line progress bar on stderr: trials measured, best latency so far, failures."""

    def __init__(self, total: int, recorder: RecordMeasurements, label: str, stream=None) -> None:
        super().__init__()
        self.total = max(1, total)
        self.recorder = recorder
        self.label = label
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = self.stream.isatty()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        self.draw()

    def draw(self, final: bool = False) -> None:
        done = min(self.recorder.measured, self.total)
        width = 24
        filled = width * done // self.total
        best = f"{self.recorder.best_us:9.1f} us" if self.recorder.best_us else "      -    "
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done:4d}/{self.total} "
                f"trials  best {best}  failed {self.recorder.failed}  "
                f"{time.monotonic() - self.started:5.0f}s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
