"""What an RPC server says of its device (``qcompile.device_info``), and the tuner's checks of
it before measuring there: the target's CPU flags against the remote's, a GPU that runs the
CUDA preset's code, one device model per key (issue 28). TVM-free."""

from __future__ import annotations

import pytest

import targets
from qcompile.errors import TargetUnavailableError
from qcompile.measure import RemoteDevices
from qcompile.remote import SERVER_NAME_ENV, _checked, device_info, remote_provenance
from targets import host

REMOTE = RemoteDevices("127.0.0.1", 9190, "k")


def test_device_info_names_the_server(monkeypatch):
    monkeypatch.setenv(SERVER_NAME_ENV, "from-env")
    assert device_info()["host"] == "from-env"
    info = device_info("from-flag")
    assert info["host"] == "from-flag"
    assert info["cpu_model"] == host.cpu_model()
    assert set(info["cpu_flags"]) == set(host.cpu_flags())


def test_a_remote_cpu_with_the_flags_is_taken():
    info = {"host": "r", "cpu_model": "Some CPU", "cpu_flags": list(targets.get("avx2")
                                                                     .required_flags)}
    device = _checked(info, REMOTE, targets.get("avx2"))
    assert (device.host, device.device_model) == ("r", "Some CPU")
    provenance = remote_provenance(device)
    assert (provenance.host, provenance.device_model) == ("r", "Some CPU")


def test_the_remote_flags_decide_not_this_hosts():
    info = {"host": "r", "cpu_model": "Old CPU", "cpu_flags": ["sse", "sse2"]}
    with pytest.raises(TargetUnavailableError, match=r"RPC server r \(Old CPU, key 'k'\), and "
                                                     r"its CPU lacks .*avx2"):
        _checked(info, REMOTE, targets.get("avx2"))


def test_cuda_needs_a_remote_gpu_that_runs_the_preset():
    preset = next(p for p in targets.PRESETS.values() if p.kind == "cuda")
    base = {"host": "g", "cpu_model": "c", "cpu_flags": []}
    with pytest.raises(TargetUnavailableError, match="reports none"):
        _checked({**base, "gpu_model": None}, REMOTE, preset)
    with pytest.raises(TargetUnavailableError, match="cannot run its code: too old"):
        _checked({**base, "gpu_model": "GPU", "cuda_support": {preset.name: [False, "too old"]}},
                 REMOTE, preset)
    device = _checked({**base, "gpu_model": "GPU", "cuda_support": {preset.name: [True, "ok"]}},
                      REMOTE, preset)
    assert device.device_model == "GPU"


def test_the_design_space_sees_the_remote_cores_and_caches():
    info = {"host": "r", "cpu_model": "Big CPU", "cpu_flags": list(targets.get("avx2")
                                                                    .required_flags),
            "cpu_hardware": {"cores": 96, "l1d_bytes": 48 << 10, "l2_bytes": 2 << 20,
                             "l3_bytes": 256 << 20}}
    preset = targets.get("avx2")
    hw = _checked(info, REMOTE, preset).hardware(preset)
    assert (hw.cores, hw.l1d_bytes, hw.l2_bytes, hw.l3_bytes) == (96, 48 << 10, 2 << 20,
                                                                  256 << 20)
    assert preset.tvm_target(hw)["num-cores"] == 96
    assert set(device_info()["cpu_hardware"]) == {"cores", "l1d_bytes", "l2_bytes", "l3_bytes"}
