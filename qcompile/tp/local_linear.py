"""The local GEMM of a tensor-parallel rank: ``y = x @ W_shard`` for one quantized shard.

Two backends, chosen explicitly by the caller:

- :class:`KernelLinear` runs a compiled qcompile kernel (``qcompile.load``) on the shard;
- :class:`TorchDequantLinear` is the torch fallback, named as such: it dequantizes the shard once
  and multiplies with ``torch.matmul`` in the requested dtype (how the TP-aware paper measured
  its GEMMs, in fp16). It serves GPUs until qcompile's CUDA kernels cover a shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import qcompile
from qcompile.errors import ArgumentError
from qcompile.formats.gptq import GptqTensors
from qcompile.kernels.uniform import UniformSpec


def shard_spec(shard: GptqTensors, rows: int) -> UniformSpec:
    """The uniform kernel spec that multiplies ``rows`` activation rows by ``shard``."""
    return UniformSpec(k=shard.in_features, n=shard.out_features, bits=shard.bits,
                       group_size=shard.group_size, m=rows)


class KernelLinear:
    """``y = x @ W_shard`` through a compiled qcompile kernel.

    Parameters
    ----------
    shard : GptqTensors
        A sequential (trivial g_idx) shard, [K_local, N_local].
    kernel_dir : str or Path
        Directory holding ``<spec name>.so`` and its manifest for ``shard_spec(shard, rows)``
        (``qcompile build`` writes them).
    rows : int
        Activation rows M per call.
    """

    backend = "qcompile"

    def __init__(self, shard: GptqTensors, kernel_dir: str | Path, rows: int) -> None:
        spec = shard_spec(shard, rows)
        self.kernel = qcompile.load(str(Path(kernel_dir) / f"{spec.name()}.so"))
        self.weights = self.kernel.prepare(qweight=shard.qweight, scales=shard.scales,
                                           qzeros=shard.qzeros,
                                           zero_convention=shard.zero_convention)

    def __call__(self, x):
        """x: float32 [M, K_local] on the CPU -> float32 [M, N_local]."""
        return self.kernel(x, self.weights)


class TorchDequantLinear:
    """The torch fallback: the shard dequantized once, then ``x @ W`` with torch.

    Parameters
    ----------
    shard : GptqTensors
        [K_local, N_local], any g_idx.
    dtype : torch.dtype
        Dtype of the dense weight and of the activations it accepts (fp16 on GPUs).
    device : str or torch.device
    """

    backend = "torch-dequant"

    def __init__(self, shard: GptqTensors, dtype, device) -> None:
        import torch

        weight = shard.dequantize().astype(np.float32)
        self.weight = torch.from_numpy(weight).to(device=device, dtype=dtype)

    def __call__(self, x):
        """x: [M, K_local] in the weight's dtype and device -> [M, N_local]."""
        if x.dtype != self.weight.dtype or x.device != self.weight.device:
            raise ArgumentError(
                f"x must be {self.weight.dtype} on {self.weight.device}; "
                f"got {x.dtype} on {x.device}"
            )
        return x @ self.weight
