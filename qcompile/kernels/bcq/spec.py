"""The BCQ family's spec: q sign planes, group-wise alpha and bias, lookups over mu activations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qcompile.errors import SpecError
from qcompile.formats.bcq import SUPPORTED_PLANES, WORD_BITS
from qcompile.kernels.base import (
    GroupsAlongK,
    KernelSpec,
    check_buffer_sizes,
    check_positive_ints,
)

#: Activations per table (the table has 2**mu entries).
SUPPORTED_MU = (2, 3, 4, 5, 6, 7, 8)


@dataclass(frozen=True)
class BcqSpec(GroupsAlongK, KernelSpec):
    """A LUT-GEMM GEMV/GEMM ``y[M, N] = x[M, K] @ W[K, N]`` with W in BCQ form.

    Attributes
    ----------
    k, n : int
        In-features K (the reduction; a multiple of 32) and out-features N.
    q : int
        Sign planes (bits per weight), 1..8.
    group_size : int
        Rows of K sharing alpha and the bias z; -1 for the whole column. A multiple of mu.
    m : int
        Activation rows per call (1 = GEMV).
    mu : int
        Activations per lookup table (2..8): each table holds the 2**mu signed sums of mu
        consecutive activations and replaces mu additions per plane and output by one lookup.
        It sets the table's shape, so it is part of the workload; ``tools/bench.py kernels
        --preset bcq-cuda --tune-trials N`` (or ``tools/studies/bcq_cuda_sweep.py``) and
        ``tools/bench.py kernels --preset bcq-cpu`` sweep it.
    dtype : str
        Activation and output dtype (float32).

    Notes
    -----
    x [M, K], y [M, N], planes [q, K/32, N], alpha [G, q, N], z [G, N] and the lookup tables
    [M, K/mu, 2**mu] hold at most 2**31 - 1 elements each (``MAX_BUFFER_ELEMENTS``: TVM
    indexes buffers with int32). The CPU kernels build the tables whole, once per call (at
    mu = 8 that bounds M * K below 2**26); a CUDA block holds one group's tables of every row
    in shared memory, a tighter bound its design space checks. With fine groups alpha is the
    largest operand (group size 8, q = 8: K * N <= 2**31 - 1).
    """

    family: ClassVar[str] = "bcq"
    compute_version: ClassVar[int] = 2

    k: int
    n: int
    q: int = 3
    group_size: int = 128
    m: int = 1
    mu: int = 8
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_positive_ints(self, ("k", "n", "m"))
        if type(self.q) is not int or self.q not in SUPPORTED_PLANES:
            raise SpecError(f"q={self.q} sign planes is not supported; supported: "
                            f"{SUPPORTED_PLANES}")
        if type(self.mu) is not int or self.mu not in SUPPORTED_MU:
            raise SpecError(f"mu={self.mu} is not supported; supported: {SUPPORTED_MU}")
        if self.k % WORD_BITS:
            raise SpecError(f"K={self.k} must be a multiple of {WORD_BITS}: sign bits are "
                            f"packed {WORD_BITS} rows of K per word")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise SpecError(f"group_size must be an integer; got {self.group_size!r}")
        if self.group_size != -1 and (self.group_size <= 0 or self.k % self.group_size):
            raise SpecError(f"K={self.k} must be divisible by group_size={self.group_size} "
                            "(or use group_size=-1 for one group per column)")
        if self.effective_group_size % self.mu:
            raise SpecError(
                f"group size {self.effective_group_size} must be a multiple of mu={self.mu}: "
                "a table's mu rows of K may not span two groups")
        if self.dtype != "float32":
            raise SpecError(f"dtype={self.dtype!r} is not supported by the bcq family; "
                            "supported: ('float32',)")
        check_buffer_sizes(self.buffers())

    def buffers(self) -> dict[str, tuple[int, ...]]:
        """The operands of this spec's kernels and the lookup tables, which the CPU kernels
        build whole once per call (``check_buffer_sizes``).

        Returns
        -------
        dict of str to tuple of int
            Each buffer, named with its dimensions, and its shape.
        """
        return {"x [M, K]": (self.m, self.k), "y [M, N]": (self.m, self.n),
                "planes [q, K/32, N]": (self.q, self.words, self.n),
                "alpha [G, q, N]": (self.groups, self.q, self.n), "z [G, N]": (self.groups, self.n),
                "the lookup tables [M, K/mu, 2**mu]": (self.m, self.chunks, 1 << self.mu)}

    @property
    def chunks(self) -> int:
        """Tables per activation row: K / mu."""
        return self.k // self.mu

    @property
    def chunks_per_group(self) -> int:
        return self.effective_group_size // self.mu

    @property
    def words(self) -> int:
        """Packed words per plane and column: K / 32."""
        return self.k // WORD_BITS

    def name(self) -> str:
        group = "col" if self.group_size == -1 else str(self.group_size)
        return f"bcq_q{self.q}_g{group}_mu{self.mu}_k{self.k}_n{self.n}_m{self.m}_f32"
