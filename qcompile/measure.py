"""How candidates are built and timed while tuning: sized for small machines.

MetaSchedule's LocalBuilder starts fresh worker processes for every batch, and its default build
function imports ``tvm.s_tir.tensor_intrin`` in each (20-30 s on 2 cores, primer G2). Our design
spaces never tensorize, so :func:`fast_build` skips that import; workers then start in the few
seconds ``import tvm`` takes.

Light: every builder worker imports this module to run :func:`fast_build`, so TVM
(``qcompile._tvm``) and the database are imported inside the functions that use them.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, replace

from targets.cuda import gpu_model
from targets.host import cpu_model

#: RPCRunner's local workers: how many remote sessions a batch may hold at once.
REMOTE_WORKERS = 4
#: Linux's prctl option that delivers a signal to a process when its parent dies.
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Initializer of every builder and runner worker: end when the tuner ends.

    MetaSchedule's workers are separate Python processes; a tuner killed with SIGKILL cannot
    stop them, and they would live on (hundreds of MB each). Linux can: ``PR_SET_PDEATHSIG``
    sends the worker SIGKILL when its parent goes. If the parent is already gone by the time
    this runs, the worker ends at once.
    """
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to arm
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def fast_build(mod, target, _params):
    """LocalBuilder's build function without the tensor-intrinsic import.

    Returns a ``runtime.Module`` (``tvm.tirx.build``), which LocalBuilder exports; ``tvm.compile``
    would return an ``Executable`` that it cannot export (primer G4).
    """
    from qcompile import _tvm

    mod = _tvm.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return _tvm.tvm.tirx.build(mod, target=target)


@dataclass(frozen=True)
class RemoteDevices:
    """The devices registered with a TVM RPC tracker under one key, where candidates are
    measured instead of here (``qcompile tune --rpc-tracker HOST:PORT --rpc-key KEY``).

    Attributes
    ----------
    tracker_host, tracker_port : str, int
        The tracker's address.
    key : str
        The key the servers registered with (``qcompile rpc-server --key``).
    session_timeout_s : float
        How long one measuring session may last before the server ends it.
    """

    tracker_host: str
    tracker_port: int
    key: str
    session_timeout_s: float = 120.0

    @property
    def address(self) -> str:
        return f"{self.tracker_host}:{self.tracker_port}"


def remote_alloc_argument(f_alloc_argument, _session, device, args_info, alloc_repeat: int):
    """RPCRunner's ``f_alloc_argument`` from a family's LocalRunner one (bound with partial).

    RPCRunner calls it in a local worker process with the RPC session and the session's remote
    device; the family's allocator makes its arrays with ``tvm.runtime.tensor(array, device)``,
    which for a remote device copies them through the session onto the remote host.
    """
    return f_alloc_argument(device, args_info, alloc_repeat)


#: Repeats of one cold call each that time a CPU candidate (their mean is its latency).
COLD_REPEATS = 15


@dataclass(frozen=True)
class MeasurePolicy:
    """How each candidate is built and timed (an explicit value, like MetaSchedule's
    EvaluatorConfig, so that a record can say how it was measured).

    Attributes
    ----------
    build_workers : int
        Parallel build processes (the machine's cores).
    build_timeout_s, run_timeout_s : float
        Per-batch limits; a 2-core machine needs generous ones (primer G2, G8).
    number, repeat, min_repeat_ms : int
        ``time_evaluator`` settings: ``repeat`` medians of ``number`` calls, each repeat at
        least ``min_repeat_ms`` long.
    cold_weights : bool
        Flush the CPU caches of every operand but x before each repeat (TVM's
        ``cache_flush_cpu_non_first_arg``; CPU targets only), one call a repeat: the weights
        come from DRAM, as each layer's do in a model, where a layer that fits the L3 and is
        called again and again would be timed from the L3 (20-40% faster on the EPYC for
        TinyLlama's layers, and a schedule tuned so was 26% slower from DRAM than the
        untuned one). :func:`for_target` sets it for CPU targets.
    """

    build_workers: int = 2
    build_timeout_s: float = 120.0
    run_timeout_s: float = 120.0
    number: int = 10
    repeat: int = 3
    min_repeat_ms: int = 40
    remote: RemoteDevices | None = None
    cold_weights: bool = False

    @classmethod
    def for_target(cls, kind: str, build_workers: int, **settings) -> MeasurePolicy:
        """The policy for a target class ("cpu", "cuda"): on CPUs cold weights, one call
        each of :data:`COLD_REPEATS` repeats; on GPUs the defaults (the GPU's caches cannot be
        flushed from here)."""
        if kind == "cpu":
            settings = {"number": 1, "repeat": COLD_REPEATS, "min_repeat_ms": 0,
                        "cold_weights": True, **settings}
        return cls(build_workers=build_workers, **settings)

    def builder(self):
        from qcompile._tvm import ms

        return ms.builder.LocalBuilder(max_workers=self.build_workers,
                                       timeout_sec=self.build_timeout_s, f_build=fast_build,
                                       initializer=functools.partial(die_with_parent,
                                                                     os.getpid()))

    def runner(self, f_alloc_argument=None):
        """LocalRunner with these settings (RPCRunner when :attr:`remote`);
        ``f_alloc_argument`` (a family's ``measure_arguments``) makes the operands, None:
        MetaSchedule's random fill (on the remote, its ``random_fill_for_measure``)."""
        from qcompile._tvm import ms

        config = ms.runner.EvaluatorConfig(number=self.number, repeat=self.repeat,
                                           min_repeat_ms=self.min_repeat_ms,
                                           enable_cpu_cache_flush=self.cold_weights)
        if self.remote is not None:
            remote = self.remote
            rpc_config = ms.runner.RPCConfig(tracker_host=remote.tracker_host,
                                             tracker_port=remote.tracker_port,
                                             tracker_key=remote.key, session_priority=1,
                                             session_timeout_sec=int(remote.session_timeout_s))
            alloc = (functools.partial(remote_alloc_argument, f_alloc_argument)
                     if f_alloc_argument is not None else None)
            # One local worker per remote session: each waits on its device, not on our cores.
            return ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=config,
                                       f_alloc_argument=alloc, max_workers=REMOTE_WORKERS,
                                       initializer=functools.partial(die_with_parent,
                                                                     os.getpid()))
        return ms.runner.LocalRunner(timeout_sec=self.run_timeout_s, evaluator_config=config,
                                     f_alloc_argument=f_alloc_argument,
                                     initializer=functools.partial(die_with_parent,
                                                                   os.getpid()))


def this_device_model(preset) -> str | None:
    """The model of the device that runs ``preset``'s kernels on this host: the CPU's for CPU
    targets, the first GPU's for CUDA targets; None on a host without one."""
    if preset.kind == "cuda":
        return gpu_model()
    return cpu_model()


def measuring_provenance(preset):
    """Who measures here: this host, user and versions; the device model is the GPU's on a
    GPU target, not the host CPU's."""
    from tuning_db.database import default_provenance

    return replace(default_provenance(),
                   device_model=this_device_model(preset) or "unknown NVIDIA GPU")


@dataclass(frozen=True)
class Measured:
    """One candidate measured outside a tuning run: its run times, or why it has none."""

    run_secs: list[float] | None
    error: str | None = None

    @property
    def mean_us(self) -> float | None:
        return sum(self.run_secs) / len(self.run_secs) * 1e6 if self.run_secs else None


def measure_modules(modules: list, target, policy: MeasurePolicy,
                    f_alloc_argument=None) -> list[Measured]:
    """Build and time scheduled modules here, the way tuning does (same builder, runner and
    timing settings), so the numbers compare with the records' own.

    Parameters
    ----------
    modules : list of tvm.IRModule
        Scheduled workloads (a record's trace replayed on its compute).
    target : tvm.target.Target
    policy : MeasurePolicy
    f_alloc_argument : callable, optional
        The family's ``measure_arguments(spec)``.

    Returns
    -------
    list of Measured
        In the order of ``modules``.
    """
    from qcompile._tvm import ms

    builder = policy.builder()
    runner = policy.runner(f_alloc_argument)
    device_type = "cuda" if target.kind.name == "cuda" else "cpu"
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in modules])
    results: list[Measured] = []
    try:
        for mod, build in zip(modules, built, strict=True):
            if build.error_msg:
                results.append(Measured(None, _last_line(build.error_msg)))
                continue
            args_info = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
            (future,) = runner.run([ms.runner.RunnerInput(build.artifact_path, device_type,
                                                          args_info)])
            ran = future.result()
            if ran.error_msg or not ran.run_secs:
                results.append(Measured(None, _last_line(ran.error_msg or "no run time")))
            else:
                results.append(Measured([float(s) for s in ran.run_secs]))
    finally:
        for build in built:
            if build.artifact_path:
                shutil.rmtree(os.path.dirname(build.artifact_path), ignore_errors=True)
    return results


def _last_line(text: str) -> str:
    """The line of an error text that says what went wrong (a traceback's last)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "failed")[:500]
