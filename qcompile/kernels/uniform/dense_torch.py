"""The dense weight of a uniform layer, dequantized with torch on the weights' own device.

The GPU's prefill path: a long prompt's rows multiply one dense weight (cuBLAS) instead of
running the GEMV-shaped kernels chunk by chunk. The weight is rebuilt on every call into one
scratch buffer per shape, so a model keeps only its packed codes resident. The CPU path has a
compiled dequantization of its own (dense.py); this one runs wherever torch does.

GPTQ packs each block of 32 rows of b-bit codes into b int32 words as one little-endian bit
stream (qcompile.formats.bitpack); code j of a block sits at bit ``b j``, and for 3 bits codes
10 and 21 straddle two words.
"""

from __future__ import annotations

from qcompile.kernels.base import PreparedWeights
from qcompile.kernels.uniform.spec import UniformSpec

#: Blocks of 32 rows decoded at once: bounds the int32 temporaries to about 8 MiB per
#: thousand columns.
_CHUNK_BLOCKS = 64


def dequantize_on_device(spec: UniformSpec, prepared: PreparedWeights, dtype, out=None):
    """W [K, N] in ``dtype`` (rows in the prepared order) on the prepared weights' device:
    ``scales[g] * (q - zeros[g])`` with ``g = k // group_size``, computed in float32 and
    rounded once to ``dtype``.

    Parameters
    ----------
    spec : UniformSpec
        The layer's spec (K, N, bits, group size).
    prepared : PreparedWeights
        ``prepare``'s operands in GPTQ's layout: qweight int32 [K*bits/32, N], scales float16
        [G, N], zeros uint8 [G, N].
    dtype : torch.dtype
        float32, float16 or bfloat16.
    out : torch.Tensor, optional
        A contiguous [K, N] tensor of ``dtype`` on the weights' device, written instead of a new
        one.

    Returns
    -------
    torch.Tensor
        ``out`` (or a new tensor), [K, N] ``dtype``.
    """
    import torch

    layout = prepared.extras.get("layout")
    if layout is not None:
        raise ValueError(f"dequantize_on_device reads GPTQ's layout; these weights are packed "
                         f"as {layout}: prepare them without a layout")
    qweight, scales, zeros = prepared.tensors[:3]
    k, n, bits = spec.k, spec.n, spec.bits
    if out is None:
        out = torch.empty((k, n), dtype=dtype, device=qweight.device)
    elif (tuple(out.shape) != (k, n) or out.dtype != dtype or out.device != qweight.device
          or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {dtype} [{k}, {n}] tensor on "
                         f"{qweight.device}; got {out.dtype} {list(out.shape)} on {out.device}")
    group = spec.effective_group_size
    words = qweight.view(k // 32, bits, n)
    rows_of = out.view(k // 32, 32, n)
    mask = (1 << bits) - 1
    for first in range(0, k // 32, _CHUNK_BLOCKS):
        block = words[first:first + _CHUNK_BLOCKS]
        codes = torch.empty((block.shape[0], 32, n), dtype=torch.int32, device=block.device)
        for j in range(32):
            word, shift = divmod(bits * j, 32)
            low = torch.bitwise_right_shift(block[:, word], shift)
            if shift + bits > 32:  # straddles: the low bits' sign fill must not reach the high
                low = torch.bitwise_and(low, (1 << (32 - shift)) - 1)
                low = torch.bitwise_or(low, torch.bitwise_left_shift(block[:, word + 1],
                                                                     32 - shift))
            codes[:, j] = torch.bitwise_and(low, mask)
        rows = torch.arange(first * 32, first * 32 + block.shape[0] * 32, device=block.device)
        g = rows // group
        codes = codes.view(-1, n).to(torch.float32)
        weight = (codes - zeros.index_select(0, g).to(torch.float32)) * scales.index_select(
            0, g).to(torch.float32)
        rows_of[first:first + block.shape[0]] = weight.view(-1, 32, n).to(dtype)
    return out
