"""Round-to-nearest quantization of float weights into GPTQ tensors (the uniform family's
format), with GPTQ's own parameter rule: for tests, examples and benchmarks, and the uniform
family's ``quantize``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.gptq import (
    GptqTensors,
    check_group_size,
    num_groups,
    pack_zeros,
    trivial_g_idx,
)


def quantize_rtn(weight: np.ndarray, bits: int, group_size: int, sym: bool = False,
                 zero_convention: str = "v1", order: np.ndarray | None = None) -> GptqTensors:
    """Round-to-nearest quantization into GPTQ tensors, with GPTQ's own parameter rule.

    Parameters
    ----------
    weight : numpy.ndarray of float, shape [K, N]
        The weight in checkpoint orientation (``nn.Linear.weight.T``).
    bits, group_size : int
        2/3/4/8, and -1 or a divisor of K.
    sym : bool
        Symmetric: z = 2**(bits-1) for every group.
    zero_convention : str
        How ``qzeros`` stores z: "v1" (z - 1) or "v2" (z).
    order : numpy.ndarray of int, shape [K], optional
        act_order (desc_act): the order GPTQ quantizes the rows in (a permutation of K, the
        Hessian's in GPTQ). Groups are taken along it, so group g holds rows
        ``order[g*group_size:(g+1)*group_size]`` and ``g_idx`` scatters them over K.

    Returns
    -------
    GptqTensors
        fp16 scales, packed qweight/qzeros, g_idx (``k // group_size`` without ``order``).
    """
    bitpack.check_bits(bits)
    weight = np.asarray(weight, dtype=np.float32)
    if order is not None:
        return _in_order(weight, bits, group_size, sym, zero_convention, np.asarray(order))
    in_features, out_features = weight.shape
    check_group_size(in_features, group_size)
    groups = num_groups(in_features, group_size)
    maxq = (1 << bits) - 1
    w = weight.reshape(groups, -1, out_features)
    xmin = np.minimum(w.min(axis=1), 0)
    xmax = np.maximum(w.max(axis=1), 0)
    if sym:
        xmax = np.maximum(np.abs(xmin), xmax)
        xmin = np.where(xmin < 0, -xmax, xmin)
    both_zero = (xmin == 0) & (xmax == 0)
    xmin = np.where(both_zero, -1, xmin)
    xmax = np.where(both_zero, 1, xmax)
    scale = ((xmax - xmin) / maxq).astype(np.float16)
    if sym:
        zero = np.full(scale.shape, (maxq + 1) // 2, dtype=np.int64)
    else:
        zero = np.clip(np.round(-xmin / scale.astype(np.float32)), 0, maxq).astype(np.int64)
    q = np.clip(np.round(w / scale.astype(np.float32)[:, None]) + zero[:, None], 0, maxq)
    codes = q.reshape(in_features, out_features).astype(np.int64)
    return GptqTensors(
        qweight=bitpack.pack(codes, bits),
        scales=scale,
        qzeros=pack_zeros(zero, bits, zero_convention),
        g_idx=trivial_g_idx(in_features, group_size),
        bits=bits,
        group_size=group_size,
        in_features=in_features,
        out_features=out_features,
        zero_convention=zero_convention,
    )


def _in_order(weight: np.ndarray, bits: int, group_size: int, sym: bool, zero_convention: str,
              order: np.ndarray) -> GptqTensors:
    """Quantize W[order] sequentially, then put each row's codes and group back at its row."""
    if not np.array_equal(np.sort(order), np.arange(weight.shape[0])):
        raise FormatError(f"order must be a permutation of the K={weight.shape[0]} rows")
    ordered = quantize_rtn(weight[order], bits, group_size, sym, zero_convention)
    codes = np.empty_like(ordered.codes())
    codes[order] = ordered.codes()
    g_idx = np.empty_like(ordered.g_idx)
    g_idx[order] = ordered.g_idx
    return replace(ordered, qweight=bitpack.pack(codes, bits), g_idx=g_idx)
