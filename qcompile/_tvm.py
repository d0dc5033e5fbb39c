"""The one door to TVM. Everything else in qcompile, schedules/, targets/ and tuning_db/ takes
TVM names from here (the import contract in .importlinter forbids ``tvm`` and ``tvm_ffi``
anywhere else), so that a TVM upgrade (0.27 moved tir -> tirx, s_tir, sblock, dict targets)
touches one file. It sits on the bottom floor (docs/architecture.md) and imports nothing of ours.

Importing this module costs seconds (TVM, and torch through tvm_ffi); import it inside
functions from modules that must stay light.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types


def _usable_cores() -> int:
    """Cores this process may run on (its affinity mask), at least 1 (as
    ``targets.host.usable_cores``, which sits above this floor)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# TVM 0.27 sizes its CPU thread pool at half the hardware threads on x86 (it assumes two per
# core): a 2-vCPU machine gets one thread, and every `parallel` loop runs on one core. Unless the
# user chose a number, use every core this process may run on. The pool reads the variable when
# it first starts, and MetaSchedule's runner processes inherit it.
os.environ.setdefault("TVM_NUM_THREADS", str(_usable_cores()))

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import save_json
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule, TensorIntrin
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as ms_ffi
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.script import tirx as T
from tvm.target import Target
from tvm.tirx.expr import FloatImm, IntImm
from tvm.tirx.function import IndexMap
from tvm_ffi import Array, Map

__all__ = [
    "Array",
    "FloatImm",
    "IndexMap",
    "IntImm",
    "Map",
    "RemoveWeightLayoutRewriteBlock",
    "T",
    "Schedule",
    "Target",
    "TensorIntrin",
    "TuningRecord",
    "Workload",
    "derived_object",
    "ms",
    "ms_ffi",
    "normalize_mod",
    "quiet_meta_schedule",
    "save_json",
    "structural_hash",
    "target_dict",
    "tirx",
    "tune_context",
    "tvm",
    "tvm_ffi",
]

TVM_VERSION: str = tvm.__version__
TVM_FFI_VERSION: str = getattr(tvm_ffi, "__version__", "unknown")


#: The package of TVM's built-in tensor intrinsics, which MetaSchedule's TuneContext imports.
_BUILTIN_INTRINSICS = "tvm.s_tir.tensor_intrin"


def tune_context(**kwargs):
    """MetaSchedule's ``TuneContext(**kwargs).clone()`` without importing TVM's built-in tensor
    intrinsics (``tvm.s_tir.tensor_intrin``: 20-55 s on 2 cores, which its constructor spends
    in every process that tunes). Our design spaces tensorize only with the intrinsics our
    kernels register themselves, so an empty module stands in for that package while the
    context is made, and leaves ``sys.modules`` as it found it."""
    if _BUILTIN_INTRINSICS in sys.modules:
        return ms.TuneContext(**kwargs).clone()
    sys.modules[_BUILTIN_INTRINSICS] = types.ModuleType(_BUILTIN_INTRINSICS)
    try:
        return ms.TuneContext(**kwargs).clone()
    finally:
        del sys.modules[_BUILTIN_INTRINSICS]


def normalize_mod(func_or_mod) -> tvm.IRModule:
    """The exact IRModule MetaSchedule stores as a workload: ``{"main": func}``."""
    return _normalize_mod(func_or_mod)


def structural_hash(mod) -> str:
    """Structural hash of an IRModule as MetaSchedule writes it (a decimal string)."""
    return str(tvm_ffi.structural_hash(mod))


def target_dict(target: Target) -> dict:
    """A Target as a plain dict (TVM prints targets as canonical JSON)."""
    return json.loads(str(target))


def quiet_meta_schedule() -> None:
    """Keep MetaSchedule's per-iteration chatter off the console (its work_dir logs keep it)."""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
