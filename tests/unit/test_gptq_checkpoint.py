"""Reading real GPTQ checkpoints (tests/data/gptq, written by GPTQModel 7.7.0 and AutoGPTQ 0.7.1
with tools/make_gptq_fixtures.py) and refusing malformed ones with the tensor, rule and numbers."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import qcompile.gptq
from qcompile.errors import FormatError
from qcompile.gptq import QuantizeConfig, distinct_specs, layers_from_state_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
DOWN = "model.layers.0.mlp.down_proj"
LAYERS = {**{f"model.layers.0.self_attn.{p}_proj": (128, 128) for p in "qkvo"},
          "model.layers.0.mlp.gate_proj": (128, 256), "model.layers.0.mlp.up_proj": (128, 256),
          DOWN: (256, 128)}


def packer_settings(name):
    return json.loads((DATA / name / "packer.json").read_text())


def test_fixtures_cover_the_matrix():
    settings = [packer_settings(name) for name in FIXTURES]
    packers = {s["packer"] for s in settings}
    assert packers == {"gptqmodel", "auto-gptq"}
    assert {s["settings"]["bits"] for s in settings} == {2, 3, 4, 8}
    assert {s["settings"]["group_size"] for s in settings} >= {-1, 32, 128}
    assert {s["settings"].get("format", "gptq") for s in settings} == {"gptq", "gptq_v2"}
    assert any(s["settings"].get("static_groups") for s in settings)
    assert {s["settings"]["desc_act"] for s in settings} == {True, False}
    assert {s["settings"]["sym"] for s in settings} == {True, False}


@pytest.mark.parametrize("name", FIXTURES)
def test_real_checkpoint_loads_and_matches_the_packer(name):
    settings = packer_settings(name)["settings"]
    layers = qcompile.gptq.load(DATA / name)
    assert {n: (t.in_features, t.out_features) for n, t in layers.items()} == LAYERS
    outputs = load_file(str(DATA / name / "packer_outputs.safetensors"))
    for layer_name, layer in layers.items():
        assert layer.bits == settings["bits"] and layer.group_size == settings["group_size"]
        assert layer.config.zero_convention == ("v2" if settings.get("format") == "gptq_v2"
                                                else "v1")
        assert layer.bias is not None and layer.bias.shape == (layer.out_features,)
        scrambled = settings["desc_act"] and not settings.get("static_groups") \
            and settings["group_size"] not in (-1, layer.in_features)  # else one group
        assert layer.act_order == scrambled
        # Our reading of codes, zero-points (v1/v2) and g_idx reproduces the packer's own
        # forward (which computes in fp16: hence the tolerance).
        x = outputs[f"{layer_name}.x"].float()
        ref = layer.reference(x)
        theirs = outputs[f"{layer_name}.y"].double().numpy()
        assert np.abs(ref - theirs).max() / np.abs(theirs).max() < 5e-3, layer_name


def test_config_json_quantization_config_and_missing_format_is_v1(tmp_path):
    src = DATA / "autogptq_b4_g32_sym"
    shutil.copy(src / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((src / "quantize_config.json").read_text())
    assert "checkpoint_format" not in config and "format" not in config  # AutoGPTQ writes none
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
    layers = qcompile.gptq.load(tmp_path)
    assert layers[DOWN].config.zero_convention == "v1"
    assert layers[DOWN].config.source == "config.json quantization_config"


def test_distinct_specs_share_shapes():
    layers = qcompile.gptq.load(DATA / "gptqmodel_b4_g32_act_asym_v1")
    specs = distinct_specs(layers, m=8)
    assert [(s.k, s.n, s.m) for s, _ in specs] == [(256, 128, 8), (128, 256, 8), (128, 128, 8)]
    assert sum(len(names) for _, names in specs) == 7
    assert not any(s.act_order for s, _ in specs)  # the gather is a separate step


def test_state_dict_and_dynamic_exclusion():
    name = "gptqmodel_b4_g128_sym_v2"
    state = load_file(str(DATA / name / "model.safetensors"))
    data = json.loads((DATA / name / "quantize_config.json").read_text())
    data["dynamic"] = {r"-:.*mlp\.up_proj": {}, r"+:.*self_attn\..*": {"group_size": 128}}
    layers = layers_from_state_dict(state, QuantizeConfig.from_dict(data, "test"))
    assert "model.layers.0.mlp.up_proj" not in layers and len(layers) == 6
    assert "dynamic" in layers["model.layers.0.self_attn.q_proj"].config.source


# ---- malformed checkpoints ------------------------------------------------------------------


def rewrite(tmp_path, edit=None, config_edit=None, name="gptqmodel_b4_g32_act_asym_v1"):
    state = load_file(str(DATA / name / "model.safetensors"))
    if edit:
        edit(state)
    save_file(state, str(tmp_path / "model.safetensors"))
    config = json.loads((DATA / name / "quantize_config.json").read_text())
    if config_edit:
        config_edit(config)
    (tmp_path / "quantize_config.json").write_text(json.dumps(config))
    return tmp_path


def test_missing_tensor(tmp_path):
    path = rewrite(tmp_path, lambda s: s.pop(f"{DOWN}.qzeros"))
    with pytest.raises(FormatError, match=rf"{DOWN}\.qzeros is missing from the checkpoint"):
        qcompile.gptq.load(path)


def test_wrong_shape(tmp_path):
    path = rewrite(tmp_path, lambda s: s.update({f"{DOWN}.scales": s[f"{DOWN}.scales"][:7]}))
    with pytest.raises(FormatError, match=rf"{DOWN}\.scales must have shape \[G, N\]=\(8, 128\) "
                                          r"for K=256, group_size=32; got \(7, 128\)"):
        qcompile.gptq.load(path)


def test_wrong_dtype(tmp_path):
    path = rewrite(tmp_path, lambda s: s.update(
        {f"{DOWN}.scales": s[f"{DOWN}.scales"].to(torch.bfloat16)}))
    with pytest.raises(FormatError, match=rf"{DOWN}\.scales must be float16; got bfloat16"):
        qcompile.gptq.load(path)
    path = rewrite(tmp_path, lambda s: s.update(
        {f"{DOWN}.qweight": s[f"{DOWN}.qweight"].to(torch.int64)}))
    with pytest.raises(FormatError, match=rf"{DOWN}\.qweight must be int32; got int64"):
        qcompile.gptq.load(path)


def test_unsupported_bits(tmp_path):
    path = rewrite(tmp_path, config_edit=lambda c: c.update(bits=5))
    with pytest.raises(FormatError, match=r"quantize_config.json: bits=5 is not supported; "
                                          r"supported bit widths: \(2, 3, 4, 8\)"):
        qcompile.gptq.load(path)


def test_group_size_not_dividing_k(tmp_path):
    path = rewrite(tmp_path, config_edit=lambda c: c.update(group_size=96))
    with pytest.raises(FormatError, match=r"model\.layers\.0\.mlp\.down_proj\.qweight \(32, 128\) "
                                          r"holds K=256 rows of 4-bit codes: K=256 must be "
                                          r"divisible by group_size=96"):
        qcompile.gptq.load(path)


def test_g_idx_inconsistent_with_group_size(tmp_path):
    def break_g_idx(state):
        g_idx = state[f"{DOWN}.g_idx"].clone()
        g_idx[g_idx == 0] = 1  # group 0 loses its rows to group 1
        state[f"{DOWN}.g_idx"] = g_idx

    path = rewrite(tmp_path, break_g_idx)
    with pytest.raises(FormatError, match=rf"{DOWN}\.g_idx is inconsistent with group_size=32: "
                                          r"group 0 has 0 rows"):
        qcompile.gptq.load(path)


def test_g_idx_out_of_range(tmp_path):
    path = rewrite(tmp_path, lambda s: s[f"{DOWN}.g_idx"].__setitem__(0, 99))
    with pytest.raises(FormatError, match=rf"{DOWN}\.g_idx .* lie in \[0, "):
        qcompile.gptq.load(path)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(checkpoint_format="marlin", format="marlin"),
     "checkpoint_format='marlin' is not supported"),
    (lambda c: c.update(quant_method="awq"), "quant_method='awq' is not a GPTQ checkpoint"),
    (lambda c: c.update(pack_dtype="int16"), "pack_dtype='int16' is not supported"),
    (lambda c: c.pop("bits"), "the quantization config has no 'bits'"),
    (lambda c: c.update(group_size="128"), "group_size must be an integer; got '128'"),
])
def test_bad_configs(tmp_path, edit, message):
    with pytest.raises(FormatError, match=message):
        qcompile.gptq.load(rewrite(tmp_path, config_edit=edit))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FormatError, match="no checkpoint at"):
        qcompile.gptq.load(tmp_path / "nowhere")
    with pytest.raises(FormatError, match="holds no \\*.safetensors file"):
        qcompile.gptq.load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    (tmp_path / "quantize_config.json").write_text('{"bits": 4, "group_size": 128}')
    with pytest.raises(FormatError, match="is not a readable safetensors file"):
        qcompile.gptq.load(tmp_path)
