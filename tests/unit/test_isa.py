"""The CPU features a library needs (targets/isa.py), the flag-hiding testing aid, the GPU
architecture check, and the refusals of tune and build on a host without a target's features."""

import json
import os
import subprocess
import sys

import pytest

import targets
from qcompile.errors import TargetUnavailableError
from targets import cuda, host, isa


def test_mcpu_table_is_what_llvm_says():
    """MCPU_FLAGS (read by the TVM-free loader) is LLVM's feature list through the mapping."""
    for mcpu, flags in isa.MCPU_FLAGS.items():
        assert isa.target_cpu_flags({"kind": "llvm", "mcpu": mcpu}) == flags, mcpu
    assert targets.get("avx2").required_flags == isa.MCPU_FLAGS["core-avx2"]
    assert targets.get("avx512").required_flags == isa.MCPU_FLAGS["skylake-avx512"]
    assert set(isa.MCPU_FLAGS["core-avx2"]) < set(isa.MCPU_FLAGS["skylake-avx512"])


def test_llvm_names_become_cpuinfo_names_and_tuning_flags_drop():
    assert isa.cpuinfo_flags(["sse4.1", "sse3", "bmi", "lzcnt", "sahf", "avx512vnni", "avxvnni",
                              "avx512bf16", "fast-gather", "xsave", "aes", "64bit"]) == (
        "abm", "avx512_bf16", "avx512_vnni", "avx_vnni", "bmi1", "lahf_lm", "lm", "pni",
        "sse4_1")


def test_mattr_is_applied_and_cuda_targets_need_their_host_part():
    features = isa.llvm_features({"kind": "llvm", "mcpu": "core-avx2",
                                  "mattr": ["+avx512f", "-fma"]})
    assert "avx512f" in features and "fma" not in features and "avx2" in features
    assert isa.target_cpu_flags(targets.get("cuda").tvm_target()) == isa.MCPU_FLAGS["core-avx2"]


def test_hidden_flags_only_remove(monkeypatch):
    real = host.cpu_flags()
    try:
        monkeypatch.setenv(host.HIDE_FLAGS_ENV, "avx512*, sse4_2,no_such_flag")
        host.cpu_flags.cache_clear()
        hidden = host.cpu_flags()
        assert hidden <= real
        assert not any(flag.startswith("avx512") or flag == "sse4_2" for flag in hidden)
        assert real - hidden == {f for f in real if f.startswith("avx512") or f == "sse4_2"}
        assert "no_such_flag" not in hidden
        assert "QCOMPILE_HIDE_CPU_FLAGS=avx512*,sse4_2,no_such_flag" in host.hidden_note()
        ok, reason = targets.get("avx2").host_support()
        assert not ok and "lacks sse4_2" in reason and "flags hidden by" in reason
    finally:
        monkeypatch.delenv(host.HIDE_FLAGS_ENV)
        host.cpu_flags.cache_clear()
    assert host.cpu_flags() == real and host.hidden_note() == ""


def test_tune_and_build_refuse_a_cpu_target_the_host_lacks(monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: frozenset(isa.MCPU_FLAGS["core-avx2"]))
    avx512 = targets.get("avx512")
    with pytest.raises(TargetUnavailableError, match=r"tuning for avx512 measures every "
                       r"candidate on this host, and this host cannot run avx512 code \(mcpu "
                       r"skylake-avx512\): this CPU .* lacks 3dnowprefetch, avx512bw, "
                       r"avx512cd, avx512dq, avx512f, avx512vl; tune on a host that has them"):
        isa.require_tune_host(avx512)
    with pytest.raises(TargetUnavailableError, match="building for avx512 .* lacks .*avx512f.*; "
                       "to build it for a host that has them, pass --for-another-host"):
        isa.require_build_host(avx512, False)
    isa.require_build_host(avx512, True)
    isa.require_tune_host(targets.get("avx2"))
    isa.require_build_host(targets.get("cuda"), False)  # GPU code runs where it is loaded


def test_tune_function_refuses_before_anything(monkeypatch, tmp_path):
    from qcompile.kernels import UniformSpec
    from qcompile.tune import tune
    from tuning_db import Storage

    monkeypatch.setattr(host, "cpu_flags", lambda: frozenset({"sse", "sse2"}))
    url = f"sqlite:///{tmp_path / 't.sqlite'}"
    with pytest.raises(TargetUnavailableError, match="lacks abm, avx, avx2"):
        tune(UniformSpec(k=256, n=256), targets.get("avx2"), trials=4, storage=Storage(url))


def _cli(args, tmp_path, hide="avx512*"):
    code = ("import sys\nfrom qcompile.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, 'tvm' in sys.modules)")
    env = {**os.environ, host.HIDE_FLAGS_ENV: hide, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_cli_refuses_before_loading_tvm(tmp_path):
    out = _cli(["tune", "--target", "avx512", "--shape", "256x256", "--trials", "8"], tmp_path)
    assert out.stdout.split() == ["2", "False"], out
    assert out.stderr.count("\n") == 1 and "lacks avx512bw" in out.stderr
    assert "tune on a host that has them" in out.stderr
    out = _cli(["build", "--target", "avx512", "--shape", "256x256", "--out",
                str(tmp_path / "k")], tmp_path)
    assert out.stdout.split() == ["2", "False"], out
    assert out.stderr.count("\n") == 1 and "pass --for-another-host" in out.stderr


def test_cli_build_for_another_host_gets_past_the_check(tmp_path):
    out = _cli(["build", "--target", "avx512", "--shape", "256x256", "--out",
                str(tmp_path / "k"), "--for-another-host", "--db",
                f"sqlite:///{tmp_path / 'empty.sqlite'}"], tmp_path)
    assert out.stdout.split()[0] == "2", out
    assert "no tuned record" in out.stderr and "for-another-host" not in out.stderr


def test_gpu_architecture_against_the_driver(monkeypatch):
    assert cuda.parse_arch("sm_90") == (9, 0, False)
    assert cuda.parse_arch("sm_100") == (10, 0, False)
    assert cuda.parse_arch("sm_90a") == (9, 0, True)
    assert cuda.parse_arch("compute_90") is None and cuda.parse_arch(90) is None
    a100 = ((("NVIDIA A100-SXM4-80GB", (8, 0)),), "")
    monkeypatch.setattr(cuda, "driver_gpu_capabilities", lambda: a100)
    ok, reason = cuda.arch_support("sm_90")
    assert not ok and reason == ("code for sm_90 needs a GPU of compute capability 9.0 or "
                                 "newer, and the CUDA driver sees only NVIDIA A100-SXM4-80GB "
                                 "(sm_80)")
    assert cuda.arch_support("sm_80")[0] and not cuda.arch_support("sm_89")[0]
    assert not targets.get("cuda").host_support()[0] and targets.get("sm80").host_support()[0]
    h100 = ((("NVIDIA H100", (9, 0)), ("GPU 1", None)), "")
    monkeypatch.setattr(cuda, "driver_gpu_capabilities", lambda: h100)
    assert cuda.arch_support("sm_90a")[0] and cuda.arch_support("sm_80")[0]
    assert cuda.driver_gpus() == (("NVIDIA H100", "GPU 1"), "")
    monkeypatch.setattr(cuda, "driver_gpu_capabilities", lambda: ((), "no NVIDIA driver"))
    assert cuda.arch_support("sm_80") == (False, "no NVIDIA driver")


def test_targets_command_shows_the_presented_host(tmp_path):
    env = {**os.environ, host.HIDE_FLAGS_ENV: "avx512*"}
    out = subprocess.run([sys.executable, "-m", "qcompile.cli", "targets", "--json"],
                         capture_output=True, text=True, timeout=120, check=True, env=env)
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["avx512"]["supported"] is False
    assert "flags hidden by $QCOMPILE_HIDE_CPU_FLAGS=avx512*" in rows["avx512"]["reason"]
