"""Hardware models: the numbers the design spaces and QIGen's performance model read."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CpuHardware:
    """A CPU as QIGen's model sees it.

    Attributes
    ----------
    l1d_bytes, l2_bytes, l3_bytes : int
        Per-core L1 data cache, per-core L2, and shared L3, in bytes.
    vector_registers : int
        Architectural vector registers (QIGen's eta): 16 for AVX2, 32 for AVX-512.
    vector_bits : int
        Width of one vector register: 256 for AVX2, 512 for AVX-512.
    cores : int
        Cores the kernels may use (the TVM target's ``num-cores``).
    """

    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    vector_registers: int
    vector_bits: int
    cores: int

    @property
    def gamma_bits(self) -> int:
        """QIGen's gamma: the L1 data cache in bits."""
        return self.l1d_bytes * 8

    @property
    def fp32_lanes(self) -> int:
        """float32 values per vector register."""
        return self.vector_bits // 32

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuHardware:
    """A CUDA GPU as the GPU design spaces see it.

    Attributes
    ----------
    arch : str
        Compute capability as TVM and nvcc name it ("sm_90").
    sm_count : int
        Streaming multiprocessors.
    shared_memory_per_block_bytes : int
        Shared memory one thread block may use without the dynamic opt-in (48 KiB on every
        architecture here); what TVM's ``max_shared_memory_per_block`` checks against.
    shared_memory_per_sm_bytes : int
        Shared memory of one SM (what resident blocks share; the opt-in ceiling is a little less).
    registers_per_block : int
        32-bit registers one thread block may use.
    max_threads_per_block, warp_size : int
    l2_bytes : int
        L2 cache size.
    memory_bandwidth_gbps : float
        Peak DRAM (HBM) bandwidth from the data sheet, GB/s; benchmarks measure the real one.
    """

    arch: str
    sm_count: int
    shared_memory_per_block_bytes: int
    shared_memory_per_sm_bytes: int
    registers_per_block: int
    max_threads_per_block: int
    warp_size: int
    l2_bytes: int
    memory_bandwidth_gbps: float

    def to_dict(self) -> dict:
        return asdict(self)
