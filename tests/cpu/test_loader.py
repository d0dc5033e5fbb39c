"""The loader refuses what it cannot run safely, with messages that say why."""

import json
import shutil

import numpy as np
import pytest
import torch

import qcompile
from qcompile import _tvm
from qcompile.errors import LoadError
from qcompile.kernels import UniformSpec, get_family
from schedules.variants import compute_for
from targets import host

SPEC = UniformSpec(k=128, n=64, bits=4, group_size=64)
FAMILY = get_family("uniform")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A kernel exported the way qcompile build does (build.export), from a fixed schedule."""
    import targets
    from qcompile.build import export
    from schedules.cpu import uniform

    preset = targets.get("avx2")
    hw = preset.hardware()
    sch = uniform.register_tile(_tvm.Schedule(compute_for(SPEC, "cpu")), SPEC, hw,
                                {"n_blk": 1, "n_reg": 2})
    target = _tvm.Target(preset.tvm_target(hw))
    out = tmp_path_factory.mktemp("built")
    so, _ = export(SPEC, preset, target, sch.mod, out, {"id": 0})
    return so


@pytest.fixture
def copy(built, tmp_path):
    for path in built.parent.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / built.name


def test_loads_and_runs(copy):
    k = qcompile.load(str(copy))
    tensors = FAMILY.example_tensors(SPEC, np.random.default_rng(0))
    x = torch.randn(SPEC.k)
    y = k(x, k.prepare(**tensors))
    ref = FAMILY.reference(SPEC, x.numpy(), **tensors)
    assert np.abs(y.numpy() - ref).max() / np.abs(ref).max() < 1e-5


def test_refuses_a_changed_library(copy):
    with open(copy, "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(LoadError, match="does not match its manifest: sha256"):
        qcompile.load(str(copy))


def test_refuses_missing_or_corrupt_manifest(copy):
    manifest = copy.with_suffix(".json")
    text = manifest.read_text()
    manifest.write_text("{not json")
    with pytest.raises(LoadError, match="unreadable or corrupt"):
        qcompile.load(str(copy))
    data = json.loads(text)
    del data["sha256"]
    manifest.write_text(json.dumps(data))
    with pytest.raises(LoadError, match="lacks sha256"):
        qcompile.load(str(copy))
    manifest.unlink()
    with pytest.raises(LoadError, match="no manifest"):
        qcompile.load(str(copy))


def test_refuses_a_target_the_host_cannot_run(copy, monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: frozenset({"sse", "sse2", "lm"}))
    with pytest.raises(LoadError, match=r"built for target 'avx2' \(mcpu core-avx2\), which "
                       r"this host cannot run: it needs the CPU flags abm avx avx2 .*; this CPU "
                       r"\(.*\) lacks abm, avx, avx2, .*fma"):
        qcompile.load(str(copy))


def test_refuses_an_unknown_preset(copy):
    manifest = copy.with_suffix(".json")
    data = json.loads(manifest.read_text())
    data["target"]["preset"] = "avx1024"
    manifest.write_text(json.dumps(data))
    with pytest.raises(LoadError, match="Unknown target 'avx1024'"):
        qcompile.load(str(copy))


def test_argument_errors_name_argument_and_numbers(copy):
    k = qcompile.load(str(copy))
    w = k.prepare(**FAMILY.example_tensors(SPEC, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="x must be float32 for this kernel; got float16"):
        k(torch.zeros(128, dtype=torch.float16), w)
    with pytest.raises(ValueError, match=r"x must have shape \[128\] or \[1, 128\].*got \[64\]"):
        k(torch.zeros(64), w)
    with pytest.raises(ValueError, match="must be a torch.Tensor or numpy.ndarray; got list"):
        k([0.0] * 128, w)
    with pytest.raises(ValueError,
                       match=r"qweight must have shape \[K\*bits/32, N\]=\(16, 64\).*\(15, 64\)"):
        k.prepare(**{**FAMILY.example_tensors(SPEC, np.random.default_rng(0)),
                     "qweight": np.zeros((15, 64), np.int32)})
    other = UniformSpec(k=128, n=64, bits=4, group_size=32)
    w_other = FAMILY.prepare(other, **FAMILY.example_tensors(other, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="weights were prepared for another spec"):
        k(torch.zeros(128), w_other)


def test_unaligned_and_strided_inputs_are_copied_not_crashed(copy):
    k = qcompile.load(str(copy))
    tensors = FAMILY.example_tensors(SPEC, np.random.default_rng(0))
    w = k.prepare(**tensors)
    base = torch.randn(SPEC.k + 1)
    x = base[1:]  # 4-byte offset: not 64-byte aligned
    y = k(x, w)
    ref = FAMILY.reference(SPEC, x.numpy(), **tensors)
    assert np.abs(y.numpy() - ref).max() / np.abs(ref).max() < 1e-5
    strided = torch.randn(SPEC.k * 2)[::2]
    assert k(strided, w).shape == (SPEC.n,)
