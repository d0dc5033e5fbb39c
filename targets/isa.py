"""The instruction-set features a library needs, in /proc/cpuinfo's names.

LLVM decides which instructions a kernel may contain from its target's ``mcpu`` (and ``mattr``);
the exported library then needs a CPU with those instructions, or its first call dies with
SIGILL. The manifest records them (:func:`target_cpu_flags`, at build time, through LLVM) and
the loader compares them with the host's flags (``targets.host.cpu_flags``) before loading.

Only the features that let LLVM's x86 code generator choose instructions by itself are kept
(:data:`LLVM_TO_CPUINFO`): the vector extensions (SSE to AVX-512 and its subsets, VNNI, BF16,
FP16, GFNI), FMA and F16C, the bit-manipulation instructions (BMI1/2, LZCNT, POPCNT, MOVBE) and
the scalar ones it selects on its own (CMOV, CMPXCHG8B/16B, LAHF/SAHF in 64-bit mode,
PREFETCHW). Left out: LLVM's tuning flags (``fast-gather``, ``slow-3ops-lea``, ...), system
instructions (XSAVE, INVPCID, FSGSBASE, ...) and those reached only through explicit intrinsics,
which no kernel of ours calls (AES, PCLMUL, SHA, RDRAND, ADX, AMX, ...).

LLVM and Linux name some features differently (``sse4.1`` is ``sse4_1``, ``bmi`` is ``bmi1``,
``lzcnt`` is ``abm``, ``avx512vnni`` is ``avx512_vnni``, ...); this module speaks Linux's names.
Reading a manifest needs no TVM: the flags each ``mcpu`` of our presets implies are written out
in :data:`MCPU_FLAGS` (a test checks them against LLVM).
"""

from __future__ import annotations

from collections.abc import Iterable

from qcompile.errors import TargetUnavailableError
from targets import host

#: LLVM x86 feature -> /proc/cpuinfo flag, for the features that matter for code generation
#: (module docstring). Features not named here do not change which instructions a library holds.
LLVM_TO_CPUINFO: dict[str, str] = {
    "64bit": "lm",
    "cmov": "cmov",
    "cx8": "cx8",
    "cx16": "cx16",
    "sahf": "lahf_lm",
    "prfchw": "3dnowprefetch",
    "popcnt": "popcnt",
    "lzcnt": "abm",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "movbe": "movbe",
    "sse": "sse",
    "sse2": "sse2",
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "sse4a": "sse4a",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "fma4": "fma4",
    "xop": "xop",
    "f16c": "f16c",
    "gfni": "gfni",
    "avxvnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
}

#: The flags each ``mcpu`` of our presets implies (LLVM's features through
#: :data:`LLVM_TO_CPUINFO`), so that a manifest is checked without loading TVM.
MCPU_FLAGS: dict[str, tuple[str, ...]] = {
    "core-avx2": (
        "abm", "avx", "avx2", "bmi1", "bmi2", "cmov", "cx16", "cx8", "f16c", "fma", "lahf_lm",
        "lm", "movbe", "pni", "popcnt", "sse", "sse2", "sse4_1", "sse4_2", "ssse3",
    ),
    "skylake-avx512": (
        "3dnowprefetch", "abm", "avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f",
        "avx512vl", "bmi1", "bmi2", "cmov", "cx16", "cx8", "f16c", "fma", "lahf_lm", "lm",
        "movbe", "pni", "popcnt", "sse", "sse2", "sse4_1", "sse4_2", "ssse3",
    ),
}


def cpuinfo_flags(llvm_features: Iterable[str]) -> tuple[str, ...]:
    """LLVM feature names -> the sorted /proc/cpuinfo flags of those that matter for code
    generation (the others are dropped).

    Parameters
    ----------
    llvm_features : iterable of str
        Names as LLVM prints them (``"avx2"``, ``"sse4.1"``, ``"avx512vnni"``).

    Returns
    -------
    tuple of str
        Sorted, without duplicates.
    """
    return tuple(sorted({LLVM_TO_CPUINFO[name] for name in llvm_features
                         if name in LLVM_TO_CPUINFO}))


def llvm_features(llvm_target: dict) -> frozenset[str]:
    """The LLVM features of an ``llvm`` target dict: its ``mcpu``'s, as LLVM (through TVM)
    knows them, with its ``mattr`` (``+feature`` / ``-feature``) applied. Loads TVM.

    Parameters
    ----------
    llvm_target : dict
        ``{"kind": "llvm", "mcpu": ..., "mattr": [...]}`` (a CPU preset's target, or the
        ``host`` part of a CUDA one).

    Returns
    -------
    frozenset of str
    """
    from qcompile import _tvm

    base = {key: llvm_target[key] for key in ("kind", "mcpu", "mtriple") if key in llvm_target}
    features = set(_tvm.tvm.target.codegen.llvm_get_cpu_features(_tvm.Target(base)))
    # TVM's query ignores mattr: apply it here (a "+x" adds x, a "-x" removes it).
    for attr in llvm_target.get("mattr", ()) or ():
        attr = str(attr)
        if attr.startswith("+"):
            features.add(attr[1:])
        elif attr.startswith("-"):
            features.discard(attr[1:])
    return frozenset(features)


def target_cpu_flags(tvm_target: dict) -> tuple[str, ...]:
    """The /proc/cpuinfo flags a library built for ``tvm_target`` needs on the CPU that runs
    it: the target's own for an ``llvm`` target, its ``host`` part's for a CUDA one. Loads TVM.

    Parameters
    ----------
    tvm_target : dict
        A target as ``qcompile._tvm.target_dict`` prints it.

    Returns
    -------
    tuple of str
        Sorted flags (:func:`cpuinfo_flags`).
    """
    llvm = tvm_target if tvm_target.get("kind") == "llvm" else tvm_target.get("host")
    if not isinstance(llvm, dict) or llvm.get("kind") != "llvm":
        return ()
    return cpuinfo_flags(llvm_features(llvm))


def implied_flags(mcpu: str) -> tuple[str, ...] | None:
    """The flags ``mcpu`` implies, without TVM.

    Parameters
    ----------
    mcpu : str
        An LLVM CPU name (``"core-avx2"``).

    Returns
    -------
    tuple of str or None
        :data:`MCPU_FLAGS`'s entry; None for an mcpu no preset uses.
    """
    return MCPU_FLAGS.get(mcpu)


def missing_flags(needed: Iterable[str],
                  flags: Iterable[str] | None = None) -> tuple[list[str], str]:
    """The flags of ``needed`` this host (or the CPU whose ``flags`` are given) lacks. Never
    raises.

    Parameters
    ----------
    needed : iterable of str
        /proc/cpuinfo flag names.
    flags : iterable of str, optional
        Another CPU's flags (an RPC server's, ``qcompile tune --rpc-tracker``); the returned
        description is then "that CPU".

    Returns
    -------
    missing : list of str
        In ``needed``'s order. The host's flags are ``targets.host.cpu_flags()`` (less any
        hidden by ``$QCOMPILE_HIDE_CPU_FLAGS``); when /proc/cpuinfo cannot be read, every flag
        counts as missing.
    host : str
        ``"this CPU (<model>)"`` for messages, saying which flags are hidden, or why none are
        known.
    """
    needed = list(needed)
    if flags is not None:
        flags = frozenset(flags)
        return [flag for flag in needed if flag not in flags], "that CPU"
    flags = host.cpu_flags()
    if not flags:
        return needed, "this host (its /proc/cpuinfo cannot be read to check the CPU's flags)"
    missing = [flag for flag in needed if flag not in flags]
    return missing, f"this CPU ({host.cpu_model()}{host.hidden_note()})"


def require_host_runs(preset, *, action: str, another_host: str = "") -> None:
    """Raise ``TargetUnavailableError`` when ``preset`` is a CPU preset whose instructions this
    host lacks; CUDA presets pass (their GPU code runs where they are loaded). TVM-free, so the
    command line can refuse before loading TVM.

    Parameters
    ----------
    preset : targets.Preset
    action : str
        What was asked, for the message (``"tuning for avx512 measures every candidate here"``).
    another_host : str
        How to do it for another host anyway, appended to the message; empty: there is no way.
    """
    if preset.kind != "cpu":
        return
    supported, reason = preset.host_support()
    if supported:
        return

    tail = f"; {another_host}" if another_host else ""
    raise TargetUnavailableError(f"{action}, and this host cannot run {preset.name} code "
                                 f"(mcpu {preset.mcpu}): {reason}{tail}")


def require_tune_host(preset) -> None:
    """Refuse (``TargetUnavailableError``) tuning for a CPU preset this host cannot run:
    tuning measures every candidate here, so there is no tuning for another host's ISA.

    Parameters
    ----------
    preset : targets.Preset
    """
    require_host_runs(preset, action=f"tuning for {preset.name} measures every candidate on "
                      "this host", another_host="tune on a host that has them")


def require_build_host(preset, for_another_host: bool) -> None:
    """Refuse (``TargetUnavailableError``) a build for a CPU preset this host cannot run,
    unless ``for_another_host`` (the library is then for a host that has the instructions).

    Parameters
    ----------
    preset : targets.Preset
    for_another_host : bool
        ``qcompile build --for-another-host``: build anyway; nothing is run here.
    """
    if for_another_host:
        return
    require_host_runs(preset, action=f"building for {preset.name} makes a library for this host",
                      another_host="to build it for a host that has them, pass "
                      "--for-another-host (build(..., for_another_host=True)) and load it there")


__all__ = ["LLVM_TO_CPUINFO", "MCPU_FLAGS", "cpuinfo_flags", "implied_flags", "llvm_features",
           "missing_flags", "require_build_host", "require_host_runs", "require_tune_host",
           "target_cpu_flags"]
