"""Layers that share their input, concatenated along N (formats.gptq.concatenate,
gptq.fuse_shared_inputs); the GPTQ writer (gptq.save) read back by the loader; act_order's
order in the round-to-nearest quantizer. numpy only: no kernel is built."""

from pathlib import Path

import numpy as np
import pytest

import qcompile.gptq
from qcompile.errors import FormatError
from qcompile.formats.gptq import concatenate
from qcompile.quantize.rtn import quantize_rtn

DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
ATTENTION = "model.layers.0.self_attn"


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("convention", ["v1", "v2"])
def test_concatenate_is_the_columns_side_by_side(bits, convention):
    rng = np.random.default_rng(bits)
    order = rng.permutation(128)  # act_order: the parts share their input's order
    parts = [quantize_rtn(rng.standard_normal((128, n)).astype(np.float32), bits, 32,
                          zero_convention=convention, order=order) for n in (128, 32, 32)]
    fused = concatenate(parts)
    assert fused.out_features == 192 and fused.zero_convention == convention
    assert np.array_equal(fused.dequantize(),
                          np.concatenate([p.dequantize() for p in parts], axis=1))
    assert np.array_equal(fused.g_idx, parts[0].g_idx)


def test_concatenate_refuses_what_does_not_fuse():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((128, 64)).astype(np.float32)
    four = quantize_rtn(weight, 4, 32)
    with pytest.raises(FormatError, match="part 1 has bits=8 but part 0 has bits=4"):
        concatenate([four, quantize_rtn(weight, 8, 32)])
    with pytest.raises(FormatError, match="part 1 has group_size=64"):
        concatenate([four, quantize_rtn(weight, 4, 64)])
    with pytest.raises(FormatError, match=r"part 1's g_idx differs from part 0's in \d+ of 128"):
        concatenate([four, quantize_rtn(weight, 4, 32, order=rng.permutation(128))])


@pytest.mark.parametrize("name", FIXTURES)
def test_fuse_shared_inputs_on_the_real_checkpoints(name):
    """q/k/v and gate/up of every packer's checkpoint fuse (GPTQ gives layers of one input one
    act_order), and the fused weight is the parts' weights side by side, bias included."""
    layers = qcompile.gptq.load(DATA / name)
    fused = qcompile.gptq.fuse_shared_inputs(layers)
    assert sorted(fused) == ["model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_up_proj",
                             f"{ATTENTION}.o_proj", f"{ATTENTION}.qkv_proj"]
    qkv = fused[f"{ATTENTION}.qkv_proj"]
    parts = [f"{ATTENTION}.{p}_proj" for p in "qkv"]
    assert qkv.parts == tuple((p, 128) for p in parts)
    assert np.array_equal(qkv.dequantize(),
                          np.concatenate([layers[p].dequantize() for p in parts], axis=1))
    assert np.array_equal(qkv.bias, np.concatenate([layers[p].bias for p in parts]))
    assert qkv.act_order == layers[parts[0]].act_order
    assert fused["model.layers.0.mlp.down_proj"] is layers["model.layers.0.mlp.down_proj"]


def test_a_group_that_differs_stays_apart(tmp_path):
    """A ``dynamic`` override giving k_proj 8 bits leaves q/k/v unfused; gate/up still fuse."""
    rng = np.random.default_rng(1)
    weights = {f"{ATTENTION}.{p}_proj": rng.standard_normal((128, 128)).astype(np.float32)
               for p in "qkv"}
    weights.update({f"model.layers.0.mlp.{p}_proj": rng.standard_normal((128, 256))
                    .astype(np.float32) for p in ("gate", "up")})
    config = qcompile.gptq.QuantizeConfig(bits=4, group_size=32, dynamic={
        r".*\.k_proj": {"bits": 8}})
    tensors = {name: quantize_rtn(w, 8 if "k_proj" in name else 4, 32)
               for name, w in weights.items()}
    qcompile.gptq.save(tmp_path, tensors, config)
    fused = qcompile.gptq.fuse_shared_inputs(qcompile.gptq.load(tmp_path))
    assert sorted(fused) == sorted([*weights.keys() - {"model.layers.0.mlp.gate_proj",
                                                       "model.layers.0.mlp.up_proj"},
                                    "model.layers.0.mlp.gate_up_proj"])
    assert fused[f"{ATTENTION}.k_proj"].bits == 8


@pytest.mark.parametrize("checkpoint_format, convention", [("gptq", "v1"), ("gptq_v2", "v2")])
def test_save_then_load(tmp_path, checkpoint_format, convention):
    """The writer's checkpoint reads back the same weights, g_idx, config and extra tensors;
    zero-points are repacked in the config's convention."""
    import torch

    rng = np.random.default_rng(2)
    weight = rng.standard_normal((256, 128)).astype(np.float32)
    layer = quantize_rtn(weight, 3, 32, order=rng.permutation(256))  # v1, act_order
    config = qcompile.gptq.QuantizeConfig(bits=3, group_size=32, desc_act=True, sym=False,
                                          checkpoint_format=checkpoint_format)
    bias = torch.randn(128)
    qcompile.gptq.save(tmp_path, {"model.layers.0.mlp.down_proj": layer}, config,
                       tensors={"model.layers.0.mlp.down_proj.bias": bias,
                                "model.norm.weight": torch.ones(128)},
                       model_config={"model_type": "llama"})
    read = qcompile.gptq.load(tmp_path)["model.layers.0.mlp.down_proj"]
    assert read.config.zero_convention == convention and read.act_order
    assert np.array_equal(read.dequantize(), layer.dequantize())
    assert np.array_equal(read.tensors.g_idx, layer.g_idx)
    assert np.array_equal(read.bias, bias.numpy())
    model_json = (tmp_path / "config.json").read_text()
    assert '"model_type": "llama"' in model_json and '"desc_act": true' in model_json
    with pytest.raises(FormatError, match="down_proj is 3-bit with group_size=32 but the config "
                                          "says 4-bit, group_size=32"):
        qcompile.gptq.save(tmp_path, {"model.layers.0.mlp.down_proj": layer},
                           qcompile.gptq.QuantizeConfig(bits=4, group_size=32))


def test_rtn_order_groups_rows_along_the_order():
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 16)).astype(np.float32)
    order = rng.permutation(64)
    layer = quantize_rtn(weight, 4, 16, order=order)
    assert np.array_equal(layer.g_idx[order], np.arange(64) // 16)
    assert np.array_equal(layer.dequantize()[order], quantize_rtn(weight[order], 4, 16)
                          .dequantize())
    with pytest.raises(FormatError, match="order must be a permutation of the K=64 rows"):
        quantize_rtn(weight, 4, 16, order=np.zeros(64, dtype=int))
