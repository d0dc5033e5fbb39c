"""The BCQ family (LUT-GEMM): float, uniform GPTQ or BCQ tensors in, table-lookup operands out."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from qcompile.errors import ArgumentError, FormatError
from qcompile.formats import bitpack
from qcompile.formats.act_order import reorder
from qcompile.formats.bcq import BcqTensors, from_uniform
from qcompile.formats.gptq import GptqTensors, as_numpy
from qcompile.kernels.base import KernelFamily, PreparedWeights
from qcompile.kernels.bcq.spec import BcqSpec
from qcompile.kernels.layouts import bcq as bcq_layout
from qcompile.quantize.bcq import quantize_bcq
from qcompile.tensors import kernel_ready

#: The kernels' weight operands, in parameter order.
_OPERANDS = ("planes", "alpha", "z")
_SOURCES = (
    ("weight",),
    ("qweight", "scales", "qzeros"),
    ("planes", "alpha", "z"),
)


class BcqFamily(KernelFamily):
    name: ClassVar[str] = "bcq"
    spec_type: ClassVar[type] = BcqSpec

    def add_cli_arguments(self, group) -> None:
        group.add_argument("--mu", type=int, default=8, metavar="MU",
                           help="bcq: activations per lookup table, 2..8 (default 8); --bits is "
                                "the number of sign planes q")

    def spec_from_cli(self, args, *, k: int, n: int) -> BcqSpec:
        return BcqSpec(k=k, n=n, q=args.bits, group_size=args.group_size, m=args.batch,
                       mu=getattr(args, "mu", 8), dtype=args.dtype)

    def describe_layout(self, layout: dict | None) -> str:
        if layout is None:
            return "bcq planes [q, K/32, N]"
        return (f"{layout['kind']} (planes [q, K/32, N], each group's {layout['chunks']} chunks "
                f"rotated by (n // {layout['cols']}) mod {layout['chunks']})")

    def kernel_operands(self, spec: BcqSpec, by_name: dict, layout: dict | None) -> dict:
        """The format's operands (torch, by name) -> the kernel's: planes rotated for the
        ``rotated_chunks`` layout, alpha and z as they are."""
        if layout is None:
            return by_name
        from qcompile.kernels.bcq import compute_cuda_rotated

        expected = bcq_layout.layout(spec.effective_group_size)
        if layout != expected:
            raise FormatError(f"{spec.name()}: unknown bcq weight layout {layout}; this spec's "
                              f"rotated layout is {expected}")
        compute_cuda_rotated.check_spec(spec)
        planes = bcq_layout.rotate_planes(by_name["planes"], spec.effective_group_size)
        return {**by_name, "planes": planes}

    def checkpoint_tensors(self, spec: BcqSpec, *, weight=None, qweight=None, scales=None,
                           qzeros=None, g_idx=None, zero_convention: str = "v1", planes=None,
                           alpha=None, z=None, iterations: int = 15):
        """Any accepted source -> (row permutation or None, BcqTensors, quantization report or
        None), checked against ``spec``. See :meth:`prepare` for the sources."""
        given = {"weight": weight, "qweight": qweight, "scales": scales, "qzeros": qzeros,
                 "planes": planes, "alpha": alpha, "z": z}
        sources = [names for names in _SOURCES if any(given[n] is not None for n in names)]
        if len(sources) != 1 or any(given[n] is None for n in sources[0]):
            forms = "; or ".join(", ".join(names) for names in _SOURCES)
            passed = sorted(n for n, v in given.items() if v is not None)
            raise ArgumentError(f"bcq weights come as exactly one of: {forms}; got {passed}")
        permutation, report = None, None
        if weight is not None:

            tensors, report = self.quantize(spec, weight, iterations=iterations)
        elif qweight is not None:

            rows = bitpack.packed_length(spec.k, spec.q)
            shape = tuple(getattr(qweight, "shape", ()))
            if shape != (rows, spec.n):
                raise FormatError(
                    f"qweight must have shape [K*bits/32, N]=({rows}, {spec.n}) for this "
                    f"{spec.k}x{spec.n} kernel of q={spec.q} planes ({spec.q}-bit GPTQ "
                    f"weights); got {shape}")
            layer = GptqTensors.from_tensors(qweight=qweight, scales=scales, qzeros=qzeros,
                                             g_idx=g_idx, bits=spec.q,
                                             group_size=spec.group_size,
                                             zero_convention=zero_convention)
            if (layer.in_features, layer.out_features) != (spec.k, spec.n):
                raise FormatError(f"the GPTQ tensors hold a {layer.in_features}x"
                                  f"{layer.out_features} layer; this kernel is "
                                  f"{spec.k}x{spec.n}")
            perm, layer = reorder(layer)
            if not np.array_equal(perm, np.arange(spec.k)):
                permutation = perm
            tensors = from_uniform(layer)
        else:
            tensors = BcqTensors.from_tensors(planes=planes, alpha=alpha, z=z,
                                              group_size=spec.group_size)
        if (tensors.q, tensors.k, tensors.n) != (spec.q, spec.k, spec.n):
            raise FormatError(f"the BCQ tensors hold q={tensors.q} planes of a {tensors.k}x"
                              f"{tensors.n} layer; this kernel is q={spec.q}, {spec.k}x{spec.n}")
        return permutation, tensors, report

    def quantize(self, spec: BcqSpec, weight, *, iterations: int = 15):
        """Quantize float W [K, N] into ``spec.q`` sign planes (greedy + alternating least
        squares, :func:`qcompile.quantize.bcq.quantize_bcq`): (BcqTensors, report)."""
        weight = as_numpy("weight", weight)
        if weight.shape != (spec.k, spec.n):
            raise FormatError(f"weight must have shape [K, N]=({spec.k}, {spec.n}) "
                              f"(nn.Linear.weight.T); got {tuple(weight.shape)}")
        return quantize_bcq(weight, spec.q, spec.group_size, iterations)

    def prepare(self, spec: BcqSpec, device: str = "cpu", *, bias=None,
                layout: dict | None = None, **tensors) -> PreparedWeights:
        """Weights -> kernel operands, once per layer.

        Parameters
        ----------
        weight : float [K, N], optional
            Float weights (``nn.Linear.weight.T``), quantized here with ``q = spec.q`` planes
            (greedy + alternating least squares; ``iterations`` rounds, default 15). The report
            is in ``extras["quantization"]``.
        qweight, scales, qzeros, g_idx, zero_convention : optional
            Uniform GPTQ tensors of ``spec.q`` bits (the uniform family's layout), converted
            exactly (LUT-GEMM eq. 5). act_order rows are reordered and x is gathered per call.
        planes, alpha, z : optional
            BCQ tensors as :class:`qcompile.formats.bcq.BcqTensors` holds them.
        bias : float16/bfloat16/float32 [N], optional
            Added to every output row.
        layout : dict, optional
            The weight layout the kernel reads (its manifest's ``layout``): None keeps the
            format's, ``rotated_chunks`` (compute_cuda_rotated.py) rotates the planes' chunks.

        Returns
        -------
        PreparedWeights
            tensors: planes int32 [q, K/32, N] (chunks rotated for ``rotated_chunks``), alpha
            float16 [G, q, N], z float32 [G, N]; extras: ``layout`` when one is given,
            ``perm`` (int64 [K]) when act_order rows were reordered, ``bias`` (float32 [N])
            when given, ``quantization`` (QuantizationReport) for float weights.
        """
        import torch


        permutation, bcq, report = self.checkpoint_tensors(spec, **tensors)
        extras = {}
        if permutation is not None:
            extras["perm"] = torch.from_numpy(permutation).to(device)
        if bias is not None:
            extras["bias"] = self._bias(spec, bias).to(device)
        if report is not None:
            extras["quantization"] = report
        by_name = {name: torch.from_numpy(np.ascontiguousarray(a)).to(device)
                   for name, a in zip(_OPERANDS, (bcq.planes, bcq.alpha, bcq.z), strict=True)}
        if layout is not None:
            by_name = self.kernel_operands(spec, by_name, layout)
            extras["layout"] = layout
        operands = tuple(kernel_ready(by_name[name]) for name in _OPERANDS)
        return PreparedWeights(spec_digest=spec.digest(), tensors=operands,
                               names=_OPERANDS, extras=extras)

    def bytes_read(self, spec: BcqSpec) -> int:
        planes = spec.q * spec.words * spec.n * 4
        params = spec.groups * spec.n * (spec.q * 2 + 4)  # fp16 alphas + fp32 bias
        return planes + params + spec.m * spec.k * 4

    def example_tensors(self, spec: BcqSpec, rng: np.random.Generator) -> dict[str, Any]:
        """Random BCQ tensors (any bit pattern is valid; alphas halve plane by plane)."""
        planes = rng.integers(0, 1 << 32, size=(spec.q, spec.words, spec.n),
                              dtype=np.uint64).astype(np.uint32).view(np.int32)
        base = rng.uniform(0.005, 0.02, size=(spec.groups, 1, spec.n))
        alpha = (base * 0.5 ** np.arange(spec.q)[None, :, None]).astype(np.float16)
        z = (rng.standard_normal((spec.groups, spec.n)) * 0.005).astype(np.float32)
        return {"planes": planes, "alpha": alpha, "z": z}

    def reference_weight(self, spec: BcqSpec, **tensors) -> np.ndarray:
        """The weight W [K, N], float32, rows in the checkpoint's order."""
        permutation, bcq, _ = self.checkpoint_tensors(spec, **tensors)
        weight = bcq.dequantize()
        if permutation is None:
            return weight
        original = np.empty_like(weight)
        original[permutation] = weight
        return original

    def reference(self, spec: BcqSpec, x: np.ndarray, **tensors) -> np.ndarray:
        weight = self.reference_weight(spec, **tensors).astype(np.float64)
        return np.asarray(x, dtype=np.float64) @ weight


FAMILY = BcqFamily()
