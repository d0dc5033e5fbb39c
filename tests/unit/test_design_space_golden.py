"""The uniform CPU design space, pinned: sketches and sampled decisions for a fixed seed.

A change to schedules/cpu/uniform.py that changes these traces changes every stored record's
meaning; regenerate with QCOMPILE_UPDATE_GOLDEN=1 only for a deliberate change, together with a
compute_version bump if old records no longer replay.
"""

import os
from pathlib import Path

from qcompile import _tvm
from qcompile.kernels import UniformSpec
from schedules.cpu import uniform
from schedules.variants import compute_for
from targets.hardware import CpuHardware

GOLDEN = Path(__file__).parent / "golden" / "uniform_cpu_design_space.txt"
HW = CpuHardware(l1d_bytes=48 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20,
                 vector_registers=16, vector_bits=256, cores=2)


def _traces() -> str:
    spec = UniformSpec(k=256, n=128, bits=4, group_size=64)
    mod = _tvm.normalize_mod(compute_for(spec, "cpu"))
    spaces = uniform.design_space(_tvm.Schedule(mod, seed=1), spec, HW)
    return "\n\n".join(f"# sketch {i}\n{s.trace}" for i, s in enumerate(spaces)) + "\n"


def test_design_space_matches_golden():
    text = _traces()
    if os.environ.get("QCOMPILE_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_every_sketch_builds_and_is_parallel():
    spec = UniformSpec(k=256, n=128, bits=4, group_size=64)
    mod = _tvm.normalize_mod(compute_for(spec, "cpu"))
    for sch in uniform.design_space(_tvm.Schedule(mod, seed=2), spec, HW):
        assert "T.parallel" in sch.mod.script()
        assert "T.vectorized" in sch.mod.script()
