"""CUDA target presets: a TVM ``cuda`` target (with an x86 host) and the GPU's hardware model.

Building needs no GPU: TVM generates CUDA C on any machine and the exported ``.so`` carries it;
the machine that loads the ``.so`` compiles it for its GPU (primer section 8). So a preset names
a GPU model, not the GPU in this host; :meth:`CudaPreset.host_support` says whether this host
could run its kernels.
"""

from __future__ import annotations

import ctypes
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

        Needs the NVIDIA driver (``libcuda.so.1``) and a GPU it can see; the exact model is not
        checked, since CUDA C built for an older architecture also runs on newer GPUs.
        """
        names, reason = driver_gpus()
        if not names:
            return False, reason
        return True, f"the CUDA driver sees {len(names)} GPU(s): {', '.join(names)}"


@lru_cache(maxsize=1)
def driver_gpus() -> tuple[tuple[str, ...], str]:
    """(names of the GPUs the CUDA driver sees, why none when empty). Never raises.

    Asks the driver API itself (``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGetName``): /proc
    files are absent in some containers and VMs that do have a GPU.
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
        names = []
        for ordinal in range(count.value):
            device = ctypes.c_int(0)
            name = ctypes.create_string_buffer(256)
            if (cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                    and cuda.cuDeviceGetName(name, len(name), device) == 0):
                names.append(name.value.decode(errors="replace"))
            else:
                names.append(f"GPU {ordinal}")
        return tuple(names), ""
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
