"""Building CUDA kernels on a machine without a GPU: the search over the CUDA design space, the
build from a database record, the export (a .so carrying CUDA C for the GPU machine to compile
when it loads it), and clear refusals where a GPU is needed."""

import json
import os
import subprocess
import sys

import pytest

import qcompile
import targets
from qcompile import _tvm
from qcompile.build import build, build_untuned
from qcompile.errors import LoadError, TargetUnavailableError
from qcompile.kernels import UniformSpec, get_family
from qcompile.measure import MeasurePolicy
from qcompile.trust.seals import Sealer
from qcompile.trust.workloads import workload_database
from qcompile.tune import tune
from schedules import space_generator
from schedules.variants import compute_for
from tuning_db import Storage
from tuning_db.models import STATUS_OK

PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())
FAMILY = get_family("uniform")

pytestmark = pytest.mark.skipif(PRESET.host_support()[0],
                                reason="checks what a host without a GPU does")


def test_untuned_export_carries_cuda_source(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=4)
    result = build_untuned(spec, PRESET, tmp_path)
    name = spec.name()
    assert {p.name for p in tmp_path.iterdir()} == {f"{name}.so", f"{name}.json",
                                                     f"{name}.cu", f"{name}.tir.py"}
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["target"]["kind"] == "cuda" and manifest["record"]["untuned"] is True
    assert manifest["target"]["tvm"]["arch"] == "sm_90"
    source = (tmp_path / f"{name}.cu").read_text()
    assert 'extern "C" __global__ void __launch_bounds__' in source
    # No GPU here, so no cubin: the library embeds the CUDA C, compiled where it is loaded.
    assert f"{name}_kernel".encode() in result.so_path.read_bytes()
    assert b'extern "C" __global__ void __launch_bounds__' in result.so_path.read_bytes()
    with pytest.raises(LoadError, match="built for target 'cuda'.*cannot run: no NVIDIA driver"):
        qcompile.load(result.so_path)


def test_tuning_needs_a_gpu(tmp_path):
    with pytest.raises(TargetUnavailableError, match="measures every candidate on a GPU"):
        tune(UniformSpec(k=256, n=256), PRESET, trials=4,
             storage=Storage(f"sqlite:///{tmp_path / 't.sqlite'}"))


def test_cli_tune_and_build_explain_themselves(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cli = [sys.executable, "-m", "qcompile.cli"]
    tuned = subprocess.run(cli + ["tune", "--target", "cuda", "--shape", "256x256"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert tuned.returncode == 2 and "tools/studies/tune_cuda.py" in tuned.stderr
    built = subprocess.run(cli + ["build", "--target", "cuda", "--shape", "256x256", "--out",
                                  str(tmp_path / "out")], env=env, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 2
    assert "no tuned record for uniform_b4_g128_k256_n256_m1_f32 on cuda" in built.stderr
    assert "--target cuda" in built.stderr


def test_search_yields_valid_candidates_that_build_and_replay(tmp_path):
    """MetaSchedule's evolutionary search over our CUDA space, as tuning on the GPU machine runs
    it up to the measurement: candidates pass VerifyGPUCode, mutate, and build (NVRTC is not
    needed here: the build stores CUDA C). One candidate's trace, stored as a record, then
    builds through ``qcompile build``'s path."""
    ms = _tvm.ms
    spec = UniformSpec(k=1024, n=1024, m=4)
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    context = _tvm.tune_context(  # as qcompile.tune makes it
        mod=mod, target=TARGET, space_generator=space_generator(spec, "cuda", HW),
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=32, init_min_unmeasured=8, genetic_num_iters=2),
        task_name=spec.name(), rand_state=7, num_threads=2)
    spaces = context.space_generator.generate_design_space(context.mod)
    # 4 x 1024 floats of x fit shared memory: all 6 sketches, then the heuristic's with priors.
    assert len(spaces) == 7
    context.search_strategy.pre_tuning(
        max_trials=8, num_trials_per_iter=4, design_spaces=spaces,
        database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    candidates = context.search_strategy.generate_measure_candidates()
    assert len(candidates) == 4
    builder = MeasurePolicy(build_workers=2).builder()
    built = builder.build([ms.builder.BuilderInput(c.sch.mod, TARGET) for c in candidates])
    assert all(b.error_msg is None and os.path.isfile(b.artifact_path) for b in built), [
        b.error_msg for b in built]

    storage = Storage(f"sqlite:///{tmp_path / 'tuning.sqlite'}")
    # Sealed as a tuner seals what it measures: a CUDA build on a host without a GPU can time
    # nothing, so it builds only from records a seal vouches for (qcompile/trust/choice.py).
    database = workload_database(storage, spec, TARGET, sealer=Sealer.load())
    workload = database.commit_workload(mod)
    # A real trace of the space; its latency is a placeholder (nothing can be timed here).
    record = _tvm.TuningRecord(candidates[0].sch.trace, workload, [1e-5], TARGET,
                               candidates[0].args_info)
    record_id = database.commit_measurement(record, STATUS_OK, None)
    result = build(spec, PRESET, tmp_path / "out", storage=storage)
    assert result.record_id == record_id
    assert "__global__" in (tmp_path / "out" / f"{spec.name()}.cu").read_text()
