"""The uniform family's prepared weights dequantized in torch: the dense fp32 weight of the
prefill path (``x @ W`` by torch's GEMM once M is large), and a check for the kernels.

It reads the operands ``prepare`` made (rows already in act_order's P order), so it serves
exactly the weights the kernels see.
"""

from __future__ import annotations

import torch

from qcompile.kernels.base import PreparedWeights
from qcompile.kernels.uniform.spec import UniformSpec


def unpack_codes(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [K, N] int32 from packed int32 [K*bits/32, N] (LSB first; 3-bit: 32 codes in a
    96-bit little-endian stream over three words)."""
    words = qweight.to(torch.int64) & 0xFFFFFFFF
    rows, n = words.shape
    if bits == 3:
        block = words.reshape(rows // 3, 3, n)
        low = block[:, 0] | (block[:, 1] << 32)  # bits 0..63 of the stream
        high = block[:, 1] | (block[:, 2] << 32)  # bits 32..95
        fields = []
        for j in range(32):
            start = 3 * j
            source, shift = (low, start) if start + 3 <= 64 else (high, start - 32)
            fields.append((source >> shift) & 7)
        return torch.stack(fields, dim=1).reshape(rows // 3 * 32, n).to(torch.int32)
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=qweight.device)
    codes = (words.unsqueeze(1) >> shifts.view(1, per_word, 1)) & ((1 << bits) - 1)
    return codes.reshape(rows * per_word, n).to(torch.int32)


def dequantize(spec: UniformSpec, prepared: PreparedWeights) -> torch.Tensor:
    """W [K, N] float32 (rows in the prepared order) from ``prepare``'s operands:
    ``scales[g] * (q - zeros[g])`` with ``g = k // group_size``."""
    qweight, scales, zeros = prepared.tensors[:3]
    codes = unpack_codes(qweight, spec.bits).to(torch.float32)
    group = spec.effective_group_size
    codes = codes.view(spec.groups, group, spec.n)
    weight = (codes - zeros.to(torch.float32).unsqueeze(1)) * scales.to(torch.float32).unsqueeze(1)
    return weight.reshape(spec.k, spec.n)
