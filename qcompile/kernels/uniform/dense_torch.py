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

import functools

from qcompile.kernels.base import PreparedWeights
from qcompile.kernels.uniform.spec import UniformSpec

#: Elements (rows x columns) decoded at once (rounded to whole groups): bounds the int32 and
#: float temporaries to about 128 MiB each, in a few chunks even for the widest layers (few
#: kernel launches: the prefill path is launch-bound when it decodes code by code).
_CHUNK_ELEMENTS = 1 << 25


@functools.cache
def _code_fields(bits: int) -> tuple[tuple[int, ...], ...]:
    """Where code j (0..31) of a 32-row block sits in the block's ``bits`` words, as five
    tuples over j: the word holding its low bits, their shift, their mask, and for the codes
    that straddle into the next word (3 bits: codes 10 and 21) that word's mask and the shift
    that puts its bits above the low ones (mask 0 and shift 0 for every other code)."""
    word, shift, low_mask, high_mask, high_shift = [], [], [], [], []
    for j in range(32):
        w, s = divmod(bits * j, 32)
        low_bits = min(bits, 32 - s)
        word.append(w)
        shift.append(s)
        low_mask.append((1 << low_bits) - 1)
        high_mask.append((1 << (bits - low_bits)) - 1)
        high_shift.append(low_bits if low_bits < bits else 0)
    return tuple(word), tuple(shift), tuple(low_mask), tuple(high_mask), tuple(high_shift)


def _field_tensors(bits: int, device) -> tuple:
    """:func:`_code_fields` as int32 tensors [1, 32, 1] on ``device`` (the low word's index as
    int64 [32]), made once per dequantization."""
    import torch

    word, *rest = (torch.tensor(t, dtype=torch.int32, device=device)
                   for t in _code_fields(bits))
    return (word.long(), *(t.view(1, 32, 1) for t in rest))


def _decode_codes(words, bits: int, fields):
    """int32 words [B, bits, N] (B blocks of 32 rows) -> int32 codes [B * 32, N]
    (``fields``: :func:`_field_tensors`, used for 3 bits only).

    Where ``bits`` divides 32 (2, 4, 8), code j of a block is field j % (32 / bits) of word
    j // (32 / bits): one broadcast shift of the words and one mask decode every code. 3-bit
    codes straddle words, so each code's word is gathered first."""
    import torch

    if 32 % bits == 0:
        per_word = 32 // bits
        shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
        codes = torch.bitwise_right_shift(words.unsqueeze(2), shifts.view(1, 1, per_word, 1))
        codes.bitwise_and_((1 << bits) - 1)   # [B, bits, 32 / bits, N]: code j = (word, field)
        return codes.view(-1, words.shape[-1])
    word, shift, low_mask, high_mask, high_shift = fields
    low = words.index_select(1, word)  # [B, 32, N]: each code's low word
    codes = torch.bitwise_and(torch.bitwise_right_shift(low, shift), low_mask)
    high = words.index_select(1, torch.clamp(word + 1, max=bits - 1))
    codes |= torch.bitwise_left_shift(torch.bitwise_and(high, high_mask), high_shift)
    return codes.view(-1, words.shape[-1])


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
    group = min(spec.effective_group_size, k)
    words = qweight.view(k // 32, bits, n)
    # whole groups per chunk, so the chunk's zeros and scales broadcast over [groups, group, N]
    group_blocks = max(1, group // 32)
    blocks_per_chunk = max(group_blocks, _CHUNK_ELEMENTS // (32 * n) // group_blocks
                           * group_blocks)
    fields = _field_tensors(bits, qweight.device) if 32 % bits else None
    # fp16 x fp16 products are exact in float32, so fp16 arithmetic rounds (c - z) * s once,
    # as float32 would; bf16 (8 mantissa bits) and float32 take float32
    compute = torch.float16 if dtype == torch.float16 else torch.float32
    for first in range(0, k // 32, blocks_per_chunk):
        block = words[first:first + blocks_per_chunk]
        rows = slice(first * 32, (first + block.shape[0]) * 32)
        groups = slice(rows.start // group, rows.stop // group)
        codes = _decode_codes(block, bits, fields).to(compute).view(-1, group, n)
        codes -= zeros[groups].to(compute).unsqueeze(1)
        target = out[rows].view(-1, group, n)
        if compute == dtype:
            torch.mul(codes, scales[groups].to(compute).unsqueeze(1), out=target)
        else:
            target.copy_(codes.mul_(scales[groups].to(compute).unsqueeze(1)))
    return out
