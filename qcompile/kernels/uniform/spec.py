"""The uniform family's spec: GPTQ-style b-bit weights with group-wise scales and zero-points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qcompile.errors import SpecError
from qcompile.formats import bitpack
from qcompile.kernels.base import (
    GroupsAlongK,
    KernelSpec,
    check_buffer_sizes,
    check_positive_ints,
)

ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
#: Bit widths the int8-activation kernel takes (see UniformSpec.int8_activations).
INT8_BITS = (2, 3, 4)
_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class UniformSpec(GroupsAlongK, KernelSpec):
    """A uniform quantized GEMV/GEMM ``y[M, N] = x[M, K] @ W[K, N]``.

    Attributes
    ----------
    k, n : int
        In-features K (the reduction) and out-features N; K a multiple of the rows of K one
        packed block holds (16 at 2 bits, 32 at 3, 8 at 4, 4 at 8), N a multiple of the
        columns one block of ``qzeros`` holds (the same numbers), and K * N below 2**31 (see
        Notes).
    bits : int
        Weight bit width: 2, 3, 4 or 8.
    group_size : int
        Rows of K sharing one scale and zero-point per column; -1 for the whole column.
    m : int
        Activation rows per call (1 = GEMV).
    dtype : str
        Activation and output dtype: float32, float16 or bfloat16 (the kernel computes in
        float32 and converts at its edges).
    act_order : bool
        The kernel gathers x by a permutation operand ``perm`` (int32 [K]) inside its first
        blocks: the fused form of act_order's ``x[:, P]`` (weights reordered by ``P =
        argsort(g_idx)`` at prepare time). False for sequential weights, and for act_order
        weights whose gather runs as a separate step (what ``prepare`` does by default).
    int8_activations : bool
        Quantize x per row and group to int8 inside the kernel and take integer dot products
        with the codes: AVX2 ``vpmaddubsw`` on CPUs (compute_int8.py), ``dp4a`` on CUDA GPUs
        (compute_cuda_int8.py; at least 8 groups along K). Fewer instructions per code, so the
        kernels run at the memory bandwidth, at the price of rounding x to 8 bits (about 1e-2
        relative error instead of 1e-6). 2-, 3- and 4-bit weights, float32 activations, no
        fused act_order gather.

    Notes
    -----
    x [M, K], y [M, N] and the dequantized weight W [K, N] (written by the prefill path's
    kernel, dense.py) hold at most 2**31 - 1 elements each (``MAX_BUFFER_ELEMENTS``: TVM
    indexes buffers with int32); W bounds every other operand (qweight, scales, zeros, perm,
    byte planes). The largest LLM layers stay below it (16384 x 128256, an lm_head, is
    2.10e9).
    """

    family: ClassVar[str] = "uniform"
    compute_version: ClassVar[int] = 1

    k: int
    n: int
    bits: int = 4
    group_size: int = 128
    m: int = 1
    dtype: str = "float32"
    act_order: bool = False
    int8_activations: bool = False

    def __post_init__(self) -> None:
        check_positive_ints(self, ("k", "n", "m"))
        if type(self.bits) is not int or self.bits not in bitpack.SUPPORTED_BITS:
            raise SpecError(
                f"bits={self.bits} is not supported; supported bit widths: {bitpack.SUPPORTED_BITS}"
            )
        values, _ = bitpack.block_shape(self.bits)
        if self.k % values:
            raise SpecError(
                f"K={self.k} must be divisible by {values}: {self.bits}-bit weights pack "
                f"{values} rows of K per block"
            )
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise SpecError(f"group_size must be an integer; got {self.group_size!r}")
        if self.group_size != -1 and (self.group_size <= 0 or self.k % self.group_size):
            raise SpecError(
                f"K={self.k} must be divisible by group_size={self.group_size} "
                "(or use group_size=-1 for one group per column)"
            )
        if self.group_size != -1 and self.group_size % values:
            raise SpecError(
                f"group_size={self.group_size} must be a multiple of {values} for {self.bits}-bit "
                "weights: a packed block may not span two groups"
            )
        if not isinstance(self.act_order, bool):
            raise SpecError(f"act_order must be True or False; got {self.act_order!r}")
        if self.dtype not in ACTIVATION_DTYPES:
            raise SpecError(
                f"dtype={self.dtype!r} is not supported; supported: {ACTIVATION_DTYPES}")
        if not isinstance(self.int8_activations, bool):
            raise SpecError(
                f"int8_activations must be True or False; got {self.int8_activations!r}")
        if self.int8_activations:
            self._check_int8()
        if self.n % values:
            raise SpecError(
                f"N={self.n} must be divisible by {values}: qzeros packs the {self.bits}-bit "
                f"zero-points of {values} columns of N per block"
            )
        check_buffer_sizes(self.buffers())

    def buffers(self) -> dict[str, tuple[int, ...]]:
        """The largest buffers of this spec's kernels (``check_buffer_sizes``): x, y, and the
        dequantized weight, which the prefill path's kernel writes (dense.py) and which bounds
        qweight, scales, zeros, perm and the int8 byte planes.

        Returns
        -------
        dict of str to tuple of int
            Each buffer, named with its dimensions, and its shape.
        """
        return {"x [M, K]": (self.m, self.k), "y [M, N]": (self.m, self.n),
                "the dequantized weight W [K, N]": (self.k, self.n)}

    def _check_int8(self) -> None:
        if self.bits not in INT8_BITS:
            raise SpecError(
                f"int8 activations need {'-, '.join(map(str, INT8_BITS[:-1]))}- or "
                f"{INT8_BITS[-1]}-bit weights; got bits={self.bits}: a pair of 8-bit codes "
                "times int8 activations (2 * 255 * 127) overflows vpmaddubsw's int16 sums")
        if self.dtype != "float32":
            raise SpecError(f"int8 activations take float32 x; got dtype={self.dtype!r}")
        if self.n % 8:
            raise SpecError(f"int8 activations need N divisible by 8 (one 256-bit vector of "
                            f"int32 sums covers 8 columns); got N={self.n}")
        if self.act_order:
            raise SpecError("int8 activations do not fuse act_order's gather: use "
                            "act_order=False (prepare then gathers x before the kernel)")

    def to_dict(self) -> dict:
        """As the base class, but ``act_order`` and ``int8_activations`` only when True: specs
        from before the fields existed keep their digest, so their tuned records stay valid
        (their TensorIR is unchanged)."""
        data = super().to_dict()
        for optional in ("act_order", "int8_activations"):
            if not data[optional]:
                del data[optional]
        return data

    @property
    def packed_rows(self) -> int:
        """Rows of the packed qweight: K * bits / 32."""
        return bitpack.packed_length(self.k, self.bits)

    def name(self) -> str:
        group = "col" if self.group_size == -1 else str(self.group_size)
        gather = "_ao" if self.act_order else ""
        int8 = "_xi8" if self.int8_activations else ""
        return (f"uniform_b{self.bits}_g{group}_k{self.k}_n{self.n}_m{self.m}"
                f"_{_DTYPE_SHORT[self.dtype]}{gather}{int8}")
