import pytest

import targets
from targets import host


def test_presets_and_their_tvm_targets():
    avx2, avx512 = targets.get("avx2"), targets.get("avx512")
    assert avx2.tvm_target(avx2.hardware(cores=2)) == {
        "kind": "llvm", "mcpu": "core-avx2", "num-cores": 2}
    assert avx512.hardware().vector_registers == 32 and avx2.hardware().vector_registers == 16
    assert avx512.hardware().fp32_lanes == 16 and avx2.hardware().fp32_lanes == 8
    with pytest.raises(ValueError, match="Unknown target 'avx3'; known targets: avx2, avx512"):
        targets.get("avx3")


def test_hardware_overrides_and_gamma():
    hw = targets.get("avx2").hardware(cores=3, l1d_bytes=32768)
    assert hw.cores == 3 and hw.gamma_bits == 32768 * 8


def test_target_key_separates_targets():
    a = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2}
    assert targets.target_key(a) == targets.target_key(dict(reversed(list(a.items()))))
    assert targets.target_key(a) != targets.target_key({**a, "mcpu": "skylake-avx512"})
    assert targets.target_key(a) != targets.target_key({**a, "num-cores": 16})


def test_host_probes_never_raise(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "_CPU_SYSFS", tmp_path / "missing")
    assert host.cache_bytes(1) is None
    assert host._parse_size("48K") == 48 * 1024 and host._parse_size("bogus") is None
    assert host.usable_cores() >= 1
    assert isinstance(host.cpu_model(), str)


def test_host_support_reports_missing_flags(monkeypatch):
    from targets.isa import MCPU_FLAGS

    monkeypatch.setattr(host, "cpu_flags", lambda: frozenset(MCPU_FLAGS["core-avx2"]))
    ok, reason = targets.get("avx512").host_support()
    assert not ok and "lacks 3dnowprefetch, avx512bw, avx512cd, avx512dq, avx512f" in reason
    ok, _ = targets.get("avx2").host_support()
    assert ok
    monkeypatch.setattr(host, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    ok, reason = targets.get("avx2").host_support()
    assert not ok and "lacks abm, avx, bmi1" in reason


def test_cuda_presets_build_tvm_targets_without_a_gpu():
    from qcompile import _tvm

    preset = targets.get("cuda")
    target = _tvm.Target(preset.tvm_target())
    assert target.kind.name == "cuda" and str(target.attrs["arch"]) == "sm_90"
    assert target.host.kind.name == "llvm"
    assert targets.get("sm80").hardware().sm_count == 108
    ok, reason = preset.host_support()
    assert isinstance(ok, bool) and reason
