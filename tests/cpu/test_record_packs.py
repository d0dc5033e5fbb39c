"""Record packs (tuning_db/record_packs.py, qcompile/trust/packs.py) through the CLI, as a user
runs them: a tuned database packed, listed, and built from in a fresh cache with no tuning; a
pack whose records were tampered with refused in one line; the packs that ship with qcompile
valid."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from tuning_db.record_packs import shipped_packs

QCOMPILE = [sys.executable, "-m", "qcompile.cli"]
SHAPE, SECOND_SHAPE = "256x256", "256x512"
pytestmark = pytest.mark.slow


def run(args, env):
    return subprocess.run(QCOMPILE + args, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(packs directory, pack file) of real 4-trial tunes of SHAPE and SECOND_SHAPE, packed."""
    supported, reason = targets.get("avx2").host_support()
    if not supported:
        pytest.skip(f"host cannot run avx2 code: {reason}")
    root = tmp_path_factory.mktemp("packs")
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "tuner-cache")}
    database = f"sqlite:///{root / 'tuned.sqlite'}"
    for shape in (SHAPE, SECOND_SHAPE):
        tuned = run(["tune", "--target", "avx2", "--shape", shape, "--trials", "4", "--quiet",
                     "--db", database], env)
        assert tuned.returncode == 0, tuned.stderr
    (root / "packs").mkdir()
    pack = root / "packs" / "tiny-avx2.jsonl"
    made = run(["db", "export", "--db", database, "--pack", "tiny-avx2", "--target", "avx2",
                "--out", str(pack)], env)
    assert made.returncode == 0, made.stderr
    assert "packed 2 workloads, 2 records" in made.stdout
    return root / "packs", pack


def fresh_env(tmp_path, packs: Path, **extra) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "QCOMPILE_PACKS_DIR": str(packs), "QCOMPILE_PACKS": "1", "QCOMPILE_DB": "",
            **extra}


def test_a_pack_is_listed_with_its_target_and_device_model(packed, tmp_path):
    packs, _ = packed
    listed = run(["db", "packs", "--verbose"], fresh_env(tmp_path, packs))
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.strip().startswith("tiny-avx2"))
    assert "avx2" in line and " 2 " in line  # target, two workloads
    assert "uniform_b4_g128_k256_n256_m1_f32" in listed.stdout


def test_a_fresh_cache_builds_from_the_pack_with_no_tuning(packed, tmp_path):
    packs, pack = packed
    shipped = pack.read_bytes()
    built = run(["build", "--target", "avx2", "--shapes", f"{SHAPE},{SHAPE}", "--out",
                 str(tmp_path / "out")], fresh_env(tmp_path, packs))
    assert built.returncode == 0, built.stderr
    assert built.stdout.count("0 trials: the record comes from a record pack") == 1  # once
    assert "re-measured here" in built.stdout  # a pack's latency is a claim until timed here
    assert list((tmp_path / "out").glob("*.so"))
    assert pack.read_bytes() == shipped  # read, never written


def test_a_layer_set_is_timed_in_one_batch(packed, tmp_path, monkeypatch):
    """build_set (``qcompile build --shapes``): the claims of every spec are built and timed
    in one batch (one pool of build workers, one runner); the next build believes the sealed
    measurements and times nothing."""
    import qcompile.build as build_module
    from qcompile.kernels import UniformSpec
    from qcompile.trust.packs import pack_layer
    from tuning_db import Storage
    from tuning_db.layers import Layers

    packs, _ = packed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("QCOMPILE_PACKS", "1")
    monkeypatch.setenv("QCOMPILE_PACKS_DIR", str(packs))
    batches = []
    measure_modules = build_module.measure_modules

    def counted(modules, *args, **kwargs):  # the real measurement, counted
        batches.append(len(modules))
        return measure_modules(modules, *args, **kwargs)

    monkeypatch.setattr(build_module, "measure_modules", counted)
    layers = Layers.single(Storage(f"sqlite:///{tmp_path / 'local.sqlite'}"))
    layers.packs = pack_layer()
    layers.readers.append(layers.packs)
    specs = [UniformSpec(k=256, n=256), UniformSpec(k=256, n=512)]
    results = build_module.build_set(specs, targets.get("avx2"), tmp_path / "out", layers=layers)
    assert batches == [2]
    assert [r.so_path.name for r in results] == [f"{s.name()}.so" for s in specs]
    assert all("re-measured here" in r.how for r in results)
    again = build_module.build_set(specs, targets.get("avx2"), tmp_path / "again",
                                   layers=layers)
    assert batches == [2] and all("sealed by the host key" in r.how for r in again)


def test_a_build_reads_only_its_targets_packs(packed, tmp_path, monkeypatch):
    from qcompile.trust.packs import pack_layer

    packs, _ = packed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("QCOMPILE_PACKS", "1")
    assert pack_layer(packs, preset=targets.get("avx512")) is None  # validated for nobody
    assert not (tmp_path / "cache" / "qcompile" / "packs").exists()
    assert pack_layer(packs, preset=targets.get("avx2")) is not None


def test_a_build_validates_only_the_packs_holding_its_workloads(packed, tmp_path,
                                                                monkeypatch):
    """A fresh cache's first build pays for the packs it can use, not for every model's."""
    from qcompile.kernels import UniformSpec
    from qcompile.trust.packs import pack_layer

    packs, _ = packed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("QCOMPILE_PACKS", "1")
    k, n = (int(v) for v in SHAPE.split("x"))
    other = UniformSpec(k=k, n=n, bits=3).name()  # in no pack
    assert pack_layer(packs, preset=targets.get("avx2"), names=[other]) is None
    assert not (tmp_path / "cache" / "qcompile" / "packs").exists()
    wanted = UniformSpec(k=k, n=n).name()
    layer = pack_layer(packs, preset=targets.get("avx2"), names=[other, wanted])
    assert layer is not None and wanted in {w.name for w in layer.workloads()}


def test_without_packs_the_build_asks_for_a_tune(packed, tmp_path):
    packs, _ = packed
    built = run(["build", "--target", "avx2", "--shape", SHAPE, "--out", str(tmp_path / "out")],
                fresh_env(tmp_path, packs, QCOMPILE_PACKS="0"))
    assert built.returncode != 0
    assert "no tuned record" in built.stderr and "qcompile tune" in built.stderr
    assert "Traceback" not in built.stderr


def test_a_tampered_pack_is_refused_in_one_line(packed, tmp_path):
    _, pack = packed
    lines = pack.read_text().splitlines()
    for index, text in enumerate(lines):
        line = json.loads(text)
        if line.get("type") == "record":  # a trace that is not a trace
            line["trace_json"] = json.dumps({"insts": "rm -rf /", "decisions": []})
            lines[index] = json.dumps(line)
    bad = tmp_path / "bad-packs"
    bad.mkdir()
    (bad / pack.name).write_text("\n".join(lines) + "\n")
    built = run(["build", "--target", "avx2", "--shape", SHAPE, "--out", str(tmp_path / "out")],
                fresh_env(tmp_path, bad))
    assert built.returncode != 0
    assert "Traceback" not in built.stderr
    assert pack.name in built.stderr  # which file, and why, on the error line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.so"))


def test_the_shipped_packs_are_valid_packs(tmp_path):
    """Each shipped pack imports as a build reads it: every workload rebuilt from its spec with
    this qcompile's TensorIR (same structural hash) and every record's trace replayed on it, so
    a kernel change that leaves a pack stale fails here, not in a user's build."""
    from qcompile.trust.records import store_lines
    from tuning_db import Storage, transfer

    packs = shipped_packs()
    assert {pack.target.split()[0] for pack in packs} >= {"avx2", "cuda"}
    for pack in packs:
        assert pack.workloads == pack.records > 0, pack.name
        assert pack.target and pack.device_model, pack.name
        storage = Storage(f"sqlite:///{tmp_path / pack.name}.sqlite")
        try:
            count = store_lines(storage, transfer.read_jsonl(pack.path), origin=pack.name,
                                source=str(pack.path))
        finally:
            storage.close()
        assert (count.workloads, count.records) == (pack.workloads, pack.records), pack.name


def test_the_kernel_cache_of_models_builds_from_the_packs(packed, monkeypatch):
    from qcompile.errors import NoRecordError
    from qcompile.kernel_cache import KernelCache
    from qcompile.kernels import UniformSpec

    packs, _ = packed
    monkeypatch.setenv("QCOMPILE_PACKS", "1")
    monkeypatch.setenv("QCOMPILE_PACKS_DIR", str(packs))
    cache = KernelCache("avx2", on_missing="error")
    spec = UniformSpec(k=256, n=256)
    assert cache.has_record(spec)
    assert cache.get(spec) is not None  # built from the pack's record, timed here once
    assert cache.best_record(spec) is not None
    with pytest.raises(NoRecordError, match="no tuned record"):
        cache.get(UniformSpec(k=512, n=256))  # not in the pack


def test_a_pack_carries_the_tensorirs_hash_not_its_text(packed):
    """The reader rebuilds each workload's TensorIR from its spec and checks the hash, so a pack
    leaves the text out (megabytes a workload for the GPU kernels)."""
    _, pack = packed
    workloads = [json.loads(line) for line in pack.read_text().splitlines()[1:]
                 if json.loads(line)["type"] == "workload"]
    assert workloads and all("mod_json" not in w and w["mod_hash"] for w in workloads)
