"""The mixed 2/4/16-bit quantizer (mixed-2-4-16-async-dequant.md, sections 2.2, 3.3 and 4.3).

1. Sensitivity of every g1-group of input channels, eq. (9):
   ``S_i = sum_{k in group i} sum_n W[k, n]^2 / [H^-1]_kk^2``, H⁻¹ from a damped Cholesky.
2. The most sensitive groups (``layout.groups4`` of them) go 4-bit, the rest 2-bit.
3. 2-bit groups: first-order min/max quantization per group of g1 rows and column (eq. 2-4,
   the range widened to hold 0), the first-order scales quantized to 4 bits per g2 adjacent
   columns (eq. 6), the codes computed with the dequantized scales the kernel will use.
4. Outliers: the ``layout.nnz`` 2-bit weights with the largest saliency
   ``err^2 / [H^-1]_kk^2`` are kept in fp16 (err: the weight's 2-bit error against its group's
   range without it, :func:`leave_one_out_error`); their groups
   are quantized again without them, so they no longer stretch the range (section 4.3).
5. 4-bit groups: first-order min/max quantization per ``g4`` rows of the 4-bit matrix.

Round-to-nearest throughout (the paper fine-tunes afterwards; we do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.mixed import AverageBits, MixedLayout, MixedTensors, storage_rows
from qcompile.quantize.hessian import DAMP, damped_inverse, hessian

_SCALE_LEVELS = 15  # 4-bit first-order scales and second-order zeros


@dataclass(frozen=True)
class MixedQuantization:
    """What :func:`quantize` returns.

    Attributes
    ----------
    tensors : MixedTensors
        The quantized matrix.
    sensitivity : numpy.ndarray, float64 [K/g1]
        S_i of eq. (9) per group, in input order.
    bits : AverageBits
        Average bits per weight, by component (``bits.total`` counts everything stored).
    weight_error : float
        ||W - Ŵ||_F / ||W||_F.
    output_error : float or None
        ||X(W - Ŵ)||² / ||XW||² on the calibration data (from H when only H was given; None
        when H is too large to form the product cheaply).
    """

    tensors: MixedTensors
    sensitivity: np.ndarray
    bits: AverageBits
    weight_error: float
    output_error: float | None

    def report(self) -> dict:
        lay = self.tensors.layout
        return {
            "shape": [lay.k, lay.n], "g1": lay.g1, "g2": lay.g2, "g4": lay.g4,
            "four_bit_groups": lay.groups4, "groups": lay.groups, "outliers": lay.nnz,
            "average_bits": self.bits.total, "eq10_bits": self.bits.eq10,
            "bits": self.bits.to_dict(), "weight_error": self.weight_error,
            "output_error": self.output_error,
        }


def sensitivity(weight: np.ndarray, hinv_diag: np.ndarray, g1: int) -> np.ndarray:
    """S_i of eq. (9): float64 [K/g1] from W [K, N] and diag(H⁻¹) [K]."""
    k = weight.shape[0]
    per_row = np.sum(np.square(weight, dtype=np.float64), axis=1) / np.square(hinv_diag)
    return per_row.reshape(k // g1, g1).sum(axis=1)


def _ranges(w: np.ndarray, excluded: np.ndarray | None):
    """(lo, hi) [G, N] over axis 1 of w [G, rows, N], widened to hold 0, ``excluded`` ignored."""
    if excluded is None:
        lo, hi = w.min(axis=1), w.max(axis=1)
    else:
        lo = np.where(excluded, np.inf, w).min(axis=1)
        hi = np.where(excluded, -np.inf, w).max(axis=1)
    return np.minimum(lo, 0.0), np.maximum(hi, 0.0)


def _codes(w: np.ndarray, scale: np.ndarray, lo: np.ndarray, levels: int):
    """(codes [G, rows, N], zeros [G, N]) of eq. (3)-(4) for per-group scales [G, N]."""
    safe = np.where(scale > 0, scale, 1.0)
    zero = np.clip(np.round(-lo / safe), 0, levels)
    codes = np.clip(np.round(w / safe[:, None]) + zero[:, None], 0, levels)
    return codes.astype(np.int64), zero.astype(np.int64)


def quantize_scales(scales: np.ndarray, g2: int):
    """Second-order quantization of first-order scales s [G, N] (all >= 0), g2 columns a group.

    Returns (s1q uint8 [G, N], scale2 float16 [G, N/g2], zero2 uint8 [G, N/g2], dequantized
    float32 [G, N]) with dequantized = (s1q + zero2) * scale2. The step is the larger of
    (max - min)/15 and max/30, so the zero (the offset min/step) fits 4 bits; a code is at least
    1 above a zero offset of 0, so no group's scale dequantizes to 0 unless all are 0.
    """
    g, n = scales.shape
    blocks = scales.reshape(g, n // g2, g2).astype(np.float64)
    smin, smax = blocks.min(axis=2), blocks.max(axis=2)
    step = np.maximum((smax - smin) / _SCALE_LEVELS, smax / (2 * _SCALE_LEVELS))
    scale2 = step.astype(np.float16)
    step = scale2.astype(np.float64)
    safe = np.where(step > 0, step, 1.0)
    zero2 = np.clip(np.round(smin / safe), 0, _SCALE_LEVELS)
    s1q = np.clip(np.round(blocks / safe[..., None]) - zero2[..., None], 0, _SCALE_LEVELS)
    s1q = np.where((s1q + zero2[..., None] == 0) & (step[..., None] > 0), 1, s1q)
    dequantized = (s1q + zero2[..., None]) * step[..., None]
    return (s1q.reshape(g, n).astype(np.uint8), scale2, zero2.astype(np.uint8),
            dequantized.reshape(g, n).astype(np.float32))


def leave_one_out_error(w: np.ndarray, rows: int, levels: int) -> np.ndarray:
    """Error [R, N] of each weight of w [R, N] quantized with its group's range *without it*.

    A weight that stretches its group's range is represented exactly by min/max quantization
    and spreads its damage over its neighbours; measured against the range of the others, its
    own error is what keeping it in fp16 would save (SpQR's outlier criterion).
    """
    r, n = w.shape
    blocks = w.reshape(r // rows, rows, n)
    ordered = np.sort(blocks, axis=1)
    lo = np.where(blocks == ordered[:, :1], ordered[:, 1:2], ordered[:, :1])
    hi = np.where(blocks == ordered[:, -1:], ordered[:, -2:-1], ordered[:, -1:])
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = (hi - lo) / levels
    safe = np.where(scale > 0, scale, 1.0)
    zero = np.round(-lo / safe)
    codes = np.clip(np.round(blocks / safe) + zero, 0, levels)
    return (blocks - (codes - zero) * scale).reshape(r, n)


def _quantize_2bit(w2: np.ndarray, g1: int, g2: int, excluded: np.ndarray | None):
    """2-bit part [K2, N] -> (codes [K2, N], meta2, scale2, zero2, dequantized [K2, N])."""
    k2, n = w2.shape
    blocks = w2.reshape(k2 // g1, g1, n)
    mask = None if excluded is None else excluded.reshape(blocks.shape)
    lo, hi = _ranges(blocks, mask)
    s1q, scale2, zero2, s_hat = quantize_scales((hi - lo) / 3.0, g2)
    codes, z1 = _codes(blocks, s_hat, lo, 3)
    if mask is not None:  # an outlier's code dequantizes to exactly 0
        codes = np.where(mask, z1[:, None], codes)
    dequantized = (codes - z1[:, None]) * s_hat[:, None]
    meta2 = (z1 | (s1q.astype(np.int64) << 2)).astype(np.uint8)
    return codes.reshape(k2, n), meta2, scale2, zero2, dequantized.reshape(k2, n)


def quantize_first_order(w: np.ndarray, rows: int, bits: int):
    """Min/max quantization of w [R, N] in groups of ``rows`` rows (eq. 2-4), fp16 scales.

    Returns (codes int64 [R, N], scales float16 [R/rows, N], zeros uint8 [R/rows, N],
    dequantized float32 [R, N]).
    """
    r, n = w.shape
    levels = (1 << bits) - 1
    blocks = w.reshape(r // rows, rows, n)
    lo, hi = _ranges(blocks, None)
    scale = ((hi - lo) / levels).astype(np.float16)
    s = scale.astype(np.float32)
    codes, zero = _codes(blocks, s, lo, levels)
    dequantized = (codes - zero[:, None]) * s[:, None]
    return codes.reshape(r, n), scale, zero.astype(np.uint8), dequantized.reshape(r, n)


def quantize_2bit(w2: np.ndarray, g1: int, g2: int, nnz: int, hinv_diag: np.ndarray):
    """The 2-bit part with second-order scales and ``nnz`` fp16 outliers.

    Parameters
    ----------
    w2 : float32 [R, N]
        The rows to quantize (R divisible by g1).
    hinv_diag : float64 [R]
        [H⁻¹]_kk of each row, for the outliers' saliency.

    Returns
    -------
    (codes int64 [R, N], meta2 uint8, scale2 float16, zero2 uint8, dequantized float32 [R, N]
    with the outliers' fp16 values in place, outlier mask bool [R, N] or None)
    """
    excluded = None
    if nnz:
        saliency = np.square(leave_one_out_error(w2, g1, 3), dtype=np.float64) / np.square(
            hinv_diag)[:, None]
        flat = np.argpartition(saliency.reshape(-1), -nnz)[-nnz:]
        excluded = np.zeros(w2.size, dtype=bool)
        excluded[flat] = True
        excluded = excluded.reshape(w2.shape)
    codes, meta2, scale2, zero2, dequantized = _quantize_2bit(w2, g1, g2, excluded)
    if excluded is not None:
        dequantized = np.where(excluded, w2.astype(np.float16).astype(np.float32), dequantized)
    return codes, meta2, scale2, zero2, dequantized, excluded


def _csr(rows: np.ndarray, columns: np.ndarray, values: np.ndarray, n: int, capacity: int):
    """CSR over output columns: (row_ptr int32 [N+1], cols uint16 [cap], values fp16 [cap])."""
    order = np.lexsort((rows, columns))
    row_ptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(columns, minlength=n), out=row_ptr[1:])
    cols = np.zeros(capacity, dtype=np.uint16)
    vals = np.zeros(capacity, dtype=np.float16)
    cols[: len(rows)] = rows[order]
    vals[: len(rows)] = values[order]
    return row_ptr, cols, vals


def quantize(weight, layout: MixedLayout, *, x=None, h=None, damp: float = DAMP
             ) -> MixedQuantization:
    """Quantize W [K, N] into the mixed format of ``layout``.

    Parameters
    ----------
    weight : array-like, float, shape [K, N]
        The layer's weight, input channels along K (``y = x @ W``).
    layout : MixedLayout
        K, N, g1, g2, g4, the number of 4-bit groups and of outliers.
    x : array-like, float, shape [S, K], optional
        Calibration activations (H = 2 XᵀX / S).
    h : array-like, float64 [K, K], optional
        The Hessian itself, instead of ``x``.
    damp : float
        Cholesky damping, a fraction of mean(diag H).

    Returns
    -------
    MixedQuantization
    """
    weight = np.asarray(weight, dtype=np.float32)
    if weight.shape != (layout.k, layout.n):
        raise FormatError(f"weight must be [K, N]=[{layout.k}, {layout.n}]; got "
                          f"{list(weight.shape)}")
    if not np.all(np.isfinite(weight)):
        raise FormatError("weight holds NaN or infinite values")
    if (x is None) == (h is None):
        raise FormatError("give exactly one of x (calibration activations [S, K]) or h "
                          "(the Hessian [K, K])")
    if x is not None:
        x = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
        if x.shape[1] != layout.k:
            raise FormatError(f"calibration activations must have K={layout.k} columns; got "
                              f"{x.shape[1]}")
        h = hessian(x)
    h = np.asarray(h, dtype=np.float64)
    if h.shape != (layout.k, layout.k):
        raise FormatError(f"the Hessian must be [K, K]=[{layout.k}, {layout.k}]; got "
                          f"{list(h.shape)}")
    hinv_diag = np.diag(damped_inverse(h, damp))
    g1 = layout.g1
    score = sensitivity(weight, hinv_diag, g1)
    ranked = np.argsort(-score, kind="stable")
    four = np.sort(ranked[: layout.groups4])
    two = np.sort(ranked[layout.groups4:])
    order = np.concatenate([two, four]).astype(np.int32)
    rows = storage_rows(order, g1)
    rows2, rows4 = rows[: layout.rows2], rows[layout.rows2:]
    w2, w4 = weight[rows2], weight[rows4]

    codes2, meta2, scale2, zero2, _, excluded = quantize_2bit(w2, g1, layout.g2, layout.nnz,
                                                              hinv_diag[rows2])
    codes4, scales4, zeros4, _ = quantize_first_order(w4, layout.g4, 4)

    if layout.nnz:
        storage_row, column = np.nonzero(excluded)
        row_ptr, cols, values = _csr(rows2[storage_row], column,
                                     w2[storage_row, column].astype(np.float16), layout.n,
                                     layout.capacity)
    else:
        row_ptr = np.zeros(layout.n + 1, dtype=np.int32)
        cols = np.zeros(1, dtype=np.uint16)
        values = np.zeros(1, dtype=np.float16)
    tensors = MixedTensors(
        layout=layout, order=order, codes2=bitpack.pack(codes2, 2), meta2=meta2,
        scale2=scale2, zero2=zero2, codes4=bitpack.pack(codes4, 4), scales4=scales4,
        zeros4=zeros4, row_ptr=row_ptr, cols=cols, values=values)
    approx = tensors.dequantize()
    error = (weight - approx).astype(np.float64)
    weight_error = float(np.linalg.norm(error) / max(np.linalg.norm(weight), 1e-30))
    output_error = None
    if x is not None:
        output_error = float(np.sum(np.square(x @ error)) /
                             max(np.sum(np.square(x @ weight.astype(np.float64))), 1e-30))
    elif layout.k * layout.k * layout.n <= 1 << 34:
        output_error = float(np.sum((h @ error) * error) /
                             max(np.sum((h @ weight.astype(np.float64)) * weight), 1e-30))
    return MixedQuantization(tensors=tensors, sensitivity=score, bits=tensors.average_bits(),
                             weight_error=weight_error, output_error=output_error)
