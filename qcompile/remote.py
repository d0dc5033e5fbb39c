"""Measuring on other machines through TVM's RPC tracker (``qcompile tune --rpc-tracker``).

The tuner builds candidates here and MetaSchedule's RPCRunner measures them on the servers a
tracker holds under one key (``qcompile.measure.RemoteDevices``). A record must then say which
device measured it, not which host tuned: ``qcompile rpc-server`` is TVM's RPC server with one
function more, ``qcompile.device_info`` (:data:`DEVICE_INFO_FUNC`), which returns the server's
host name, CPU (or GPU) model and CPU flags. Before tuning, :func:`query_remote` asks one server
for it through the tracker, and refuses in one line when no server holds the key, when the
servers are plain TVM ones (no device info), or when their CPUs lack the target's flags.

Light until used: TVM (``qcompile._tvm``) is imported inside the functions.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field, replace

import targets
from qcompile.errors import TargetUnavailableError
from targets import host, isa
from targets.cuda import gpu_model

#: The global function every ``qcompile rpc-server`` registers.
DEVICE_INFO_FUNC = "qcompile.device_info"
#: Overrides the host name a server reports (tests tell their servers apart by it).
SERVER_NAME_ENV = "QCOMPILE_RPC_SERVER_NAME"
#: The CPU hardware numbers a server reports (``CpuPreset.hardware``'s arguments).
CPU_HARDWARE_KEYS = ("cores", "l1d_bytes", "l2_bytes", "l3_bytes")
#: How long the tuner's device-info session may last (seconds).
QUERY_TIMEOUT_S = 30


def device_info(name: str | None = None) -> dict:
    """What this machine measures on: its host name (``name``, else $QCOMPILE_RPC_SERVER_NAME,
    else the host's), CPU model and flags, and its first GPU's model when it has one."""
    try:
        gpu = gpu_model()
    except Exception:  # noqa: BLE001 - no driver, no GPU: a CPU server
        gpu = None
    # Whether this machine's GPU runs each CUDA preset's code (its compute capability), as
    # targets.cuda checks it: the tuner cannot probe a remote GPU.
    cuda = {preset.name: list(preset.host_support()) for preset in targets.PRESETS.values()
            if preset.kind == "cuda"} if gpu else {}
    # The CPU's cores and caches (any CPU preset's model: they are the host's, $QCOMPILE_HW
    # included): the tuner's design space and target (num-cores) are the server's, not its own.
    cpu = next(p for p in targets.PRESETS.values() if p.kind == "cpu").hardware()
    return {"host": name or os.environ.get(SERVER_NAME_ENV) or host.hostname(),
            "cpu_model": host.cpu_model(), "cpu_flags": sorted(host.cpu_flags()),
            "cpu_hardware": {key: getattr(cpu, key) for key in CPU_HARDWARE_KEYS},
            "gpu_model": gpu, "cuda_support": cuda}


def register_device_info(name: str | None = None) -> None:
    """Register :data:`DEVICE_INFO_FUNC` in this process (the RPC server's init callback: its
    session processes are forked from the process that runs it)."""
    from qcompile import _tvm

    text = json.dumps(device_info(name))
    _tvm.tvm_ffi.register_global_func(DEVICE_INFO_FUNC, lambda: text, override=True)


def serve(tracker: tuple[str, int], key: str, host_name: str = "127.0.0.1", port: int = 9090,
          name: str | None = None) -> None:
    """Run TVM's RPC server on ``host_name:port`` (or the next free port below port + 100),
    registered with ``tracker`` under ``key``, until this process is ended."""
    from qcompile import _tvm

    # reuse_addr=False: with it, two servers on one machine bind the same port and the
    # second fails at listen() instead of moving on to the next free port.
    try:
        server = _tvm.tvm.rpc.Server(host_name, port, min(port + 100, 65536),
                                     tracker_addr=tracker, key=key, reuse_addr=False,
                                     server_init_callback=functools.partial(
                                         register_device_info, name))
    except (OSError, ValueError, RuntimeError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise TargetUnavailableError(f"cannot serve on {host_name}:{port}..{port + 99}: "
                                     f"{lines[-1] if lines else error}") from None
    print(f"qcompile rpc-server: serving on {host_name}:{server.port}, registered with the "
          f"tracker {tracker[0]}:{tracker[1]} under key {key!r}", flush=True)
    server.proc.join()


@dataclass(frozen=True)
class RemoteDevice:
    """The device a tracker's server measured on, as it described itself."""

    host: str
    device_model: str
    cpu_flags: frozenset[str]
    #: The server's cores and cache sizes (``CpuPreset.hardware``'s arguments); empty: unknown.
    cpu_hardware: dict = field(default_factory=dict)

    def hardware(self, preset):
        """``preset``'s hardware model of the remote machine (a CPU preset's cores and caches
        are the server's; a CUDA preset's model is fixed)."""
        if preset.kind != "cpu":
            return preset.hardware()
        return preset.hardware(**{key: int(value) for key, value in self.cpu_hardware.items()
                                  if key in CPU_HARDWARE_KEYS and value})

    def describe(self) -> str:
        return f"{self.host} ({self.device_model})"


def _connect(remote):
    import socket

    from qcompile import _tvm

    # TVM's connect_tracker retries for a minute, warning every 5 s: try once, quietly, first.
    try:
        socket.create_connection((remote.tracker_host, remote.tracker_port), timeout=5).close()
    except OSError as error:
        raise TargetUnavailableError(f"cannot reach the RPC tracker at {remote.address}: "
                                     f"{error.strerror or error}") from None
    try:
        return _tvm.tvm.rpc.connect_tracker(remote.tracker_host, remote.tracker_port)
    except Exception as error:  # noqa: BLE001 - TVM raises RuntimeError/OSError/TVMError
        raise TargetUnavailableError(
            f"cannot reach the RPC tracker at {remote.address}: "
            f"{str(error).strip().splitlines()[-1] if str(error).strip() else error}") from None


def query_remote(remote, preset) -> RemoteDevice:
    """Ask one of the servers under ``remote.key`` what it is, and check that it can run
    ``preset``'s code (its CPU's flags, as ``targets.isa`` checks this host's).

    Parameters
    ----------
    remote : qcompile.measure.RemoteDevices
    preset : targets.Preset

    Raises
    ------
    TargetUnavailableError
        The tracker is unreachable; no server holds the key; the server is not a
        ``qcompile rpc-server``; its CPU lacks the target's flags (CPU presets), or it reports
        no GPU (CUDA presets).
    """
    tracker = _connect(remote)
    servers = [info for info in tracker.summary().get("server_info", [])
               if str(info.get("key", "")).split(":", 1)[-1] == remote.key]
    if not servers:
        raise TargetUnavailableError(
            f"no RPC server is registered with the tracker at {remote.address} under key "
            f"{remote.key!r}; start one with: qcompile rpc-server --tracker {remote.address} "
            f"--key {remote.key}")
    # One session per registered server, each held while the next is asked for, so that the
    # tracker hands out every one: a key names one device model, and records measured on any
    # of them carry every host name.
    sessions, infos = [], []
    for _ in servers:
        try:
            session = tracker.request(remote.key, priority=1, session_timeout=QUERY_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001
            raise TargetUnavailableError(
                f"the RPC tracker at {remote.address} gave no session under key "
                f"{remote.key!r}: {_last_line(error)}") from None
        sessions.append(session)
        try:
            text = session.get_function(DEVICE_INFO_FUNC)()
        except Exception:  # noqa: BLE001 - TVM: "Cannot find function ..."
            raise TargetUnavailableError(
                f"an RPC server under key {remote.key!r} (tracker {remote.address}) has no "
                f"{DEVICE_INFO_FUNC}, so its records could not say which device measured "
                "them: start the servers with qcompile rpc-server") from None
        infos.append(json.loads(str(text)))
    del sessions
    devices = [_checked(info, remote, preset) for info in infos]
    models = sorted({device.device_model for device in devices})
    if len(models) > 1:
        raise TargetUnavailableError(
            f"the RPC servers under key {remote.key!r} (tracker {remote.address}) are of "
            f"{len(models)} device models ({'; '.join(models)}): a key must name one, since "
            "the tracker hands any of them a candidate to measure")
    hosts = ",".join(sorted({device.host for device in devices}))[:255]
    flags = frozenset.intersection(*(device.cpu_flags for device in devices))
    # One model: the same cores and caches, unless overridden on a server; take the smallest.
    numbers = {key: min(device.cpu_hardware.get(key) or 0 for device in devices)
               for key in CPU_HARDWARE_KEYS}
    return RemoteDevice(host=hosts, device_model=models[0], cpu_flags=flags,
                        cpu_hardware={key: value for key, value in numbers.items() if value})


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _checked(info: dict, remote, preset) -> RemoteDevice:
    """One server's device info, refused when it cannot run ``preset``'s code."""
    flags = frozenset(info.get("cpu_flags") or ())
    if preset.kind == "cuda":
        if not info.get("gpu_model"):
            raise TargetUnavailableError(
                f"tuning for {preset.name} measures on a GPU, and the RPC server "
                f"{info.get('host')} under key {remote.key!r} reports none")
        model = info["gpu_model"]
        supported, reason = (info.get("cuda_support") or {}).get(
            preset.name, (False, f"it does not know the preset {preset.name}"))
        if not supported:
            raise TargetUnavailableError(
                f"tuning for {preset.name} measures on the RPC server {info.get('host')}'s GPU "
                f"({model}, key {remote.key!r}), which cannot run its code: {reason}")
    else:
        model = info.get("cpu_model") or "unknown"
        missing, _ = isa.missing_flags(preset.required_flags, flags)
        if missing:
            raise TargetUnavailableError(
                f"tuning for {preset.name} measures every candidate on the RPC server "
                f"{info.get('host')} ({model}, key {remote.key!r}), and its CPU lacks "
                f"{', '.join(missing)}")
    return RemoteDevice(host=str(info.get("host") or "unknown"), device_model=model,
                        cpu_flags=flags, cpu_hardware=dict(info.get("cpu_hardware") or {}))


def remote_provenance(device: RemoteDevice):
    """The provenance of a measurement made on ``device``: its host and model; the user and
    versions are the tuner's (it built the candidate)."""
    from tuning_db.database import default_provenance

    return replace(default_provenance(), host=device.host, device_model=device.device_model)
