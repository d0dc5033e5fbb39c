"""The mixed family: float weights plus calibration data (or an already quantized matrix) in,
the fused kernel's operands out."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.mixed import MixedTensors, storage_rows
from qcompile.kernels.base import KernelFamily, PreparedWeights
from qcompile.kernels.layouts import mixed as weight_layout
from qcompile.kernels.mixed.spec import MixedSpec
from qcompile.quantize.hessian import DAMP
from qcompile.quantize.mixed import quantize
from qcompile.tensors import kernel_ready


class MixedFamily(KernelFamily):
    name: ClassVar[str] = "mixed"
    spec_type: ClassVar[type] = MixedSpec

    def add_cli_arguments(self, group) -> None:
        """The mixed spec's flags; ``--int8-activations`` is shared with the uniform family
        (one parser: it adds the flag)."""
        group.add_argument("--g1", type=int, default=16,
                           help="mixed: rows per first-order group and per 2/4-bit choice "
                                "(default 16)")
        group.add_argument("--g2", type=int, default=16,
                           help="mixed: columns per second-order scale group (default 16)")
        group.add_argument("--g4", type=int, default=64,
                           help="mixed: rows per scale group of the 4-bit part (default 64)")
        group.add_argument("--four-bit-share", type=float, default=0.25, metavar="SHARE",
                           help="mixed: share of groups in 4-bit (default 0.25)")
        group.add_argument("--outlier-share", type=float, default=0.002, metavar="SHARE",
                           help="mixed: share of weights kept as fp16 outliers (default 0.002)")

    def spec_from_cli(self, args, *, k: int, n: int) -> MixedSpec:
        return MixedSpec(k=k, n=n, m=args.batch, dtype=args.dtype, g1=args.g1, g2=args.g2,
                         g4=args.g4, four_bit_share=args.four_bit_share,
                         outlier_share=args.outlier_share,
                         int8_activations=getattr(args, "int8_activations", False))

    def quantize(self, spec: MixedSpec, weight, *, calibration=None, hessian=None,
                 damp: float | None = None):
        """Quantize float W [K, N] for ``spec`` (see :func:`qcompile.quantize.mixed.quantize`).

        Returns a :class:`~qcompile.quantize.mixed.MixedQuantization` (tensors and report).
        """

        weight = np.asarray(_numpy(weight), dtype=np.float32)
        return quantize(weight, spec.layout, x=_numpy(calibration), h=_numpy(hessian),
                        damp=DAMP if damp is None else damp)

    def checkpoint_tensors(self, spec: MixedSpec, **arrays) -> MixedTensors:
        """The format's arrays (formats/mixed.py: order, codes2, ..., values), checked."""
        expected = list(spec.layout.shapes())
        missing = [name for name in expected if name not in arrays]
        unknown = sorted(set(arrays) - set(expected))
        if missing or unknown:
            raise FormatError(f"mixed weights need exactly the arrays {expected}; missing "
                              f"{missing}, unknown {unknown}")
        return MixedTensors(layout=spec.layout,
                            **{name: _numpy(arrays[name]) for name in expected})

    def prepare(self, spec: MixedSpec, device: str = "cpu", *, weight=None, calibration=None,
                hessian=None, damp: float | None = None, layout: dict | None = None,
                **arrays) -> PreparedWeights:
        """Kernel operands from float weights plus calibration data, or from a quantized matrix.

        Parameters
        ----------
        weight : float [K, N], torch.Tensor or numpy.ndarray, optional
            The float weight (``y = x @ W``); quantized here with ``calibration`` or
            ``hessian``.
        calibration : float [S, K], optional
            Calibration activations of the layer (H = 2 XᵀX / S).
        hessian : float [K, K], optional
            H itself, instead of ``calibration``.
        damp : float, optional
            Cholesky damping as a share of mean(diag H) (default 0.01).
        layout : dict, optional
            The weight layout the kernel reads (its manifest's ``layout``, see
            kernels/layouts/mixed.py); None keeps the format's layout.
        **arrays
            Without ``weight``: the format's arrays (formats/mixed.py), as numpy or torch.

        Returns
        -------
        PreparedWeights
            tensors: the format's arrays in the kernel's order, the per-column ones
            (codes2, meta2, scale2, zero2, codes4, scales4, zeros4) as [N/T, rows, T] in the
            ``n_tiled`` layout (for ``int8_activations`` specs codes2 and codes4 as uint8 byte
            planes [R, 1, N, 4], tiled [N/T, R, 1, T, 4]: kernels/mixed/compute_int8.py; in
            the CUDA kernel's ``plane_words`` layout int32 [R, 1, N]);
            extras: ``layout`` (the layout) and ``report`` (the quantizer's report: average
            bits, errors) when quantized here.
        """
        import torch


        extras = {}
        if weight is not None:
            if arrays:
                raise FormatError(f"give weight (+ calibration or hessian) or the quantized "
                                  f"arrays, not both; got also {sorted(arrays)}")
            result = self.quantize(spec, weight, calibration=calibration, hessian=hessian,
                                   damp=damp)
            tensors = result.tensors
            extras["report"] = result.report()
        else:
            if calibration is not None or hessian is not None:
                raise FormatError("calibration/hessian are for quantizing a float weight; "
                                  "give weight too")
            tensors = self.checkpoint_tensors(spec, **arrays)
        operands = self.kernel_operands(
            spec, {name: torch.from_numpy(np.ascontiguousarray(a))
                   for name, a in tensors.operands().items()}, layout)
        extras["layout"] = layout
        prepared = tuple(kernel_ready(t.to(device)) for t in operands.values())
        return PreparedWeights(spec_digest=spec.digest(), tensors=prepared,
                               names=tuple(operands), extras=extras)

    codes_operand: ClassVar[str] = "codes2"

    def describe_layout(self, layout: dict | None) -> str:
        return weight_layout.describe(layout)

    def kernel_operands(self, spec: MixedSpec, arrays: dict, layout: dict | None) -> dict:
        """The format's arrays (numpy or torch, the format's layout) -> the kernel's operands:
        for an ``int8_activations`` spec the codes as byte planes (compute_int8.py), then
        packed into ``layout`` (kernels/layouts/mixed.py)."""
        if spec.int8_activations:
            from qcompile.kernels.mixed.compute_int8 import byte_plane_operands

            arrays = byte_plane_operands(arrays)
        return weight_layout.pack(arrays, layout, spec.g2)

    def measure_arguments(self, spec: MixedSpec):
        """Valid operands for tuning (random ones would index outside the buffers)."""
        import functools

        from qcompile.kernels.mixed.measure import alloc_arguments  # it imports the families

        return functools.partial(alloc_arguments, spec.to_json())

    def bytes_read(self, spec: MixedSpec) -> int:
        lay = spec.layout
        operands = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize
                       for shape, dtype in lay.shapes().values())
        return operands + spec.m * spec.k * 4

    def example_tensors(self, spec: MixedSpec, rng: np.random.Generator) -> dict[str, Any]:
        """Random arrays of the format, fast at any size (no quantization): random codes,
        group order, scales and outlier positions in 2-bit rows. (An outlier's 2-bit code is
        random here, not its group's zero as the quantizer makes it; the kernel does not care.)
        """
        lay = spec.layout
        n = lay.n
        order = rng.permutation(lay.groups).astype(np.int32)
        meta2 = rng.integers(0, 64, size=(lay.groups2, n), dtype=np.uint8)
        scale2 = (rng.uniform(0.5, 1.5, size=(lay.groups2, n // lay.g2)) * 0.002).astype(
            np.float16)
        zero2 = rng.integers(0, 16, size=(lay.groups2, n // lay.g2), dtype=np.uint8)
        scales4 = (rng.uniform(0.5, 1.5, size=(lay.scale_groups4, n)) * 0.004).astype(
            np.float16)
        zeros4 = rng.integers(0, 16, size=(lay.scale_groups4, n), dtype=np.uint8)
        rows2 = storage_rows(order, lay.g1)[: lay.rows2]
        flat = rng.choice(lay.rows2 * n, size=lay.nnz, replace=False)
        columns = flat % n
        keys = np.lexsort((rows2[flat // n], columns))
        row_ptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(columns, minlength=n), out=row_ptr[1:])
        cols = np.zeros(lay.capacity, dtype=np.uint16)
        values = np.zeros(lay.capacity, dtype=np.float16)
        cols[: lay.nnz] = rows2[flat // n][keys]
        values[: lay.nnz] = (rng.standard_normal(lay.nnz) * 0.1).astype(np.float16)
        return {
            "order": order,
            "codes2": rng.integers(-(1 << 31), 1 << 31, size=(lay.rows2 // 16, n),
                                   dtype=np.int64).astype(np.int32),
            "meta2": meta2, "scale2": scale2, "zero2": zero2,
            "codes4": rng.integers(-(1 << 31), 1 << 31, size=(lay.rows4 // 8, n),
                                   dtype=np.int64).astype(np.int32),
            "scales4": scales4, "zeros4": zeros4, "row_ptr": row_ptr, "cols": cols,
            "values": values,
        }

    def reference_weight(self, spec: MixedSpec, **arrays) -> np.ndarray:
        """The dequantized weight W [K, N], float32, outliers included."""
        return self.checkpoint_tensors(spec, **arrays).dequantize()

    def reference(self, spec: MixedSpec, x: np.ndarray, **arrays) -> np.ndarray:
        weight = self.reference_weight(spec, **arrays).astype(np.float64)
        return np.asarray(x, dtype=np.float64) @ weight

    def kernel_reference(self, spec: MixedSpec, x: np.ndarray, **arrays) -> np.ndarray:
        """float64 output of exactly what ``spec``'s kernel computes: :meth:`reference`, except
        that an ``int8_activations`` kernel multiplies the dense weights by x rounded per row
        and g1-group (tir.activations.quantized_activations) and the outliers by x."""
        if not spec.int8_activations:
            return self.reference(spec, x, **arrays)
        from qcompile.kernels.tir.activations import quantized_activations

        tensors = self.checkpoint_tensors(spec, **arrays)
        x = np.asarray(x, dtype=np.float32)
        rounded = quantized_activations(x.reshape(-1, spec.k), spec.g1).reshape(x.shape)
        return (rounded @ tensors.dense().astype(np.float64)
                + x.astype(np.float64) @ tensors.outliers().astype(np.float64))


def _numpy(value):
    """numpy view of a torch tensor or array-like (None stays None)."""
    if value is None:
        return None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return np.asarray(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


FAMILY = MixedFamily()
