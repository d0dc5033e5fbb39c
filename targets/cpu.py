"""CPU target presets: a TVM ``llvm`` target and the ISA numbers that go with it.

Cache sizes and core counts are taken from the host (targets/host.py) unless overridden, so the
same preset tunes for the machine it runs on; the ISA numbers are fixed per preset.
"""

from __future__ import annotations

from dataclasses import dataclass

from targets import host, isa, overrides
from targets.hardware import CpuHardware

# Conservative values for when sysfs says nothing (a container without /sys, say).
_FALLBACK_L1D = 32 << 10
_FALLBACK_L2 = 1 << 20
_FALLBACK_L3 = 8 << 20


@dataclass(frozen=True)
class CpuPreset:
    """An ``llvm`` target for one x86 vector ISA.

    Attributes
    ----------
    name : str
        The preset's name on the command line (``avx2``, ``avx512``).
    mcpu : str
        LLVM's CPU name; it selects the instructions LLVM may emit.
    required_flags : tuple of str
        /proc/cpuinfo flags the host needs to run code built for ``mcpu``: every flag of
        LLVM's features for ``mcpu`` that matters for code generation (targets/isa.py).
    vector_bits, vector_registers : int
        Width and count of the ISA's vector registers.
    """

    name: str
    mcpu: str
    description: str
    required_flags: tuple[str, ...]
    vector_bits: int
    vector_registers: int
    kind: str = "cpu"

    def hardware(self, cores: int | None = None, l1d_bytes: int | None = None,
                 l2_bytes: int | None = None, l3_bytes: int | None = None,
                 override: str | None = None) -> CpuHardware:
        """The hardware model of this host for this ISA.

        Precedence: an argument given here, then ``override`` (``"l1d=48K,cores=8"``, see
        targets/overrides.py), then ``$QCOMPILE_HW``, then the probes (sysfs, then CPUID via
        getconf), then conservative fallbacks. Probes never raise; a malformed override raises
        SpecError naming the pair.
        """
        given = {key: value for key, value in {
            "cores": cores, "l1d_bytes": l1d_bytes, "l2_bytes": l2_bytes, "l3_bytes": l3_bytes,
        }.items() if value}
        values = {**overrides.from_environment(), **overrides.parse(override), **given}
        return CpuHardware(
            l1d_bytes=values.get("l1d_bytes") or host.detected_cache_bytes(1) or _FALLBACK_L1D,
            l2_bytes=values.get("l2_bytes") or host.detected_cache_bytes(2) or _FALLBACK_L2,
            l3_bytes=values.get("l3_bytes") or host.detected_cache_bytes(3) or _FALLBACK_L3,
            vector_registers=values.get("vector_registers", self.vector_registers),
            vector_bits=values.get("vector_bits", self.vector_bits),
            cores=values.get("cores") or host.usable_cores(),
        )

    def tvm_target(self, hw: CpuHardware | None = None) -> dict:
        """The TVM target as a dict (0.27 rejects the old ``"llvm -mcpu=..."`` strings)."""
        hw = hw or self.hardware()
        return {"kind": "llvm", "mcpu": self.mcpu, "num-cores": hw.cores}

    def host_support(self) -> tuple[bool, str]:
        """Whether this host can run code built for the preset, and why not. Never raises."""
        if not host.cpu_flags():
            return False, "cannot read /proc/cpuinfo to check the CPU's instruction sets"
        missing, cpu = isa.missing_flags(self.required_flags)
        if missing:
            return False, f"{cpu} lacks {', '.join(missing)}"
        return True, (f"{host.cpu_model()} has the {len(self.required_flags)} CPU flags of "
                      f"{self.mcpu}")


AVX2 = CpuPreset(
    name="avx2",
    mcpu="core-avx2",
    description="x86-64 with AVX2 and FMA (Haswell and later, Zen and later)",
    required_flags=isa.MCPU_FLAGS["core-avx2"],
    vector_bits=256,
    vector_registers=16,
)

AVX512 = CpuPreset(
    name="avx512",
    mcpu="skylake-avx512",
    description="x86-64 with AVX-512 F/BW/DQ/VL (Skylake-SP and later, Zen 4 and later)",
    required_flags=isa.MCPU_FLAGS["skylake-avx512"],
    vector_bits=512,
    vector_registers=32,
)
