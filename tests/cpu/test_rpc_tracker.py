"""Remote measurement through TVM's RPC tracker (issue 28, item 1): a tracker and
``qcompile rpc-server`` processes on 127.0.0.1, started and stopped by the test, and the real
``qcompile tune --rpc-tracker ... --rpc-key ...``.

Every process is started in a session of its own (its own process group: TVM's server and
tracker run their work in child processes); teardown ends each group and checks that none of
their processes is left.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from targets.host import cpu_model, hostname

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(tmp_path, **extra) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("QCOMPILE_DB", "QCOMPILE_DEBUG")}
    return {**environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")]), **extra}


class Processes:
    """Processes a test starts, each leading its own process group, all ended at teardown."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], **env) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen([sys.executable, *args], env=_env(self.tmp_path, **env),
                                   stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   start_new_session=True)
        self.started.append(process)
        return process

    def group_members(self) -> list[psutil.Process]:
        """The live processes of the started groups (reaping the leaders that ended)."""
        for process in self.started:
            process.poll()
        groups = {process.pid for process in self.started}
        members = []
        for process in psutil.process_iter(["pid", "status"]):
            try:
                if (os.getpgid(process.pid) in groups
                        and process.info["status"] != psutil.STATUS_ZOMBIE):
                    members.append(process)
            except (ProcessLookupError, psutil.Error):
                continue
        return members

    def stop(self) -> None:
        for process in self.started:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.group_members() and time.monotonic() < deadline:
            time.sleep(0.2)
        for process in self.started:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


@pytest.fixture
def processes(tmp_path):
    started = Processes(tmp_path)
    yield started
    started.stop()
    left = started.group_members()
    assert not left, f"processes left after teardown: {[p.pid for p in left]}"


def _wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _wait_for_servers(port: int, key: str, count: int, timeout: float = 60.0) -> None:
    from qcompile import _tvm

    deadline = time.monotonic() + timeout
    found = []
    while time.monotonic() < deadline:
        summary = _tvm.tvm.rpc.connect_tracker("127.0.0.1", port).summary()
        found = [info for info in summary["server_info"] if info["key"].endswith(":" + key)]
        if len(found) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"{len(found)} of {count} servers registered under {key!r}")


@pytest.fixture(scope="module")
def tracker(tmp_path_factory) -> int:
    """A TVM RPC tracker on 127.0.0.1 (its port), one for the module: starting one imports TVM
    (seconds); each test registers its servers under a key of its own."""
    started = Processes(tmp_path_factory.mktemp("tracker"))
    port = _free_port()
    started.start("tracker", ["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                              "--port", str(port), "--port-end", str(port + 1)])
    try:
        _wait_for_port(port)
        yield port
    finally:
        started.stop()
    left = started.group_members()
    assert not left, f"processes left after teardown: {[p.pid for p in left]}"


def _tune(tmp_path, tracker_port: int, key: str, *extra, timeout: float = 600):
    args = ["-m", "qcompile.cli", "tune", "--target", "avx2", "--family", "uniform",
            "--shape", "256x256", "--quiet", "--db", f"sqlite:///{tmp_path / 'tuning.sqlite'}",
            "--rpc-tracker", f"127.0.0.1:{tracker_port}", "--rpc-key", key, *extra]
    return subprocess.run([sys.executable, *args], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def _one_line(result, *fragments) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_no_server_under_the_key_is_one_line(tmp_path, tracker):
    started = time.monotonic()
    result = _tune(tmp_path, tracker, "nobody", "--trials", "8", "--rpc-timeout", "5",
                   timeout=60)
    _one_line(result, "no RPC server is registered with the tracker at "
                      f"127.0.0.1:{tracker} under key 'nobody'", "qcompile rpc-server")
    assert time.monotonic() - started < 30


def test_unreachable_tracker_is_one_line(tmp_path):
    port = _free_port()  # nothing listens there
    result = _tune(tmp_path, port, "k", "--trials", "8", timeout=60)
    _one_line(result, f"cannot reach the RPC tracker at 127.0.0.1:{port}")


@pytest.mark.slow
def test_plain_tvm_server_is_refused(tmp_path, tracker, processes):
    """A server without qcompile.device_info cannot say which device measured: refused."""
    port = _free_port()
    processes.start("plain", ["-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                              "--port", str(port), "--port-end", str(port + 1),
                              "--tracker", f"127.0.0.1:{tracker}", "--key", "plain"])
    _wait_for_servers(tracker, "plain", 1)
    result = _tune(tmp_path, tracker, "plain", "--trials", "8", timeout=120)
    _one_line(result, "has no qcompile.device_info", "start the servers with qcompile rpc-server")


@pytest.mark.slow
def test_tune_through_a_tracker_with_two_servers(tmp_path, tracker, processes):
    """The Done-when test: two servers under one key, a small kernel tuned through them, the
    records in the database with the servers' host names and device model, sealed."""
    for name in ("remote-a", "remote-b"):
        processes.start(name, ["-m", "qcompile.cli", "rpc-server",
                               "--tracker", f"127.0.0.1:{tracker}", "--key", "cpu-test",
                               "--port", str(_free_port())],
                        QCOMPILE_RPC_SERVER_NAME=f"rpc-{name}")
    _wait_for_servers(tracker, "cpu-test", 2)
    result = _tune(tmp_path, tracker, "cpu-test", "--trials", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured  on rpc-remote-a,rpc-remote-b" in result.stdout, result.stdout
    with sqlite3.connect(tmp_path / "tuning.sqlite") as db:
        rows = db.execute("SELECT host, device_model, status, seal, other_load, origin "
                          "FROM tuning_records").fetchall()
    assert len(rows) == 8, rows
    hosts = {row[0] for row in rows}
    assert hosts == {"rpc-remote-a,rpc-remote-b"} and hostname() not in hosts
    assert {row[1] for row in rows} == {cpu_model()}  # the servers run on this machine's CPU
    ok = [row for row in rows if row[2] == "ok"]
    assert ok, rows
    # Sealed (over the remote device model), and no local-load figure for a remote run.
    assert all(row[3].startswith("v1:") for row in ok) and all(row[4] is None for row in rows)
    assert {row[5] for row in rows} == {"tune"}
    # A build on a machine of that device model holding the key (here: this one, the tuner's
    # host key) believes the remote measurements: nothing re-measured.
    build = subprocess.run(
        [sys.executable, "-m", "qcompile.cli", "build", "--target", "avx2", "--family", "uniform",
         "--shape", "256x256", "--db", f"sqlite:///{tmp_path / 'tuning.sqlite'}",
         "--out", str(tmp_path / "out")], env=_env(tmp_path), capture_output=True, text=True,
        timeout=300, cwd=REPO)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "sealed by the host key" in build.stdout, build.stdout


@pytest.mark.slow
def test_mixed_operands_are_made_on_the_remote(tmp_path, tracker, processes):
    """The mixed family's own allocator (valid order/CSR operands, not random ones) makes its
    arrays on the server through the session: every candidate runs there."""
    processes.start("remote-m", ["-m", "qcompile.cli", "rpc-server", "--tracker",
                                 f"127.0.0.1:{tracker}", "--key", "mixed", "--port",
                                 str(_free_port()), "--name", "rpc-mixed"])
    _wait_for_servers(tracker, "mixed", 1)
    result = _tune(tmp_path, tracker, "mixed", "--trials", "4", "--family", "mixed")
    assert result.returncode == 0, result.stderr[-3000:]
    with sqlite3.connect(tmp_path / "tuning.sqlite") as db:
        rows = db.execute("SELECT host, status, error FROM tuning_records").fetchall()
    assert len(rows) == 4 and {row[0] for row in rows} == {"rpc-mixed"}, rows
    assert all(row[1] == "ok" for row in rows), rows
