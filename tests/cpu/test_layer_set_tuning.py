"""A model's layer shapes tuned as one job (qcompile.tune.tune_layer_set, ``qcompile tune
--from-gptq``): one MetaSchedule run shares the budget, each spec's records land in its own
workload, a second run reuses them, and specs the job cannot measure are refused in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qcompile.errors import UsageError
from qcompile.kernels import MixedSpec, UniformSpec
from qcompile.tune import BATCH, tune_layer_set
from tuning_db import Storage
from tuning_db.layers import Layers

DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
pytestmark = pytest.mark.slow


def test_one_job_tunes_every_spec_into_its_own_workload(avx2, tmp_path):
    storage = Storage(f"sqlite:///{tmp_path / 'set.sqlite'}")
    specs = [UniformSpec(k=256, n=256), UniformSpec(k=256, n=512)]
    summary = tune_layer_set(specs, [2, 1], avx2, trials=3 * BATCH,
                             layers=Layers.single(storage), progress=False)
    assert [row[0] for row in summary.rows] == [s.name() for s in specs]
    measured = [row[2] for row in summary.rows]
    assert all(m >= BATCH for m in measured)  # each spec's first batch, then the scheduler's
    assert sum(measured) == 3 * BATCH
    assert all(row[3] is not None and row[3] > 0 for row in summary.rows)
    by_name = {w.name: w for w in storage.workloads()}
    for spec, count in zip(specs, measured, strict=True):
        assert storage.count_records(by_name[spec.name()].id) == count
    again = tune_layer_set(specs, [2, 1], avx2, trials=3 * BATCH,
                           layers=Layers.single(storage), progress=False)
    # a spec with its share (trials / specs) measured is reused; the others are tuned again
    share = 3 * BATCH / len(specs)
    for before, row in zip(measured, again.rows, strict=True):
        assert (row[2] == 0) == (before >= share), (before, row)
    assert "as one job" in summary.lines()[0]


def test_a_task_gone_flat_in_the_last_batch_ends_the_job_cleanly(avx2, tmp_path):
    """Patience 1 stops a spec at its first candidate that does not improve it, so the last
    batch's callback wants to stop its spec while MetaSchedule, the budget all sent, is already
    terminating every task (which crashed the job: a task terminated twice)."""
    storage = Storage(f"sqlite:///{tmp_path / 'set.sqlite'}")
    specs = [UniformSpec(k=256, n=256), UniformSpec(k=256, n=512)]
    summary = tune_layer_set(specs, [1, 1], avx2, trials=3 * BATCH,
                             layers=Layers.single(storage), progress=False, patience=1)
    assert sum(row[2] for row in summary.rows) == 3 * BATCH
    assert all(row[3] is not None for row in summary.rows)


def test_specs_with_their_own_operands_are_refused(avx2):
    mixed = MixedSpec(k=256, n=256)
    with pytest.raises(UsageError, match="tune them one by one"):
        tune_layer_set([UniformSpec(k=256, n=256), mixed], [1, 1], avx2, trials=16,
                       progress=False)
    with pytest.raises(UsageError, match="a positive weight for each"):
        tune_layer_set([UniformSpec(k=256, n=256)], [], avx2, trials=16,
                       progress=False)


def test_tune_from_gptq_runs_the_checkpoints_shapes_as_one_job(avx2, tmp_path):
    checkpoint = DATA / "gptqmodel_b4_g128_sym_v2"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    url = f"sqlite:///{tmp_path / 'tuning.sqlite'}"
    result = subprocess.run(
        [sys.executable, "-m", "qcompile.cli", "tune", "--from-gptq", str(checkpoint),
         "--target", "avx2", "--trials", str(BATCH), "--db", url, "--quiet"],
        env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "tuning them as one job" in result.stdout
    assert "layer shapes for avx2 as one job" in result.stdout
    specs = int(result.stdout.split(" distinct kernel specs")[0].rsplit(" ", 1)[1])
    assert specs > 1
    assert len(Storage(url).workloads()) == specs
