"""The uniform family: GPTQ tensors in, a tuned kernel's operands out."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.gptq import GptqTensors, quantize_rtn
from qcompile.kernels.base import KernelFamily, PreparedWeights
from qcompile.kernels.uniform.spec import UniformSpec


class UniformFamily(KernelFamily):
    name: ClassVar[str] = "uniform"
    spec_type: ClassVar[type] = UniformSpec

    def spec_from_cli(self, args, *, k: int, n: int) -> UniformSpec:
        return UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size, m=args.batch,
                           dtype=args.dtype)

    def compute(self, spec: UniformSpec):
        from qcompile.kernels.uniform.compute import uniform_compute

        return uniform_compute(spec)

    def compute_for(self, spec: UniformSpec, target_kind: str):
        """compute.py's QIGen form on CPUs; compute_cuda.py's on GPUs (no int->float converts,
        no group sums: see that module for why)."""
        if target_kind == "cuda":
            from qcompile.kernels.uniform.compute_cuda import uniform_compute_cuda

            return uniform_compute_cuda(spec)
        return self.compute(spec)

    def checkpoint_tensors(self, spec: UniformSpec, *, qweight, scales, qzeros, g_idx=None,
                           zero_convention: str = "v1") -> GptqTensors:
        """Validate GPTQ tensors against ``spec`` (shapes, dtypes, bits, group size)."""
        shape = tuple(getattr(qweight, "shape", ()))
        if shape != (spec.packed_rows, spec.n):
            raise FormatError(
                f"qweight must have shape [K*bits/32, N]=({spec.packed_rows}, {spec.n}) for this "
                f"{spec.k}x{spec.n} {spec.bits}-bit kernel; got {shape}"
            )
        tensors = GptqTensors.from_tensors(
            qweight=qweight, scales=scales, qzeros=qzeros, g_idx=g_idx, bits=spec.bits,
            group_size=spec.group_size, zero_convention=zero_convention,
        )
        trivial = tensors.g_idx == np.arange(spec.k) // spec.effective_group_size
        if not trivial.all():
            raise FormatError(
                f"g_idx is not k // group_size (act_order) at {int((~trivial).sum())} of "
                f"{spec.k} rows; this kernel reads groups in row order"
            )
        return tensors

    def prepare(self, spec: UniformSpec, device: str = "cpu", *, qweight, scales, qzeros,
                g_idx=None, zero_convention: str = "v1") -> PreparedWeights:
        """GPTQ tensors -> kernel operands.

        Parameters
        ----------
        qweight : int32 [K * bits/32, N], torch.Tensor or numpy.ndarray
            Codes packed along K, LSB first (read as is; no repacking).
        scales : float16 or float32 [G, N]
        qzeros : int32 [G, N * bits/32]
            Zero-points packed along N, in ``zero_convention`` ("v1": stored z - 1).
        g_idx : int32 [K], optional
            Must be trivial (k // group_size) for this kernel.

        Returns
        -------
        PreparedWeights
            (qweight int32 [K*bits/32, N], scales float16 [G, N], zeros uint8 [G, N]).
        """
        import torch

        from qcompile.tensors import kernel_ready

        t = self.checkpoint_tensors(spec, qweight=qweight, scales=scales, qzeros=qzeros,
                                    g_idx=g_idx, zero_convention=zero_convention)
        if t.scales.dtype != np.float16:
            raise FormatError(
                f"scales must be float16 (GPTQ stores fp16 scales); got {t.scales.dtype}")
        operands = (t.qweight.view(np.int32), t.scales, t.zeros().astype(np.uint8))
        tensors = tuple(kernel_ready(torch.from_numpy(np.ascontiguousarray(a)).to(device))
                        for a in operands)
        return PreparedWeights(spec_digest=spec.digest(), tensors=tensors,
                               names=("qweight", "scales", "zeros"), extras={})

    def bytes_read(self, spec: UniformSpec) -> int:
        weights = spec.packed_rows * spec.n * 4
        group_params = spec.groups * spec.n * (2 + 1)  # fp16 scale + uint8 zero
        activations = spec.m * spec.k * 4
        return weights + group_params + activations

    def example_tensors(self, spec: UniformSpec, rng: np.random.Generator) -> dict[str, Any]:
        weight = rng.standard_normal((spec.k, spec.n)).astype(np.float32) * 0.02
        t = quantize_rtn(weight, spec.bits, spec.group_size, sym=False)
        return {"qweight": t.qweight, "scales": t.scales, "qzeros": t.qzeros, "g_idx": t.g_idx}

    def reference_weight(self, spec: UniformSpec, *, qweight, scales, qzeros, g_idx=None,
                         zero_convention: str = "v1") -> np.ndarray:
        """The dequantized weight W [K, N], float32."""
        t = GptqTensors.from_tensors(qweight=qweight, scales=scales, qzeros=qzeros, g_idx=g_idx,
                                     bits=spec.bits, group_size=spec.group_size,
                                     zero_convention=zero_convention)
        return t.dequantize()

    def reference(self, spec: UniformSpec, x: np.ndarray, **tensors) -> np.ndarray:
        weight = self.reference_weight(spec, **tensors).astype(np.float64)
        return np.asarray(x, dtype=np.float64) @ weight


FAMILY = UniformFamily()
