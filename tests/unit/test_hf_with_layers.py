"""``qcompile.hf.with_layers``: the checkpoint's model with layers another library makes (the
benchmarks' peers), fused or not, gives the dense float64 reference's logits; no kernel is
built."""

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from qcompile import hf  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
#: act_order with a bias, and asymmetric v2 3-bit: the fused parts' columns and bias in order.
CHECKPOINTS = ["gptqmodel_b4_g32_act_asym_v1", "gptqmodel_b3_g128_act_asym_v2"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_fused_layers_from_another_maker_give_the_reference_logits(name):
    made = []

    def make(layer):
        made.append(layer.name)
        return hf.dense_linear(layer, torch.float64)

    model = hf.with_layers(DATA / name, make, dtype=torch.float64, fuse=True)
    assert sorted(made) == ["model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_up_proj",
                            "model.layers.0.self_attn.o_proj",
                            "model.layers.0.self_attn.qkv_proj"]
    reference = hf.dequantized(DATA / name, torch.float64)
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    with torch.no_grad():
        ours, theirs = model(ids).logits, reference(ids).logits
    assert np.allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-12 * theirs.abs().max())
