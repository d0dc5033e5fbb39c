"""Round-to-nearest quantization of float weights into GPTQ tensors (the uniform family's
format), with GPTQ's own parameter rule: for tests, examples and benchmarks, and the uniform
family's ``quantize``."""

from __future__ import annotations

import numpy as np

from qcompile.formats import bitpack
from qcompile.formats.gptq import (
    GptqTensors,
    check_group_size,
    num_groups,
    pack_zeros,
    trivial_g_idx,
)


def quantize_rtn(weight: np.ndarray, bits: int, group_size: int, sym: bool = False,
                 zero_convention: str = "v1") -> GptqTensors:
    """Round-to-nearest quantization into GPTQ tensors, with GPTQ's own parameter rule.

    Parameters
    ----------
    weight : numpy.ndarray of float, shape [K, N]
        The weight in checkpoint orientation (``nn.Linear.weight.T``).
    bits, group_size : int
        2/3/4/8, and -1 or a divisor of K.
    sym : bool
        Symmetric: z = 2**(bits-1) for every group.

    Returns
    -------
    GptqTensors
        fp16 scales, packed qweight/qzeros, trivial g_idx.
    """
    bitpack.check_bits(bits)
    weight = np.asarray(weight, dtype=np.float32)
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
