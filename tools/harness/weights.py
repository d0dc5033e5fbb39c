"""The benchmark's weights: made once per kernel configuration and shared by every M and
activation dtype of a shape.

At LLM shapes, making a row's weights was most of its cost: random codes, a dequantization to a
float64 [K, N] matrix (1.9 GB at 8192x28672) for the reference, a float32 copy for the dense
peers, and our layout's packing. None of it depends on M, so :class:`WeightCache` keeps them for
the shape being benchmarked; a row then multiplies its own x by the cached float64 weight (on the
GPU when the benchmark runs there) and reuses the packed operands of its kernel's layout.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np


def configuration(spec) -> tuple:
    """What a spec's weights depend on: every field but the rows and the activations."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
              if f.name not in ("m", "dtype", "int8_activations")}
    return type(spec).__name__, tuple(sorted(fields.items()))


class Weights:
    """One configuration's weights.

    ``tensors``: the family's checkpoint tensors (numpy); ``dense64``: their dequantized weight,
    float64 [K, N] (numpy, and a CUDA copy when ``device`` is ``"cuda"``).
    """

    def __init__(self, tensors: dict, dense64: np.ndarray, device: str) -> None:
        self.tensors = tensors
        self.dense64 = dense64
        self.device = device
        self._dense_gpu = None
        self._float32 = None
        self._prepared: dict[str, object] = {}
        if device == "cuda":
            import torch

            self._dense_gpu = torch.from_numpy(dense64).cuda()

    def float32(self) -> np.ndarray:
        """The dequantized weight, float32 [K, N]: what the dense peers multiply."""
        if self._float32 is None:
            self._float32 = np.ascontiguousarray(self.dense64, dtype=np.float32)
        return self._float32

    def product(self, x: np.ndarray) -> np.ndarray:
        """float64 [M, N] of ``x`` [M, K] (any float dtype) times the weight."""
        x = np.asarray(x, dtype=np.float64)
        if self._dense_gpu is None:
            return x @ self.dense64
        import torch

        return (torch.from_numpy(x).cuda() @ self._dense_gpu).cpu().numpy()

    def prepared(self, kernel):
        """``kernel.prepare`` of these tensors, once per weight layout and activation kind
        (which decide the operands; the rows M do not)."""
        spec = kernel.spec
        key = json.dumps([kernel.layout, getattr(spec, "int8_activations", False), spec.dtype,
                          kernel.device], sort_keys=True, default=str)
        if key not in self._prepared:
            self._prepared[key] = kernel.prepare(**self.tensors)
        return self._prepared[key]


class WeightCache:
    """:class:`Weights` by configuration, for one shape at a time (a new K x N frees the last
    one's: at 8192x28672 a configuration holds several GB)."""

    def __init__(self, device: str, seed: int = 0) -> None:
        self.device = device
        self.seed = seed
        self._shape: tuple[int, int] | None = None
        self._items: dict[tuple, Weights] = {}

    def get(self, spec) -> Weights:
        from qcompile.kernels import family_of

        if (spec.k, spec.n) != self._shape:
            self._items.clear()
            self._shape = (spec.k, spec.n)
        key = configuration(spec)
        if key not in self._items:
            family = family_of(spec)
            rng = np.random.default_rng([self.seed, spec.k, spec.n])
            tensors = family.example_tensors(spec, rng)
            dense = np.asarray(family.reference_weight(spec, **tensors), dtype=np.float64)
            self._items[key] = Weights(tensors, dense, self.device)
        return self._items[key]
