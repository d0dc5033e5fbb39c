"""The replay check: every kernel variant's design space and heuristic point for a fixed set of
specs, as text, so that a refactor can prove it changed no generated code.

For each case (a spec on a target class, with a fixed hardware model so that the result does
not depend on the machine), :func:`snapshot` records

- ``space``: the design space's sketches with the decisions sampled at seed 1 (the golden
  design space: what stored records mean),
- ``tir``: the heuristic point's scheduled TensorIR,
- ``code``: the code generated from it (CUDA C for CUDA targets, assembly for CPUs, without
  its debug line information: :func:`strip_debug_lines`).

``tools/replay_check.py`` writes the snapshot's digests to a file and compares against one;
``tests/codegen/test_replay.py`` checks the committed baseline.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import targets
from qcompile.kernels import BcqSpec, MixedSpec, UniformSpec
from targets.hardware import CpuHardware

#: Fixed CPU models (not this host's): the generated code must not depend on the machine.
AVX2_HW = CpuHardware(l1d_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20,
                      vector_registers=16, vector_bits=256, cores=2)
AVX512_HW = CpuHardware(l1d_bytes=48 << 10, l2_bytes=2 << 20, l3_bytes=32 << 20,
                        vector_registers=32, vector_bits=512, cores=2)


@dataclass(frozen=True)
class Case:
    """One spec on one target preset."""

    name: str
    spec: object
    preset: str

    def hardware(self):
        preset = targets.get(self.preset)
        if preset.kind == "cuda":
            return preset.hardware()
        return AVX512_HW if self.preset == "avx512" else AVX2_HW


def cases() -> list[Case]:
    """Specs that reach every variant (family x target class x compute), a few each."""
    u, b, x = UniformSpec, BcqSpec, MixedSpec
    return [
        Case("uniform_cpu_b4", u(k=512, n=256), "avx2"),
        Case("uniform_cpu_b3_gcol_m4", u(k=512, n=256, bits=3, group_size=-1, m=4), "avx2"),
        Case("uniform_cpu_b2_f16_act_order", u(k=512, n=256, bits=2, group_size=64,
                                               dtype="float16", act_order=True), "avx512"),
        Case("uniform_cpu_b8_m8", u(k=512, n=256, bits=8, m=8), "avx2"),
        Case("uniform_cpu_int8_b4", u(k=512, n=256, int8_activations=True), "avx2"),
        Case("uniform_cpu_int8_b2_m4", u(k=512, n=256, bits=2, m=4, int8_activations=True),
             "avx512"),
        Case("uniform_cuda_b4", u(k=1024, n=1024), "cuda"),
        Case("uniform_cuda_b4_gcol_m2", u(k=512, n=128, group_size=-1, m=2), "cuda"),
        # group 256: a bf16 spec the tensor-core variant does not take (its groups: 32..128)
        Case("uniform_cuda_b3_bf16_g256_m16", u(k=1024, n=1024, bits=3, m=16, group_size=256,
                                                dtype="bfloat16"), "cuda"),
        Case("uniform_cuda_mma_f16_b4_m8", u(k=1024, n=1024, m=8, dtype="float16"), "cuda"),
        Case("uniform_cuda_mma_f16_b3_bf16_g32", u(k=1024, n=512, bits=3, group_size=32,
                                                    dtype="bfloat16"), "cuda"),
        Case("uniform_cuda_int8_gemv", u(k=4096, n=4096, int8_activations=True), "cuda"),
        Case("uniform_cuda_int8_gemv_b3", u(k=4096, n=4096, bits=3, int8_activations=True),
             "cuda"),
        Case("uniform_cuda_int8_mma", u(k=1024, n=1024, m=16, int8_activations=True), "cuda"),
        Case("uniform_cuda_int8_mma_b2_m4", u(k=1024, n=1024, bits=2, m=4,
                                              int8_activations=True), "cuda"),
        Case("uniform_cuda_int8_dp4a", u(k=1024, n=1000, m=16, group_size=64,
                                         int8_activations=True), "cuda"),
        Case("bcq_cpu_mu4", b(k=256, n=256, mu=4), "avx2"),
        Case("bcq_cpu_mu8_q2", b(k=512, n=256, q=2, mu=8), "avx2"),
        Case("bcq_cuda_tables_mu4", b(k=1024, n=512, q=3, group_size=128, mu=4), "cuda"),
        Case("bcq_cuda_tables_mu8_m2", b(k=1024, n=512, q=3, group_size=128, mu=8, m=2), "cuda"),
        Case("bcq_cuda_rotated", b(k=1024, n=512, q=3, group_size=128, mu=8), "cuda"),
        Case("mixed_cpu", x(k=1024, n=256), "avx2"),
        Case("mixed_cpu_int8", x(k=1024, n=256, int8_activations=True), "avx2"),
        Case("mixed_cuda", x(k=1024, n=256), "cuda"),
        Case("mixed_cuda_int8", x(k=1024, n=256, int8_activations=True), "cuda"),
    ]


#: Assembly lines that carry source locations: ``.loc``/``.file`` directives and the labels
#: LLVM places for them. The TensorIR's spans are the Python lines of the compute that built it,
#: so moving a compute to another file would change them though not one instruction changes.
_DEBUG_LINE = re.compile(r"^\s*(\.loc\s|\.file\s|\.Ltmp\d+:)")
_SECTION = re.compile(r"^\s*(\.section\s+(\S+)|\.text\b|\.data\b|\.bss\b)")


def strip_debug_lines(asm: str) -> str:
    """``asm`` without its debug information: no ``.loc``/``.file`` lines, no ``.Ltmp``
    labels, no ``.debug_*`` sections (whose line tables and DIEs encode the same locations)."""
    kept, in_debug = [], False
    for line in asm.splitlines():
        section = _SECTION.match(line)
        if section:
            in_debug = bool(section.group(2)) and section.group(2).strip('",').startswith(
                ".debug_")
        if in_debug or _DEBUG_LINE.match(line):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def design_space_text(case: Case) -> str:
    """The case's design space: every sketch's trace with its decisions at seed 1."""
    from qcompile import _tvm
    from schedules import get_design_space
    from schedules.variants import compute_for

    kind = targets.get(case.preset).kind
    mod = _tvm.normalize_mod(compute_for(case.spec, kind))
    sketches = get_design_space(case.spec, kind)(_tvm.Schedule(mod, seed=1), case.spec,
                                                  case.hardware())
    return "\n\n".join(f"# {case.name} sketch {i}\n{s.trace}" for i, s in enumerate(sketches)) \
        + "\n"


def heuristic_texts(case: Case) -> tuple[str, str]:
    """(scheduled TensorIR, generated code) of the case's heuristic point."""
    from qcompile import _tvm
    from schedules import untuned_schedule
    from schedules.variants import compute_for

    preset = targets.get(case.preset)
    hw = case.hardware()
    mod = _tvm.normalize_mod(compute_for(case.spec, preset.kind))
    sch = untuned_schedule(_tvm.Schedule(mod, seed=1), case.spec, preset.kind, hw)
    lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw)))
    if preset.kind == "cuda":
        code = "\n".join(m.inspect_source() for m in lib.mod.imports if m.kind == "cuda")
    else:
        code = strip_debug_lines(lib.mod.inspect_source("asm"))
    return sch.mod.script(), code


def snapshot(selected: list[Case] | None = None) -> dict[str, dict[str, str]]:
    """Case name -> {"space", "tir", "code"}: sha256 of each text."""
    out = {}
    for case in selected or cases():
        tir, code = heuristic_texts(case)
        out[case.name] = {"space": _digest(design_space_text(case)), "tir": _digest(tir),
                          "code": _digest(code)}
    return out
