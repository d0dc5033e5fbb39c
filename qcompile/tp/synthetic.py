"""Synthetic act_order GPTQ layers: random codes, scales and zero-points with a scrambled g_idx
laid out as GPTQ writes it with desc_act (each group still holds group_size rows)."""

from __future__ import annotations

import numpy as np

from qcompile.formats import bitpack
from qcompile.formats.gptq import GptqTensors, num_groups, pack_zeros


def scrambled_g_idx(in_features: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """g_idx of a desc_act layer: groups formed in a random row order, mapped back to rows."""
    order = rng.permutation(in_features)
    size = in_features if group_size == -1 else group_size
    g_idx = np.empty(in_features, dtype=np.int32)
    g_idx[order] = np.arange(in_features) // size
    return g_idx


def random_act_order_layer(in_features: int, out_features: int, bits: int, group_size: int,
                           rng: np.random.Generator, zero_convention: str = "v1") -> GptqTensors:
    """A layer W [K, N] in the GPTQ format with random codes and a scrambled g_idx.

    Scales are fp16 around 1/(sqrt(K) * 2**bits) so outputs stay O(1) for unit activations.
    """
    groups = num_groups(in_features, group_size)
    codes = rng.integers(0, 1 << bits, size=(in_features, out_features))
    zeros = rng.integers(0, 1 << bits, size=(groups, out_features))
    scale = 1.0 / (np.sqrt(in_features) * (1 << bits))
    scales = (scale * rng.uniform(0.5, 1.5, size=(groups, out_features))).astype(np.float16)
    return GptqTensors.from_tensors(
        qweight=bitpack.pack(codes, bits), scales=scales,
        qzeros=pack_zeros(zeros, bits, zero_convention), bits=bits, group_size=group_size,
        g_idx=scrambled_g_idx(in_features, group_size, rng), zero_convention=zero_convention,
    )
