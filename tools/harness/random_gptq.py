"""A random GPTQ checkpoint of a Llama-family model, written fast for the model benchmarks.

A 7B model quantized by rounding to nearest (``qcompile.hf.write_gptq``) would first need a
27 GB float model and minutes of numpy per layer; the speed of a kernel does not depend on the
values it reads, so the codes, scales and zero-points are drawn directly instead (with torch's
generator, on the GPU when one is given) and stored by the package's own writer,
``qcompile.gptq.save``, in the real GPTQ format (v1 zero-points, ``desc_act=False``). Their
scale gives every dense weight a standard deviation of about ``weight_std`` (a transformers
model's initialisation), so activations stay in fp16's range through every layer.

    directory = write(Path("/tmp/llama"), llama_config("llama2-7b"), bits=4, group_size=128,
                      device="cuda")
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

#: Model shapes (transformers ``LlamaConfig`` arguments): Llama-2-7B's, TinyLlama-1.1B's, and a
#: tiny one for smoke runs. ``max_position_embeddings`` is set by the caller.
MODELS = {
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      rms_norm_eps=1e-5),
    "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4),
    "tiny": dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}

#: What a written checkpoint records of its making (``random_gptq.json``): a directory is
#: reused only when this matches.
MARKER = "random_gptq.json"


def llama_config(model: str, *, layers: int | None = None, positions: int = 4096):
    """The transformers LlamaConfig of ``MODELS[model]``, with ``layers`` decoder layers when
    given (a smoke run's shorter model of the same layer shapes)."""
    import transformers

    arguments = dict(MODELS[model], max_position_embeddings=positions)
    if layers is not None:
        arguments["num_hidden_layers"] = layers
    return transformers.LlamaConfig(**arguments)


def write(directory: str | Path, config, *, bits: int = 4, group_size: int = 128,
          seed: int = 0, device: str = "cpu", weight_std: float = 0.02) -> Path:
    """Write a random GPTQ checkpoint of ``config``'s model into ``directory``, or reuse the
    one there when it was written with the same settings.

    Every ``nn.Linear`` of the decoder layers is quantized (q/k/v/o, gate/up/down): qweight
    int32 [K*bits/32, N] of uniform random codes, scales float16 [G, N] and zero-points near
    the middle of the code range (v1: stored z - 1), g_idx ``k // group_size``. The other
    tensors, float16: norms of ones, embeddings and lm_head normal with ``weight_std``.

    Parameters
    ----------
    directory : str or Path
    config : transformers.PretrainedConfig
        A Llama-family config (no linear biases).
    bits, group_size : int
        2, 3, 4 or 8; a divisor of every layer's K.
    seed : int
    device : str
        Where the random numbers are drawn ("cuda" is much faster for a 7B model).
    weight_std : float
        The standard deviation of the dequantized weights and of the embeddings.

    Returns
    -------
    Path
        The checkpoint directory (``model.safetensors``, ``config.json``,
        ``quantize_config.json``, and the marker ``random_gptq.json``).
    """
    import torch
    import transformers

    from qcompile import gptq

    directory = Path(directory)
    settings = {"config": config.to_dict(), "bits": bits, "group_size": group_size,
                "seed": seed, "weight_std": weight_std, "version": 2}
    marker = directory / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == json.loads(json.dumps(settings)):
        return directory
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    generator = torch.Generator(device).manual_seed(seed)
    layers, quantized = {}, set()
    for name, module in skeleton.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            if module.bias is not None:
                raise ValueError(f"{name} has a bias; this writer makes bias-free layers")
            layers[name] = random_layer(module.in_features, module.out_features, bits,
                                        group_size, generator, device, weight_std)
            quantized.add(name)
    tensors = {}
    for key, meta in skeleton.state_dict().items():
        if key.rpartition(".")[0] in quantized:
            continue
        if "norm" in key:
            tensors[key] = torch.ones(meta.shape, dtype=torch.float16)
        else:
            tensors[key] = (torch.randn(meta.shape, generator=generator, device=device)
                            * weight_std).to(torch.float16).cpu()
    quantize = gptq.QuantizeConfig(bits=bits, group_size=group_size, desc_act=False, sym=False,
                                   static_groups=False, checkpoint_format="gptq",
                                   source="tools/harness/random_gptq.py")
    if marker.is_file():
        marker.unlink()  # a partial rewrite must not look like the old checkpoint
    gptq.save(directory, layers, quantize, tensors=tensors, model_config=config.to_dict())
    marker.write_text(json.dumps(settings, indent=1) + "\n")
    return directory


def random_layer(k: int, n: int, bits: int, group_size: int, generator, device: str,
                 weight_std: float):
    """GPTQ tensors of one random K x N layer (``qcompile.gptq.GptqTensors``, numpy).

    qweight: every bit uniform, so every code is uniform in [0, 2^bits), of mean
    (2^bits - 1) / 2. Zero-points z: 2^(bits-1) - 1 or 2^(bits-1), equally likely, so the codes
    minus z have mean 0 (a zero-point off the codes' mean gives every column of every layer
    the same bias: x's sum, scaled, added to every output, which grows by about ``scale * K / 2``
    per layer and overflowed fp16 within 32 layers) and a standard deviation near
    ``sqrt((4^bits - 1) / 12 + 1 / 4)``; scales: ``weight_std`` over that, times U(0.8, 1.2).
    """
    import torch

    from qcompile.gptq import GptqTensors
    from tools.harness.product import pack_gptq_zeros

    groups = k // group_size if group_size != -1 else 1
    rows = k * bits // 32
    words = torch.randint(0, 256, (rows, n, 4), dtype=torch.uint8, generator=generator,
                          device=device)
    qweight = words.view(torch.int32).reshape(rows, n).cpu().numpy()
    middle = 1 << (bits - 1)
    zeros = middle - 1 + torch.randint(0, 2, (groups, n), generator=generator, device=device)
    spread = math.sqrt((4 ** bits - 1) / 12 + 1 / 4)  # codes' variance plus the zeros'
    factor = 0.8 + 0.4 * torch.rand((groups, n), generator=generator, device=device)
    scales = (factor * (weight_std / spread)).to(torch.float16).cpu().numpy()
    qzeros = pack_gptq_zeros(zeros.cpu().numpy().astype(np.int64), bits, "v1")
    return GptqTensors.from_tensors(qweight=qweight, scales=scales, qzeros=qzeros, bits=bits,
                                    group_size=group_size, zero_convention="v1")
