"""Load the kernel `make demo` built and run it on a quantized random matrix (README.md).

Run from the repository root after `qcompile build --target avx2 --out kernels/`.
"""

import numpy as np
import torch

import qcompile
from qcompile.quantize.rtn import quantize_rtn

K, N, BITS, GROUP = 4096, 4096, 4, 128  # the default spec: uniform_b4_g128_k4096_n4096_m1_f32

# A weight W [K, N] = nn.Linear(K, N).weight.T, quantized by round to nearest into GPTQ tensors:
# qweight int32 [K*BITS/32, N] (8 codes a word along K, lowest bits first), scales float16
# [K/GROUP, N], qzeros int32 [K/GROUP, N*BITS/32] (zero-points packed along N, stored z - 1: v1).
rng = np.random.default_rng(0)
weight = rng.standard_normal((K, N), dtype=np.float32)
gptq = quantize_rtn(weight, bits=BITS, group_size=GROUP)

kernel = qcompile.load("kernels/uniform_b4_g128_k4096_n4096_m1_f32.so")
w = kernel.prepare(qweight=gptq.qweight, scales=gptq.scales, qzeros=gptq.qzeros)  # once
x = torch.randn(K)  # float32 [K] or [1, K]
y = kernel(x, w)  # float32 [N]: y = x @ W_q

reference = x @ torch.from_numpy(gptq.dequantize())  # the dequantized weight, in float32
error = ((y - reference).abs().max() / reference.abs().max()).item()
print(f"{kernel}: y {tuple(y.shape)}, max relative error {error:.1e}")
assert error < 1e-4
