"""The mixed family's spec: 2/4-bit groups in one matrix plus fp16 outliers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qcompile.errors import FormatError, SpecError
from qcompile.formats.mixed import MixedLayout
from qcompile.kernels.base import KernelSpec, check_buffer_sizes, check_positive_ints

ACTIVATION_DTYPES = ("float32",)
#: Columns of one int32 vector of the int8-activation kernel (AVX2).
INT8_LANES = 8


def _share_label(share: float) -> str:
    """A share as a percentage without dots (symbols): 0.25 -> "25", 0.002 -> "0p2"."""
    return f"{share * 100:.4g}".replace(".", "p")


@dataclass(frozen=True)
class MixedSpec(KernelSpec):
    """A mixed 2/4/16-bit GEMV/GEMM ``y[M, N] = x[M, K] @ W[K, N]`` (formats/mixed.py).

    Attributes
    ----------
    k, n : int
        In-features K (the reduction) and out-features N.
    m : int
        Activation rows per call (1 = GEMV).
    dtype : str
        Activation and output dtype (float32).
    g1 : int
        Rows per first-order group and per 2/4-bit decision (a multiple of 16).
    g2 : int
        Columns per second-order group of the 2-bit scales.
    g4 : int
        Rows of the 4-bit matrix per scale group (a multiple of g1).
    four_bit_share : float
        Share of the g1-groups stored in 4-bit (rounded to whole g4 groups).
    outlier_share : float
        Share of all weights kept as fp16 outliers (taken from the 2-bit groups).
    int8_activations : bool
        Round x per row and g1-group to int8 inside the kernel and take integer dot products
        with the 2- and 4-bit codes (AVX2 ``vpmaddubsw``, kernels/mixed/compute_int8.py; CUDA
        ``dp4a``, compute_cuda_int8.py). The outliers still multiply the float32 x. About
        1e-2 relative error instead of 1e-6; N must be a multiple of 8.

    Notes
    -----
    K is at most 65536 (outlier rows are 16-bit indices); x [M, K], y [M, N] and every operand
    of the format (formats/mixed.py; the outliers' ``cols`` and ``values`` hold nnz elements,
    which ``row_ptr`` counts in int32) hold at most 2**31 - 1 elements each
    (``MAX_BUFFER_ELEMENTS``: TVM indexes buffers with int32).
    """

    family: ClassVar[str] = "mixed"
    compute_version: ClassVar[int] = 1

    k: int
    n: int
    m: int = 1
    dtype: str = "float32"
    g1: int = 16
    g2: int = 16
    g4: int = 64
    four_bit_share: float = 0.25
    outlier_share: float = 0.002
    int8_activations: bool = False

    def __post_init__(self) -> None:
        check_positive_ints(self, ("k", "n", "m"))
        if self.dtype not in ACTIVATION_DTYPES:
            raise SpecError(f"dtype={self.dtype!r} is not supported by the mixed family; "
                            f"supported: {ACTIVATION_DTYPES}")
        for field in ("four_bit_share", "outlier_share"):
            if not isinstance(getattr(self, field), (int, float)):
                raise SpecError(f"{field} must be a number; got {getattr(self, field)!r}")
        try:
            self.layout  # noqa: B018 - validates shapes, group sizes and shares
        except FormatError as error:
            raise SpecError(str(error)) from None
        if not isinstance(self.int8_activations, bool):
            raise SpecError(
                f"int8_activations must be True or False; got {self.int8_activations!r}")
        if self.int8_activations and self.n % INT8_LANES:
            raise SpecError(f"int8 activations need N divisible by {INT8_LANES} (one 256-bit "
                            f"vector of int32 sums covers {INT8_LANES} columns); got N={self.n}")
        check_buffer_sizes(self.buffers())

    def buffers(self) -> dict[str, tuple[int, ...]]:
        """x, y and every operand of the format (``check_buffer_sizes``).

        Returns
        -------
        dict of str to tuple of int
            Each buffer, named with its dimensions, and its shape.
        """
        shapes = {f"{name} {list(shape)}": shape
                  for name, (shape, _) in self.layout.shapes().items()}
        return {"x [M, K]": (self.m, self.k), "y [M, N]": (self.m, self.n), **shapes}

    def to_dict(self) -> dict:
        """As the base class, but ``int8_activations`` only when True: specs from before the
        field existed keep their digest, so their tuned records stay valid."""
        data = super().to_dict()
        if not data["int8_activations"]:
            del data["int8_activations"]
        return data

    @property
    def layout(self) -> MixedLayout:
        return MixedLayout.from_shares(self.k, self.n, g1=self.g1, g2=self.g2, g4=self.g4,
                                       four_bit_share=float(self.four_bit_share),
                                       outlier_share=float(self.outlier_share))

    def name(self) -> str:
        return (f"mixed_g{self.g1}_{self.g2}_{self.g4}_q{_share_label(self.four_bit_share)}"
                f"_o{_share_label(self.outlier_share)}_k{self.k}_n{self.n}_m{self.m}_f32"
                + ("_xi8" if self.int8_activations else ""))
