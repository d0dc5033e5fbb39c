"""The main job end to end through the command line: tune a small shape, build, load in a fresh
Python process that has only the .so, its manifest and the qcompile package."""

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import targets

QCOMPILE = [sys.executable, "-m", "qcompile.cli"]
SHAPE = "256x256"


def run(args, env, check=True):
    result = subprocess.run(QCOMPILE + args, env=env, capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"qcompile {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


@dataclass
class Tuned:
    """One ``qcompile tune`` run, as a user sees it: its stderr as it grew (seconds since the
    start, text so far, per chunk read), its stdout, its wall time, and its environment."""

    seen: list[tuple[float, str]]
    stdout: str
    wall: float
    env: dict
    cache: Path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The main job's first step, run once for the module (a tune costs 15-30 s): 8 trials of
    SHAPE with the progress bar on, records into the default database of a cache of its own.
    The progress test reads how it showed itself; the end-to-end test builds from its records."""
    preset = targets.get("avx2")
    supported, reason = preset.host_support()
    if not supported:
        pytest.skip(f"host cannot run avx2 code: {reason}")
    cache = tmp_path_factory.mktemp("tuned") / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("QCOMPILE_DB", None)
    started = time.monotonic()
    process = subprocess.Popen(
        QCOMPILE + ["tune", "--target", "avx2", "--shape", SHAPE, "--trials", "8"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[tuple[float, str]] = []

    def read():
        text = ""
        while chunk := os.read(process.stderr.fileno(), 4096):
            text += chunk.decode(errors="replace")
            seen.append((time.monotonic() - started, text))

    reader = threading.Thread(target=read)
    reader.start()
    stdout = process.stdout.read().decode()
    process.wait(timeout=900)
    reader.join(timeout=60)
    wall = time.monotonic() - started
    assert process.returncode == 0, seen[-1][1] if seen else stdout
    return Tuned(seen, stdout, wall, env, cache)


def test_tune_build_load_in_a_fresh_process(tmp_path, tuned, avx2):
    env = tuned.env
    assert "tuned uniform_b4_g128_k256_n256_m1_f32 for avx2: 8 trials" in tuned.stdout
    assert "GB/s effective" in tuned.stdout and "stored    8 records" in tuned.stdout
    default_db = tuned.cache / "qcompile" / "tuning.sqlite"
    assert default_db.is_file(), "with no --db, records go to the user's cache directory"

    listing = run(["db", "ls"], env).stdout
    assert "uniform_b4_g128_k256_n256_m1_f32" in listing and "avx2 (" in listing  # as typed

    out = tmp_path / "kernels"
    run(["build", "--target", "avx2", "--shape", SHAPE, "--out", str(out)], env)
    so = out / "uniform_b4_g128_k256_n256_m1_f32.so"
    manifest = json.loads(so.with_suffix(".json").read_text())
    assert manifest["target"]["preset"] == "avx2" and manifest["spec"]["k"] == 256
    assert {p.name for p in out.iterdir()} >= {so.name, so.with_suffix(".json").name,
                                              "uniform_b4_g128_k256_n256_m1_f32.tir.py",
                                              "uniform_b4_g128_k256_n256_m1_f32.s"}

    # A fresh process, elsewhere, with the two files only: no database, no cache.
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in (so.name, so.with_suffix(".json").name):
        (shipped / name).write_bytes((out / name).read_bytes())
    script = textwrap.dedent(f"""
        import numpy as np, torch, qcompile
        from qcompile.quantize.rtn import quantize_rtn
        k = qcompile.load({str(shipped / so.name)!r})
        rng = np.random.default_rng(0)
        t = quantize_rtn(rng.standard_normal((256, 256)).astype(np.float32), 4, 128)
        w = k.prepare(qweight=torch.from_numpy(t.qweight), scales=torch.from_numpy(t.scales),
                      qzeros=torch.from_numpy(t.qzeros))
        x = torch.from_numpy(rng.standard_normal(256).astype(np.float32))
        y = k(x, w).numpy()
        ref = x.numpy().astype(np.float64) @ t.dequantize().astype(np.float64)
        print("ERR", np.abs(y - ref).max() / np.abs(ref).max())
    """)
    fresh_env = {**env, "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
    result = subprocess.run([sys.executable, "-c", script], env=fresh_env, cwd=shipped,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    error = float(result.stdout.split("ERR")[1])
    assert error < 1e-4
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.slow
def test_tune_shows_progress_from_the_start(tuned):
    """The bar is on stderr at once (while TVM loads), names each phase, counts each candidate
    as it is measured (before the batch is done), ends once; the summary prints once and its
    time counts start-up."""
    seen, stdout = tuned.seen, tuned.stdout

    def first(fragment: str) -> float:
        return next(t for t, text in seen if fragment in text)

    stderr = seen[-1][1]
    assert first("starting TVM") < first("searching (batch 1)") < first("building 8 candidates") \
        < first("measuring 1/8") < first("measuring 8/8") < first("8/8 trials")
    assert first("1/8 trials") < first("measuring 8/8")  # each candidate shows as it is done
    assert "uniform_b4_g128_k256_n256_m1_f32 @avx2" in stderr
    ended = [line for line in stderr.split("\n")[:-1] if "trials [" in line]
    assert len(ended) == 1, stderr  # the bar's line ends once, on its final state
    assert ended[0].split("\r")[-1].rstrip().endswith("done]"), ended[0].split("\r")[-1]
    assert stdout.count("tuned uniform_b4_g128_k256_n256_m1_f32 for avx2: 8 trials") == 1
    summary_s = int(re.search(r"8 trials in (\d+) s", stdout).group(1))
    assert summary_s >= first("reading the database")  # TVM's start-up is in it
    assert summary_s <= tuned.wall + 1


def test_build_without_record_says_what_to_run(env):
    # --for-another-host: the record lookup, whatever this host's instruction set
    result = run(["build", "--target", "avx512", "--shape", "128x128", "--out", "/tmp/x",
                  "--for-another-host"], env, check=False)
    assert result.returncode == 2
    assert "no tuned record for uniform_b4_g128_k128_n128_m1_f32 on avx512" in result.stderr
    assert "qcompile tune --family uniform --shape 128x128" in result.stderr


def test_bad_spec_flags_fail_with_the_rule(env):
    result = run(["tune", "--target", "avx2", "--shape", "4000x64"], env, check=False)
    assert result.returncode == 2
    assert "K=4000 must be divisible by group_size=128" in result.stderr
    result = run(["tune", "--target", "avx2", "--shape", "4096"], env, check=False)
    assert "shape must look like KxN" in result.stderr


def test_targets_lists_presets(env):
    out = run(["targets"], env).stdout
    assert "avx2" in out and "avx512" in out and "host:" in out
    rows = json.loads(run(["targets", "--json"], env).stdout)
    assert {row["name"] for row in rows} == {"avx2", "avx512", "cuda", "sm80", "sm89", "sm90"}
    assert all(row["hardware"]["cores"] >= 1 for row in rows if row["tvm_target"]["kind"] == "llvm")
    cuda = next(row for row in rows if row["name"] == "cuda")
    assert cuda["tvm_target"]["arch"] == "sm_90" and cuda["hardware"]["sm_count"] == 132


def test_the_suggested_tune_command_names_the_same_spec():
    """Messages that say "run: qcompile tune ..." give flags the parser takes back to the spec."""
    import shlex

    from qcompile.build import spec_cli_args
    from qcompile.cli import build_parser, spec_from_args
    from qcompile.kernels import BcqSpec, MixedSpec, UniformSpec

    for spec in (UniformSpec(k=4096, n=4096, int8_activations=True),
                 UniformSpec(k=4096, n=4096, bits=3, group_size=-1, m=4, act_order=True),
                 MixedSpec(k=2048, n=2048, int8_activations=True),
                 BcqSpec(k=1024, n=512, q=3, mu=8)):
        flags = shlex.split(spec_cli_args(spec))
        args = build_parser().parse_args(["tune", "--target", "avx2", *flags])
        assert spec_from_args(args) == spec, flags
