"""Llama-family layer sets as ``qcompile generate`` runs them: q/k/v fused into one layer and
gate/up into another, so four distinct shapes per model, each called once per decoder layer."""

from __future__ import annotations

#: (hidden size, q/k/v output features, intermediate size, decoder layers) by model.
MODELS = {
    "llama2-7b": (4096, 12288, 11008, 32),
    "llama3-8b": (4096, 6144, 14336, 32),
    "llama2-13b": (5120, 15360, 13824, 40),
    "llama2-70b": (8192, 10240, 28672, 80),
}


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """(K, N) of the model's four fused layers: q/k/v, o, gate/up, down."""
    hidden, qkv, intermediate, _ = MODELS[model]
    return [(hidden, qkv), (hidden, hidden), (hidden, 2 * intermediate), (intermediate, hidden)]


def decoder_layers(model: str) -> int:
    """How many times a token calls each of the model's layer shapes."""
    return MODELS[model][3]
