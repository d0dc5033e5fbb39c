"""The uniform family: GPTQ tensors in, a tuned kernel's operands out."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.act_order import reorder
from qcompile.formats.gptq import GptqTensors, as_numpy
from qcompile.kernels.base import KernelFamily, PreparedWeights
from qcompile.kernels.layouts import uniform as weight_layout
from qcompile.kernels.uniform.spec import UniformSpec
from qcompile.quantize.rtn import quantize_rtn
from qcompile.tensors import kernel_ready

_ACTIVATION_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _parse_bool(text: str) -> bool:
    value = {"true": True, "1": True, "false": False, "0": False}.get(text.lower())
    if value is None:
        import argparse

        raise argparse.ArgumentTypeError(f"expected True or False; got {text!r}")
    return value


class UniformFamily(KernelFamily):
    name: ClassVar[str] = "uniform"
    spec_type: ClassVar[type] = UniformSpec

    def add_cli_arguments(self, group) -> None:
        group.add_argument("--act-order", type=_parse_bool, default=False, metavar="BOOL",
                           help="uniform: gather x by act_order's permutation inside the kernel "
                                "(True/False, default False)")
        group.add_argument("--int8-activations", action="store_true",
                           help="uniform and mixed: quantize x to int8 per group and take "
                                "integer dot products (AVX2 vpmaddubsw; CUDA dp4a, uniform "
                                "only): 2/3/4-bit at the memory bandwidth, about 1e-2 relative "
                                "error (mixed: the outliers still use float x)")

    def spec_from_cli(self, args, *, k: int, n: int) -> UniformSpec:
        return UniformSpec(k=k, n=n, bits=args.bits, group_size=args.group_size, m=args.batch,
                           dtype=args.dtype, act_order=getattr(args, "act_order", False),
                           int8_activations=getattr(args, "int8_activations", False))

    def checkpoint_tensors(self, spec: UniformSpec, *, qweight, scales, qzeros, g_idx=None,
                           zero_convention: str = "v1") -> GptqTensors:
        """Validate GPTQ tensors against ``spec`` (shapes, dtypes, bits, group size, g_idx)."""
        shape = tuple(getattr(qweight, "shape", ()))
        if shape != (spec.packed_rows, spec.n):
            raise FormatError(
                f"qweight must have shape [K*bits/32, N]=({spec.packed_rows}, {spec.n}) for this "
                f"{spec.k}x{spec.n} {spec.bits}-bit kernel; got {shape}"
            )
        return GptqTensors.from_tensors(
            qweight=qweight, scales=scales, qzeros=qzeros, g_idx=g_idx, bits=spec.bits,
            group_size=spec.group_size, zero_convention=zero_convention,
        )

    def quantize(self, spec: UniformSpec, weight, *, sym: bool = False) -> GptqTensors:
        """Quantize float W [K, N] into GPTQ tensors of ``spec``'s bits and group size by
        rounding to nearest (:func:`qcompile.quantize.rtn.quantize_rtn`)."""
        weight = as_numpy("weight", weight)
        if weight.shape != (spec.k, spec.n):
            raise FormatError(f"weight must have shape [K, N]=({spec.k}, {spec.n}) "
                              f"(nn.Linear.weight.T); got {tuple(weight.shape)}")
        return quantize_rtn(weight, spec.bits, spec.group_size, sym=sym)

    def prepare(self, spec: UniformSpec, device: str = "cpu", *, qweight, scales, qzeros,
                g_idx=None, zero_convention: str = "v1", bias=None,
                layout: dict | None = None) -> PreparedWeights:
        """GPTQ tensors -> kernel operands, once per layer.

        act_order weights (``g_idx`` not ``k // group_size``) are made sequential here: rows
        reordered by ``P = argsort(g_idx)`` (TP-aware dequantization, Algorithm 1), so each
        group is contiguous; every call then gathers ``x[..., P]``: inside the kernel for an
        ``act_order`` spec (``perm`` operand), else as a separate step before it. A trivial
        ``g_idx`` (no act_order, or ``static_groups``) is detected and costs nothing.

        Parameters
        ----------
        qweight : int32 [K * bits/32, N], torch.Tensor or numpy.ndarray
            Codes packed along K, LSB first (3-bit: 32 codes per 3 words).
        scales : float16 [G, N]
        qzeros : int32 [G, N * bits/32]
            Zero-points packed along N, in ``zero_convention`` ("v1": stored z - 1, "v2": z).
        g_idx : int32 [K], optional
            Group of each input row; None means ``k // group_size``.
        bias : float16/bfloat16/float32 [N], optional
            Added to every output row (in float32, before the output's rounding is kept).
        layout : dict, optional
            The weight layout the kernel reads (its manifest's ``layout``, see layout.py);
            None keeps GPTQ's layout.

        Returns
        -------
        PreparedWeights
            tensors: qweight int32 [K*bits/32, N] (rows in P order; for ``int8_activations``
            specs uint8 [U, P, N, 4], tir.planes.byte_planes), scales float16 [G, N],
            zeros uint8 [G, N] (each [N/T, rows, T] in the ``n_tiled`` layout), and for
            ``act_order`` specs perm int32 [K]; extras: ``layout`` (the layout), ``perm``
            (int64 [K], the separate gather) when the rows were reordered and the spec does
            not gather itself, ``bias`` (float32 [N]) when given.
        """
        import torch


        layer = self.checkpoint_tensors(spec, qweight=qweight, scales=scales, qzeros=qzeros,
                                        g_idx=g_idx, zero_convention=zero_convention)
        if layer.scales.dtype != np.float16:
            raise FormatError(
                f"scales must be float16 (GPTQ stores fp16 scales); got {layer.scales.dtype}")
        permutation, layer = reorder(layer)
        reordered = not np.array_equal(permutation, np.arange(spec.k))
        operands = [layer.qweight.view(np.int32), layer.scales, layer.zeros().astype(np.uint8)]
        names = ["qweight", "scales", "zeros"]
        extras = {}
        if spec.act_order:
            operands.append(permutation.astype(np.int32))
            names.append("perm")
        elif reordered:
            extras["perm"] = torch.from_numpy(permutation).to(device)
        if bias is not None:
            extras["bias"] = self._bias(spec, bias).to(device)
        by_name = self.kernel_operands(spec, {name: torch.from_numpy(np.ascontiguousarray(a))
                                    for name, a in zip(names, operands, strict=True)}, layout)
        extras["layout"] = layout
        tensors = tuple(kernel_ready(by_name[name].to(device)) for name in names)
        return PreparedWeights(spec_digest=spec.digest(), tensors=tensors, names=tuple(names),
                               extras=extras)

    codes_operand: ClassVar[str] = "qweight"

    def describe_layout(self, layout: dict | None) -> str:
        return weight_layout.describe(layout)

    def kernel_operands(self, spec: UniformSpec, by_name: dict, layout: dict | None) -> dict:
        """GPTQ-layout operands (torch) -> the kernel's: the codes split into byte planes for
        an ``int8_activations`` spec (tir.planes.byte_planes), then packed into ``layout``."""
        import torch

        qweight = by_name["qweight"]
        if spec.int8_activations and qweight.dim() == 2:
            from qcompile.kernels.tir.planes import byte_planes

            planes = byte_planes(qweight.cpu().numpy(), spec.bits)
            by_name = {**by_name, "qweight": torch.from_numpy(planes).to(qweight.device)}
        return weight_layout.pack(by_name, layout)

    def bytes_read(self, spec: UniformSpec) -> int:
        weights = spec.packed_rows * spec.n * 4
        group_params = spec.groups * spec.n * (2 + 1)  # fp16 scale + uint8 zero
        activations = spec.m * spec.k * _ACTIVATION_BYTES[spec.dtype]
        gather = spec.k * 4 if spec.act_order else 0
        return weights + group_params + activations + gather

    def example_tensors(self, spec: UniformSpec, rng: np.random.Generator) -> dict[str, Any]:
        weight = rng.standard_normal((spec.k, spec.n)).astype(np.float32) * 0.02
        t = self.quantize(spec, weight)
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
