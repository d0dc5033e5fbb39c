"""Whole models the model benchmarks compare, all of one GPTQ checkpoint and one architecture
(transformers' Llama), differing only in what runs the linear layers:

``qcompile``        ``qcompile.hf.from_gptq``: QuantLinear on our kernels (q/k/v and gate/up
                    fused), the dense prefill path from ``prefill_rows`` rows
``transformers``    ``qcompile.hf.dequantized``: transformers' own model with the same weights
                    dequantized to dense ``nn.Linear`` (fp16 on a GPU, float32 on a CPU)
``humming``         ``qcompile.hf.with_layers``: humming-kernels' GPTQ layers (vLLM's JIT
                    successor of Marlin), fused as vLLM fuses them; GPU only

and the float64 reference every one is checked against (``qcompile.hf.dequantized`` in
float64, on the GPU when there is one). :class:`Unavailable` says why an engine cannot run here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: Largest max |logits - reference| / max |reference| accepted, by activation dtype. A model
#: is 32 layers deep, so rounding compounds past one layer's bound (tools/harness/reference.py):
#: fp16 models measured 6e-4 at 3 layers, and at Llama-2-7B's 32 layers transformers' own dense
#: fp16 model is about 1e-2 from the float64 one (docs/model.md), so fp16 gets 2e-2; that still
#: fails any wrong operand (wrong zero-points or codes give errors of order 1).
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 3e-2}


class Unavailable(Exception):
    """This engine cannot run here (missing package, a check that fails): the message says
    why."""


@dataclasses.dataclass
class Engine:
    """One implementation of the model.

    Attributes
    ----------
    name : str
        "qcompile", "transformers_float16", "humming", ...
    model : transformers.PreTrainedModel
        On the benchmark's device, eval mode.
    dtype : str
        Its activations' dtype (the tolerance's key).
    detail : str
        How it runs (kernels, fusion, conventions), for the result.
    setup_s : float
        Seconds it took to build (loading, kernels, packing).
    """

    name: str
    model: object
    dtype: str
    detail: str = ""
    setup_s: float = 0.0


def qcompile_model(directory, target: str, dtype: str, batches, db: str | None,
                   lm_head_bits: int | None = None):
    """Our model, with kernels for every decode batch of ``batches`` (and M = 16, the prompt's
    chunks) resolved up front, its lm_head rounded to ``lm_head_bits`` if given; returns
    (model, detail)."""
    import warnings

    from qcompile import hf

    with warnings.catch_warnings():  # the report below says which kernels are untuned
        warnings.simplefilter("ignore")
        model = hf.from_gptq(directory, target=target, dtype=dtype, db=db,
                             batch_sizes=sorted(set(batches)), lm_head_bits=lm_head_bits)
    report = model.qcompile
    detail = (f"{report.specs} kernel specs on {target} ({len(report.untuned)} untuned), "
              f"kernel rows {list(report.kernel_rows)}, q/k/v and gate/up fused"
              + (f", {lm_head_bits}-bit lm_head" if lm_head_bits else ""))
    return model, detail


def prefill_rows(model, rows: int) -> int:
    """Set every QuantLinear's ``prefill_rows`` (calls of that many rows or more take the dense
    path; more than any prompt: the M = 16 kernels over chunks); returns the old value."""
    from qcompile.nn import QuantLinear

    old = None
    for module in model.modules():
        if isinstance(module, QuantLinear):
            old, module.prefill_rows = module.prefill_rows, rows
    return old


def dense_model(directory, dtype, device):
    """transformers' model of the checkpoint with dense weights in ``dtype`` (torch dtype)."""
    from qcompile import hf

    return hf.dequantized(directory, dtype, device=device)


def humming_model(directory, bits: int, group_size: int):
    """The model on humming-kernels' GPTQ layers, fp16, on the GPU, q/k/v and gate/up fused.

    Which zero-point convention humming reads (GPTQ v1 stores z - 1) is settled on the first
    layer by the float64 check, v1 as stored first, then the same for every layer; returns
    (model, detail).

    Raises
    ------
    Unavailable
        humming is not installed, has no CUDA device, or no convention passes the check.
    """
    import torch

    from qcompile import hf
    from tools.harness.product import gptq_zeros, pack_gptq_zeros

    try:
        from humming.layer import HummingLayer
    except ImportError:
        raise Unavailable("humming-kernels is not installed (tools/README.md: peers)") from None
    if not torch.cuda.is_available():
        raise Unavailable("humming-kernels runs on CUDA GPUs only")

    class Linear(torch.nn.Module):
        """A HummingLayer for x [..., K] (humming takes [M, K])."""

        def __init__(self, layer, out_features: int) -> None:
            super().__init__()
            self.layer = layer
            self.out_features = out_features

        def forward(self, x):
            y = self.layer(x.reshape(-1, x.shape[-1]))
            return y.reshape(*x.shape[:-1], self.out_features)

    chosen: dict[str, str] = {}

    def build(layer, convention: str):
        tensors = layer.tensors
        qzeros = tensors.qzeros
        if convention == "v2":  # the zero-points themselves, not z - 1
            qzeros = pack_gptq_zeros(gptq_zeros(qzeros, bits, layer.out_features, "v1"),
                                     bits, "v2")
        module = HummingLayer(shape_n=layer.out_features, shape_k=layer.in_features,
                              torch_dtype=torch.float16, weight_config={
                                  "quant_method": "gptq", "bits": bits,
                                  "group_size": group_size, "sym": False}).cuda()
        module.load_from_tensors({
            "qweight": torch.from_numpy(tensors.qweight).cuda(),
            "qzeros": torch.from_numpy(np.ascontiguousarray(qzeros)).cuda(),
            "scales": torch.from_numpy(tensors.scales).cuda(),
            "g_idx": torch.from_numpy(tensors.g_idx.astype(np.int32)).cuda()})
        module.transform()
        return Linear(module, layer.out_features)

    def make(layer):
        if layer.tensors.zero_convention != "v1" or layer.act_order:
            raise Unavailable("this wrapper hands humming v1 checkpoints without act_order")
        if "convention" in chosen:
            return build(layer, chosen["convention"])
        x = torch.randn(4, layer.in_features, device="cuda", dtype=torch.float16)
        weight = torch.from_numpy(layer.dequantize()).cuda().double()
        expected = x.double() @ weight
        errors = {}
        for convention in ("v1", "v2"):
            try:
                linear = build(layer, convention)
                y = linear(x)
            except Exception as error:  # noqa: BLE001 - humming's own errors, reported
                errors[convention] = f"{type(error).__name__}: {str(error)[:160]}"
                continue
            error = float((y.double() - expected).abs().max() / expected.abs().max())
            if error < 5e-3:
                chosen["convention"] = convention
                return linear
            errors[convention] = f"max relative error {error:.1e}"
        raise Unavailable(f"humming's {bits}-bit GPTQ layer {layer.name} fails the float64 "
                          f"check: {errors}")

    model = hf.with_layers(directory, make, dtype=torch.float16, device="cuda", fuse=True)
    detail = (f"humming-kernels GPTQ {bits}-bit g{group_size} fp16 layers "
              f"({chosen['convention']} zero-points), q/k/v and gate/up fused")
    return model, detail
