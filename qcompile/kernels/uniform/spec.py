"""The uniform family's spec: GPTQ-style b-bit weights with group-wise scales and zero-points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qcompile.errors import SpecError
from qcompile.formats import bitpack
from qcompile.kernels.base import KernelSpec

ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class UniformSpec(KernelSpec):
    """A uniform quantized GEMV/GEMM ``y[M, N] = x[M, K] @ W[K, N]``.

    Attributes
    ----------
    k, n : int
        In-features K (the reduction) and out-features N.
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

    def __post_init__(self) -> None:
        for field in ("k", "n", "m"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise SpecError(f"{field.upper()} must be a positive integer; got {value!r}")
        if self.bits not in bitpack.SUPPORTED_BITS:
            raise SpecError(
                f"bits={self.bits} is not supported; supported bit widths: {bitpack.SUPPORTED_BITS}"
            )
        values, _ = bitpack.block_shape(self.bits)
        if self.k % values:
            raise SpecError(
                f"K={self.k} must be divisible by {values}: {self.bits}-bit weights pack "
                f"{values} rows of K per block"
            )
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

    def to_dict(self) -> dict:
        """As the base class, but ``act_order`` only when True: specs from before the field
        existed keep their digest, so their tuned records stay valid (their TensorIR is
        unchanged)."""
        data = super().to_dict()
        if not self.act_order:
            del data["act_order"]
        return data

    @property
    def groups(self) -> int:
        """G: scale/zero rows per column."""
        return 1 if self.group_size == -1 else self.k // self.group_size

    @property
    def effective_group_size(self) -> int:
        """Rows of K per group (K itself for group_size -1)."""
        return self.k if self.group_size == -1 else self.group_size

    @property
    def packed_rows(self) -> int:
        """Rows of the packed qweight: K * bits / 32."""
        return bitpack.packed_length(self.k, self.bits)

    def name(self) -> str:
        group = "col" if self.group_size == -1 else str(self.group_size)
        gather = "_ao" if self.act_order else ""
        return (f"uniform_b{self.bits}_g{group}_k{self.k}_n{self.n}_m{self.m}"
                f"_{_DTYPE_SHORT[self.dtype]}{gather}")
