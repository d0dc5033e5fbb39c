"""The mixed 2/4/16-bit weight format (mixed-2-4-16-async-dequant.md, sections 2.2, 3.3, 4).

A weight W [K, N] (K input channels, the reduction; N outputs) is cut along K into groups of
``g1`` rows. Each group is either 2-bit or 4-bit; the two kinds are stored apart, each as its
own compact matrix packed along K (16 codes per int32 word for 2-bit, 8 for 4-bit), so every
word holds codes of one group and one kind (the paper's aligned storage, section 3.3):

* ``order`` int32 [K/g1]: the groups in storage order, the 2-bit groups first (ascending),
  then the 4-bit groups (ascending). Row r of the 2-bit matrix is input row
  ``order[r // g1] * g1 + r % g1``; row r of the 4-bit matrix is input row
  ``order[G2 + r // g1] * g1 + r % g1`` (G2 = number of 2-bit groups).
* 2-bit part, first-order groups of g1 rows, second-order scales (eq. 6, N_s = 4):
  ``codes2`` int32 [G2*g1/16, N]; ``meta2`` uint8 [G2, N] holding the 2-bit first-order zero
  ``z1`` in bits 0-1 and the 4-bit quantized first-order scale ``s1q`` in bits 2-5;
  ``scale2`` float16 [G2, N/g2] and ``zero2`` uint8 [G2, N/g2], the second-order scale and
  zero of ``g2`` adjacent columns. The first-order scale is
  ``s1 = (s1q + zero2) * scale2``: scales are positive, so the zero-point of eq. (3) for them is
  never positive and is stored as its magnitude. A weight is ``(q - z1) * s1``.
* 4-bit part, groups of ``g4`` rows of the 4-bit matrix (``g4`` a multiple of g1), first-order:
  ``codes4`` int32 [G4g*g1/8, N]; ``scales4`` float16 [K4/g4, N]; ``zeros4`` uint8 [K4/g4, N].
* Outliers, fp16, CSR over output columns (section 2.3): ``row_ptr`` int32 [N+1], ``cols``
  uint16 [max(nnz, 1)] (input row, K <= 65536), ``values`` float16 [max(nnz, 1)]. Outliers lie
  only in 2-bit groups (section 4.3); the 2-bit code under an outlier equals its group's z1, so
  the dense part contributes exactly 0 there and the weight is the fp16 value itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack

#: Bits of the quantized first-order scales and of the second-order zero-points (N_s).
SCALE_BITS = 4
#: Bits of one stored outlier: fp16 value + 16-bit column index (section 2.3).
OUTLIER_BITS = 32
#: Bits of one CSR row pointer.
ROW_PTR_BITS = 32


@dataclass(frozen=True)
class MixedLayout:
    """The shape parameters of one mixed matrix.

    Attributes
    ----------
    k, n : int
        In-features K and out-features N of W [K, N].
    g1 : int
        Rows per first-order group (multiple of 16); also the unit of the 2/4-bit choice.
    g2 : int
        Columns per second-order group of the 2-bit part's scales.
    g4 : int
        Rows of the 4-bit matrix per scale group (multiple of g1).
    groups4 : int
        Number of 4-bit g1-groups (a multiple of g4/g1).
    nnz : int
        Number of fp16 outliers.
    """

    k: int
    n: int
    g1: int
    g2: int
    g4: int
    groups4: int
    nnz: int

    def __post_init__(self) -> None:
        check_layout(self)

    @classmethod
    def from_shares(cls, k: int, n: int, *, g1: int = 16, g2: int = 16, g4: int = 64,
                    four_bit_share: float = 0.25, outlier_share: float = 0.002) -> MixedLayout:
        """The layout with ``four_bit_share`` of the g1-groups in 4-bit (rounded to whole
        4-bit scale groups of g4 rows) and ``round(outlier_share * K * N)`` outliers."""
        for name, share in (("four_bit_share", four_bit_share), ("outlier_share", outlier_share)):
            if not 0 <= share <= 1:
                raise FormatError(f"{name} must lie in [0, 1]; got {share}")
        if g1 <= 0 or g4 <= 0 or g4 % g1:
            raise FormatError(f"g4={g4} must be a positive multiple of g1={g1}")
        step = g4 // g1
        groups4 = int(round(four_bit_share * (k // g1) / step)) * step
        return cls(k=k, n=n, g1=g1, g2=g2, g4=g4, groups4=groups4,
                   nnz=int(round(outlier_share * k * n)))

    @property
    def groups(self) -> int:
        """K / g1: all first-order groups."""
        return self.k // self.g1

    @property
    def groups2(self) -> int:
        return self.groups - self.groups4

    @property
    def rows2(self) -> int:
        """K2: rows of the 2-bit matrix."""
        return self.groups2 * self.g1

    @property
    def rows4(self) -> int:
        """K4: rows of the 4-bit matrix."""
        return self.groups4 * self.g1

    @property
    def scale_groups4(self) -> int:
        return self.rows4 // self.g4

    @property
    def capacity(self) -> int:
        """Length of the CSR arrays: nnz, or 1 (an unused slot) when there are none."""
        return max(self.nnz, 1)

    def shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{operand: (shape, dtype)}`` in the kernel's argument order."""
        k2, k4, n = self.rows2, self.rows4, self.n
        return {
            "order": ((self.groups,), "int32"),
            "codes2": ((k2 // 16, n), "int32"),
            "meta2": ((self.groups2, n), "uint8"),
            "scale2": ((self.groups2, n // self.g2), "float16"),
            "zero2": ((self.groups2, n // self.g2), "uint8"),
            "codes4": ((k4 // 8, n), "int32"),
            "scales4": ((self.scale_groups4, n), "float16"),
            "zeros4": ((self.scale_groups4, n), "uint8"),
            "row_ptr": ((n + 1,), "int32"),
            "cols": ((self.capacity,), "uint16"),
            "values": ((self.capacity,), "float16"),
        }


def check_layout(layout: MixedLayout) -> None:
    """Raise ``FormatError`` naming the rule and the numbers when ``layout`` breaks one."""
    k, n, g1, g2, g4 = layout.k, layout.n, layout.g1, layout.g2, layout.g4
    for name in ("k", "n", "g1", "g2", "g4"):
        value = getattr(layout, name)
        if not isinstance(value, int) or value <= 0:
            raise FormatError(f"{name} must be a positive integer; got {value!r}")
    if g1 % 16:
        raise FormatError(f"g1={g1} must be a multiple of 16: a 2-bit word packs 16 rows of K "
                          "and may not span two groups")
    if k % g1:
        raise FormatError(f"K={k} must be divisible by g1={g1}")
    if k > 65536:
        raise FormatError(f"K={k} exceeds 65536: outlier columns are stored as 16-bit indices")
    if n % g2:
        raise FormatError(f"N={n} must be divisible by g2={g2} (second-order groups along N)")
    if g4 % g1:
        raise FormatError(f"g4={g4} must be a multiple of g1={g1}: a 4-bit scale group holds "
                          "whole g1-groups")
    groups = k // g1
    if not 0 < layout.groups4 < groups:
        raise FormatError(f"the 4-bit groups ({layout.groups4}) must be at least 1 and fewer than "
                          f"all {groups} groups of g1={g1} rows: a matrix of one kind is the "
                          "uniform family's")
    if layout.groups4 * g1 % g4:
        raise FormatError(f"the 4-bit rows ({layout.groups4} groups x g1={g1}) must be divisible "
                          f"by g4={g4}")
    weights2 = (groups - layout.groups4) * g1 * n
    if not 0 <= layout.nnz <= weights2:
        raise FormatError(f"nnz={layout.nnz} outliers must lie in [0, {weights2}]: only the "
                          "2-bit weights may be outliers")


@dataclass(frozen=True)
class MixedTensors:
    """One mixed matrix in the format of this module's docstring (numpy arrays)."""

    layout: MixedLayout
    order: np.ndarray
    codes2: np.ndarray
    meta2: np.ndarray
    scale2: np.ndarray
    zero2: np.ndarray
    codes4: np.ndarray
    scales4: np.ndarray
    zeros4: np.ndarray
    row_ptr: np.ndarray
    cols: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        for name, (shape, dtype) in self.layout.shapes().items():
            array = getattr(self, name)
            if not isinstance(array, np.ndarray):
                raise FormatError(f"{name} must be a numpy array; got {type(array).__name__}")
            if array.shape != shape or array.dtype != np.dtype(dtype):
                raise FormatError(f"{name} must be {dtype} {list(shape)}; got {array.dtype} "
                                  f"{list(array.shape)}")
        groups = self.layout.groups
        if not np.array_equal(np.sort(self.order), np.arange(groups)):
            raise FormatError(f"order must be a permutation of the {groups} groups")
        ptr = self.row_ptr
        if ptr[0] != 0 or ptr[-1] != self.layout.nnz or np.any(np.diff(ptr) < 0):
            raise FormatError(f"row_ptr must rise from 0 to nnz={self.layout.nnz}; got "
                              f"[{ptr[0]}, ..., {ptr[-1]}]")
        if self.layout.nnz and int(self.cols[: self.layout.nnz].max()) >= self.layout.k:
            raise FormatError(f"outlier columns must lie in [0, {self.layout.k})")

    def operands(self) -> dict[str, np.ndarray]:
        """The arrays in the kernel's argument order."""
        return {name: getattr(self, name) for name in self.layout.shapes()}

    def tensor_bits(self) -> int:
        """Bits of the stored operands as the kernel reads them (the GB/s numerator, x8)."""
        return sum(getattr(self, f.name).nbytes * 8 for f in fields(self) if f.name != "layout")

    def dense_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """(W2 [K2, N], W4 [K4, N]) float32: the dequantized 2-bit and 4-bit matrices in
        storage order, outliers not applied."""
        lay = self.layout
        q2 = bitpack.unpack(self.codes2, 2).astype(np.float32)          # [K2, N]
        z1 = (self.meta2 & 3).astype(np.float32)
        s1 = first_order_scales(self.meta2, self.scale2, self.zero2, lay.g2)
        w2 = (q2 - np.repeat(z1, lay.g1, axis=0)) * np.repeat(s1, lay.g1, axis=0)
        q4 = bitpack.unpack(self.codes4, 4).astype(np.float32)
        s4 = np.repeat(self.scales4.astype(np.float32), lay.g4, axis=0)
        z4 = np.repeat(self.zeros4.astype(np.float32), lay.g4, axis=0)
        return w2, (q4 - z4) * s4

    def dequantize(self) -> np.ndarray:
        """W [K, N] float32 in input order, outliers included: the reference of the kernel."""
        weight = self.dense()
        self._add_outliers(weight)
        return weight

    def dense(self) -> np.ndarray:
        """W [K, N] float32 in input order without the outliers (both dense parts)."""
        lay = self.layout
        w2, w4 = self.dense_parts()
        rows = storage_rows(self.order, lay.g1)
        weight = np.empty((lay.k, lay.n), dtype=np.float32)
        weight[rows[: lay.rows2]] = w2
        weight[rows[lay.rows2:]] = w4
        return weight

    def outliers(self) -> np.ndarray:
        """[K, N] float32: the fp16 outliers where they lie, 0 elsewhere."""
        weight = np.zeros((self.layout.k, self.layout.n), dtype=np.float32)
        self._add_outliers(weight)
        return weight

    def _add_outliers(self, weight: np.ndarray) -> None:
        nnz = self.layout.nnz
        if nnz:
            columns = np.repeat(np.arange(self.layout.n), np.diff(self.row_ptr))
            weight[self.cols[:nnz].astype(np.int64), columns] += self.values[:nnz].astype(
                np.float32)

    def average_bits(self) -> AverageBits:
        return average_bits(self.layout)


def storage_rows(order: np.ndarray, g1: int) -> np.ndarray:
    """int64 [K]: the input row of each storage row (2-bit rows first, then 4-bit rows)."""
    return (np.asarray(order, dtype=np.int64)[:, None] * g1 + np.arange(g1)).reshape(-1)


def first_order_scales(meta2: np.ndarray, scale2: np.ndarray, zero2: np.ndarray,
                       g2: int) -> np.ndarray:
    """s1 [G2, N] float32 = (s1q + zero2) * scale2, the second-order dequantization."""
    s1q = (meta2 >> 2).astype(np.float32)
    return (s1q + np.repeat(zero2.astype(np.float32), g2, axis=1)) * np.repeat(
        scale2.astype(np.float32), g2, axis=1)


@dataclass(frozen=True)
class AverageBits:
    """Bits per weight of a mixed matrix, by component (eq. 10 plus what it leaves out).

    ``eq10`` is the paper's formula with alpha the 2-bit share, counting 4-bit weights as 4 bits;
    ``total`` adds every stored bit eq. (10) omits: the 4-bit groups' fp16 scales and 4-bit
    zeros, the outliers (16-bit value + 16-bit column), the CSR row pointers and the group
    order (one 32-bit index per g1-group).
    """

    codes2: float
    first_order2: float
    second_order2: float
    codes4: float
    params4: float
    outliers: float
    row_ptr: float
    order: float
    eq10: float

    @property
    def total(self) -> float:
        return (self.codes2 + self.first_order2 + self.second_order2 + self.codes4 + self.params4
                + self.outliers + self.row_ptr + self.order)

    def to_dict(self) -> dict[str, float]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


def average_bits(layout: MixedLayout) -> AverageBits:
    """Average bits per weight of ``layout`` (see :class:`AverageBits`)."""
    weights = layout.k * layout.n
    w2, w4 = layout.rows2 * layout.n, layout.rows4 * layout.n
    g1, g2, ns = layout.g1, layout.g2, SCALE_BITS
    alpha = w2 / weights
    eq10 = alpha * (2 + (2 + ns) / g1 + (ns + 16) / (g1 * g2)) + (1 - alpha) * 4
    return AverageBits(
        codes2=2 * w2 / weights,
        first_order2=(2 + ns) * (w2 / g1) / weights,
        second_order2=(ns + 16) * (w2 / (g1 * g2)) / weights,
        codes4=4 * w4 / weights,
        params4=(16 + 4) * (w4 / layout.g4) / weights,
        outliers=OUTLIER_BITS * layout.nnz / weights,
        row_ptr=ROW_PTR_BITS * (layout.n + 1) / weights,
        order=32 * layout.groups / weights,
        eq10=eq10,
    )
