"""The random GPTQ layers of the model benchmarks (tools/harness/random_gptq.py): weights of
mean zero and the standard deviation asked for, so a 32-layer model stays in fp16's range."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tools.harness.random_gptq import random_layer  # noqa: E402


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_random_layer_weights_have_mean_zero_and_the_asked_spread(bits):
    generator = torch.Generator().manual_seed(bits)
    layer = random_layer(4096, 512, bits, 128, generator, "cpu", weight_std=0.02)
    weight = layer.dequantize().astype(np.float64)
    std = weight.std()
    assert abs(std / 0.02 - 1) < 0.1, f"std {std:.4g}, asked 0.02"
    # A common bias across columns is what grew the residual stream of a 32-layer model past
    # fp16 (every output gets sum(x) times it): the mean must be noise, not a shift. Noise
    # alone: std / sqrt(K N) ~ 1.4e-5 relative; the old zero-points gave -0.11 std.
    assert abs(weight.mean()) < 0.01 * std, f"mean {weight.mean():.3g} against std {std:.3g}"
    column_sums = weight.sum(axis=0)
    assert abs(column_sums.mean()) < 0.2 * column_sums.std()
