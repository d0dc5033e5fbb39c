"""CUDA target presets: a TVM ``cuda`` target (with an x86 host) and the GPU's hardware model.

Building needs no GPU: TVM generates CUDA C on any machine and the exported ``.so`` carries it;
the machine that loads the ``.so`` compiles it for its GPU (primer section 8). So a preset names
a GPU model, not the GPU in this host; :meth:`CudaPreset.host_support` says whether this host
could run its kernels.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from targets.hardware import GpuHardware

#: Host code of a CUDA module (argument checks, launches): x86-64 with AVX2, which every
#: machine carrying these GPUs has.
HOST_TARGET = {"kind": "llvm", "mcpu": "core-avx2"}


@dataclass(frozen=True)
class CudaPreset:
    """A ``cuda`` target for one GPU model.

    Attributes
    ----------
    name : str
        The preset's name on the command line (``cuda``, ``sm80``, ...).
    description : str
    gpu : GpuHardware
        The GPU's numbers (the design spaces read them; the TVM target carries the limits).
    """

    name: str
    description: str
    gpu: GpuHardware
    kind: str = "cuda"

    def hardware(self) -> GpuHardware:
        """The GPU model (fixed per preset: this host's GPU, if any, is not probed)."""
        return self.gpu

    def tvm_target(self, hw: GpuHardware | None = None) -> dict:
        """The TVM target as a dict: the architecture, the limits TVM verifies, an AVX2 host."""
        hw = hw or self.gpu
        return {
            "kind": "cuda",
            "arch": hw.arch,
            "max_shared_memory_per_block": hw.shared_memory_per_block_bytes,
            "max_threads_per_block": hw.max_threads_per_block,
            "thread_warp_size": hw.warp_size,
            "registers_per_block": hw.registers_per_block,
            "l2_cache_size_bytes": hw.l2_bytes,
            "host": dict(HOST_TARGET),
        }

    def host_support(self) -> tuple[bool, str]:
        """Whether this host can run kernels built for the preset, and why not. Never raises.

        Needs the NVIDIA driver (``libcuda.so.1``) and a GPU it can see whose compute
        capability is at least the preset's architecture (:func:`arch_support`): CUDA C built
        for an older architecture also runs on newer GPUs, not the other way round.
        """
        return arch_support(self.gpu.arch)


def parse_arch(arch: str) -> tuple[int, int, bool] | None:
    """The compute capability an architecture name stands for.

    Parameters
    ----------
    arch : str
        ``"sm_90"``, ``"sm_100"``, ``"sm_90a"``.

    Returns
    -------
    tuple of (int, int, bool) or None
        (major, minor, architecture-specific): (9, 0, False), (10, 0, False), (9, 0, True)
        (an ``a`` target runs on that capability only); None if ``arch`` is not ``sm_XY[a]``.
    """
    match = re.fullmatch(r"sm_(\d{1,2})(\d)(a?)", arch) if isinstance(arch, str) else None
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), bool(match.group(3))


def arch_support(arch: str) -> tuple[bool, str]:
    """Whether a GPU of this host can run code built for ``arch``, and why not. Never raises.

    A GPU fits when its compute capability is at least ``arch``'s (exactly it for an ``sm_XYa``
    architecture); a GPU whose capability the driver does not tell counts as fitting.

    Parameters
    ----------
    arch : str
        ``"sm_90"``, as a CUDA target's ``arch``.

    Returns
    -------
    supported : bool
    reason : str
        The GPUs seen, or why none fits.
    """
    gpus, reason = driver_gpu_capabilities()
    if not gpus:
        return False, reason
    need = parse_arch(arch)

    def fits(capability):
        if capability is None or need is None:
            return True
        if need[2]:
            return capability == need[:2]
        return capability >= need[:2]

    described = ", ".join(f"{name} (sm_{cc[0]}{cc[1]})" if cc else name for name, cc in gpus)
    fitting = [name for name, cc in gpus if fits(cc)]
    if not fitting:
        return False, (f"code for {arch} needs a GPU of compute capability "
                       f"{need[0]}.{need[1]}{' exactly' if need[2] else ' or newer'}, and the "
                       f"CUDA driver sees only {described}")
    return True, f"the CUDA driver sees {len(gpus)} GPU(s): {described}"


def driver_gpus() -> tuple[tuple[str, ...], str]:
    """The GPUs the CUDA driver sees. Never raises.

    Returns
    -------
    names : tuple of str
    reason : str
        Why there are none, when ``names`` is empty.
    """
    gpus, reason = driver_gpu_capabilities()
    return tuple(name for name, _ in gpus), reason


#: cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
_CC_MAJOR, _CC_MINOR = 75, 76


@lru_cache(maxsize=1)
def driver_gpu_capabilities() -> tuple[tuple[tuple[str, tuple[int, int] | None], ...], str]:
    """The GPUs the CUDA driver sees, with their compute capabilities. Never raises.

    Asks the driver API itself (``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGetName``,
    ``cuDeviceGetAttribute``), which loads no kernel library: /proc files are absent in some
    containers and VMs that do have a GPU.

    Returns
    -------
    gpus : tuple of (str, (int, int) or None)
        (name, (major, minor)) per GPU; None where the driver does not tell the capability.
    reason : str
        Why there are none, when ``gpus`` is empty.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return (), "no NVIDIA driver on this host (libcuda.so.1 cannot be loaded)"
    try:
        code = cuda.cuInit(0)
        if code != 0:
            return (), f"the CUDA driver sees no usable GPU (cuInit returned error {code})"
        count = ctypes.c_int(0)
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return (), "the CUDA driver sees no GPU"
        gpus = []
        for ordinal in range(count.value):
            device = ctypes.c_int(0)
            name = ctypes.create_string_buffer(256)
            if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                gpus.append((f"GPU {ordinal}", None))
                continue
            label = (name.value.decode(errors="replace")
                     if cuda.cuDeviceGetName(name, len(name), device) == 0 else f"GPU {ordinal}")
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            known = (cuda.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device) == 0
                     and cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device) == 0)
            gpus.append((label, (major.value, minor.value) if known else None))
        return tuple(gpus), ""
    except (AttributeError, OSError) as error:  # a driver without these entry points
        return (), f"the CUDA driver cannot be queried: {error}"


def gpu_model() -> str | None:
    """The model name of this host's first GPU ("NVIDIA H200"), or None. Never raises."""
    names, _ = driver_gpus()
    return names[0] if names else None


_KIB = 1 << 10
_MIB = 1 << 20

#: Data-sheet numbers. Shared memory per block is the 48 KiB static limit on all three.
SM90 = GpuHardware(arch="sm_90", sm_count=132, shared_memory_per_block_bytes=48 * _KIB,
                   shared_memory_per_sm_bytes=228 * _KIB, registers_per_block=65536,
                   max_threads_per_block=1024, warp_size=32, l2_bytes=50 * _MIB,
                   memory_bandwidth_gbps=4800.0)
SM80 = GpuHardware(arch="sm_80", sm_count=108, shared_memory_per_block_bytes=48 * _KIB,
                   shared_memory_per_sm_bytes=164 * _KIB, registers_per_block=65536,
                   max_threads_per_block=1024, warp_size=32, l2_bytes=40 * _MIB,
                   memory_bandwidth_gbps=2039.0)
SM89 = GpuHardware(arch="sm_89", sm_count=142, shared_memory_per_block_bytes=48 * _KIB,
                   shared_memory_per_sm_bytes=100 * _KIB, registers_per_block=65536,
                   max_threads_per_block=1024, warp_size=32, l2_bytes=96 * _MIB,
                   memory_bandwidth_gbps=864.0)

#: The H200: the H100's SM90 die with all 60 MiB of L2 enabled (PyTorch reports 60 MB there;
#: an H100 SXM enables 50) and 4.8 TB/s of HBM3e.
H200 = replace(SM90, l2_bytes=60 * _MIB)

CUDA = CudaPreset(name="cuda", description="NVIDIA H200 (sm_90, 141 GB HBM3e): the measured "
                  "reference GPU", gpu=H200)
CUDA_SM90 = CudaPreset(name="sm90", description="NVIDIA Hopper (H100 SXM; sm_90)",
                       gpu=replace(SM90, memory_bandwidth_gbps=3350.0))
CUDA_SM80 = CudaPreset(name="sm80", description="NVIDIA Ampere (A100 80 GB; sm_80)", gpu=SM80)
CUDA_SM89 = CudaPreset(name="sm89", description="NVIDIA Ada (L40S; sm_89)", gpu=SM89)
