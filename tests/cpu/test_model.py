"""A whole model on qcompile kernels (qcompile.hf): the real one-layer GPTQ checkpoints and a
three-layer Llama written by our GPTQ writer give the logits of the same transformers model
with the weights dequantized (float64), and its greedy tokens; fused q/k/v and gate/up equal
the unfused layers; QuantLinear runs under torch.compile; ``qcompile generate``.

Kernels are untuned (``on_missing="untuned"``: the design spaces' seeded decisions) and built
once for the module: models are module fixtures, and layers of one spec share their kernel.
"""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import qcompile.gptq
import targets
from qcompile import hf
from qcompile.cli import main
from qcompile.errors import NoRecordError, UsageError
from qcompile.nn import QuantLinear
from qcompile.testing.kernels import relative_error

DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
#: Through the GEMV kernels: 2/4/8 bits, sym and asym, act_order, static groups, group -1,
#: both packers (three bit/group pairs: three sets of kernels; the kernels read no zero-point
#: convention, and 3-bit codes run through QuantLinear in test_quantlinear.py).
ON_KERNELS = ["autogptq_b2_g128_act_static", "gptqmodel_b4_g32_act_asym_v1",
              "autogptq_b4_g32_sym", "autogptq_b8_gcol_asym", "gptqmodel_b8_gcol_act_sym_v1"]
DB = "sqlite://"  # no record anywhere: every kernel untuned, the same KernelCache throughout
#: Max |logits - reference| / max |reference| per activation kind (float32 x is exact up to
#: float32 sums; the others round x, or the layer outputs, to 8 or 16 bits).
TOLERANCE = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 3e-2, "int8": 3e-2}
PROMPT = [5, 17, 42, 8, 33, 1, 59, 12, 20]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One kernel directory for the module (the autouse fixture's is per test)."""
    supported, reason = targets.get("avx2").host_support()
    if not supported:
        pytest.skip(f"host cannot run avx2 code: {reason}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("kernels")))
        yield


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def error(model, reference, ids: list[int]) -> float:
    return relative_error(logits(model, ids), logits(reference, ids).numpy())


@pytest.mark.parametrize("name", [n for n in FIXTURES if n not in ON_KERNELS])
def test_checkpoints_on_the_dense_path(cache, name):
    """Every other checkpoint, each call on the prefill path (prefill_rows=1: dequantization
    kernels, no GEMV): reading, fusing and loading the model."""
    model = hf.from_gptq(DATA / name, db=DB, prefill_rows=1)
    assert error(model, hf.dequantized(DATA / name), PROMPT) < TOLERANCE["float32"]


@pytest.mark.parametrize("name", ON_KERNELS)
def test_checkpoints_generate_on_kernels(cache, name):
    """Decode on the M = 1 kernels, the prompt on the dense path (prefill_rows=2): logits of
    both, and 16 greedy tokens, as the float64 dequantized model."""
    model = hf.from_gptq(DATA / name, db=DB, prefill_rows=2)
    reference = hf.dequantized(DATA / name)
    assert model.qcompile.kernel_rows == (1,) and model.qcompile.specs == 4  # qkv o gate_up down
    assert error(model, reference, PROMPT[:1]) < TOLERANCE["float32"]
    assert error(model, reference, PROMPT) < TOLERANCE["float32"]
    ids = torch.tensor([PROMPT])
    ours = hf.generate(model, ids, 16, min_new_tokens=16)
    assert torch.equal(ours.tokens, hf.generate(reference, ids, 16, min_new_tokens=16).tokens)


@pytest.mark.parametrize("family", ["Mistral", "Qwen2", "Qwen3"])
def test_other_llama_family_models(cache, tmp_path, family):
    """The other model types of hf.MODEL_TYPES (Qwen2: q/k/v biases; Qwen3: q/k norms after
    the projections), written by write_gptq, on the dense path."""
    config = getattr(transformers, f"{family}Config")(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64)
    torch.manual_seed(1)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    checkpoint = hf.write_gptq(model, tmp_path, bits=4, group_size=32, desc_act=True)
    ours = hf.from_gptq(checkpoint, db=DB, prefill_rows=1)
    assert isinstance(ours.model.layers[1].self_attn.qkv_proj, QuantLinear)
    assert error(ours, hf.dequantized(checkpoint), PROMPT) < TOLERANCE["float32"]


# ---- a three-layer Llama written by qcompile.gptq.save -------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, cache) -> Path:
    """Three layers, hidden 128, GQA (4 query heads, 2 key/value heads), attention biases,
    tied embeddings, 4-bit g32 asymmetric act_order (v1), a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attention_bias=True, tie_word_embeddings=True, initializer_range=0.1,
        bos_token_id=61, eos_token_id=62, pad_token_id=63)
    model = transformers.LlamaForCausalLM(config)
    vocab = {f"t{i}": i for i in range(60)} | {"<unk>": 60, "<s>": 61, "</s>": 62, "<pad>": 63}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>")
    return hf.write_gptq(model, tmp_path_factory.mktemp("tiny-llama"), bits=4, group_size=32,
                         desc_act=True, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def reference(tiny):
    return hf.dequantized(tiny, torch.float64)


@pytest.fixture(scope="module")
def fused(tiny):
    return hf.from_gptq(tiny, db=DB)


def test_tiny_llama_logits_and_32_greedy_tokens(fused, reference):
    """Every way a call runs: 1 row (M = 1), 9 rows (M = 16, padded), 20 rows (chunks of 16),
    130 rows (the dense path); then 32 greedy tokens."""
    assert fused.qcompile.kernel_rows == (1, 16) and len(fused.qcompile.untuned) == 8
    for length in (1, 9, 20, 130):
        ids = (PROMPT * 15)[:length]
        assert error(fused, reference, ids) < TOLERANCE["float32"], length
    ids = torch.tensor([PROMPT])
    ours = hf.generate(fused, ids, 32, min_new_tokens=32)
    theirs = hf.generate(reference, ids, 32, min_new_tokens=32)
    assert ours.tokens.shape == (1, 32) and torch.equal(ours.tokens, theirs.tokens)
    assert ours.prompt_tokens == 9 and ours.prefill_s > 0 and ours.decode_tokens_per_s > 0


def test_fused_layers_equal_the_unfused(tiny, fused):
    """q/k/v and gate/up as one kernel each give the columns of the separate layers."""
    unfused = hf.from_gptq(tiny, db=DB, fuse=False)
    attention, mlp = fused.model.layers[1].self_attn, fused.model.layers[1].mlp
    assert isinstance(attention.qkv_proj, QuantLinear) and isinstance(mlp.gate_up_proj,
                                                                      QuantLinear)
    assert attention.qkv_proj.act_order  # one permutation for the three, gathered once
    plain = unfused.model.layers[1]
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    for rows in (1, 3):
        together = torch.cat([plain.self_attn.q_proj(x[:rows]), plain.self_attn.k_proj(x[:rows]),
                              plain.self_attn.v_proj(x[:rows])], dim=-1)
        assert relative_error(attention.qkv_proj(x[:rows]), together.numpy()) < 1e-6
        together = torch.cat([plain.mlp.gate_proj(x[:rows]), plain.mlp.up_proj(x[:rows])], -1)
        assert relative_error(mlp.gate_up_proj(x[:rows]), together.numpy()) < 1e-6
    for length in (1, 9):
        ids = PROMPT[:length]
        assert relative_error(logits(fused, ids), logits(unfused, ids).double().numpy()) < 1e-6


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_activation_kinds(tiny, reference, kind):
    """bfloat16 activations (float16 runs the same code with another rounding) and int8
    activations, decode on their kernels (the prompt on the dense path, in float32 for int8),
    against the float64 reference."""
    dtype = "float32" if kind == "int8" else kind
    model = hf.from_gptq(tiny, db=DB, dtype=dtype, int8_activations=kind == "int8",
                         prefill_rows=2)
    for length in (1, 9):
        assert error(model, reference, PROMPT[:length]) < TOLERANCE[kind], length


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_lm_head(tiny, reference, bits):
    """lm_head_bits rounds the (here tied) lm_head at load and runs it on a kernel: the logits
    are the reference's with that rounded head, as exact as the layers; the embeddings keep
    their dense weight; ``tune --from-gptq --lm-head-bits`` names the same kernel."""
    model = hf.from_gptq(tiny, db=DB, lm_head_bits=bits)
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.bits == bits
    rounded = copy.deepcopy(reference)
    head = hf.lm_head_layer(reference.lm_head.weight, bits).tensors.dequantize()  # [K, N]
    rounded.lm_head = torch.nn.Linear(128, 64, bias=False, dtype=torch.float64)
    rounded.lm_head.weight.data = torch.from_numpy(head.T).double()
    for length in (1, 9):
        assert error(model, rounded, PROMPT[:length]) < TOLERANCE["float32"], length
    assert error(model, reference, PROMPT) > TOLERANCE["float32"]  # the head is rounded
    assert torch.equal(model.model.embed_tokens.weight.double(),
                       reference.model.embed_tokens.weight)
    assert model.lm_head.spec(m=1) == qcompile.gptq.lm_head_spec(tiny, bits, 1, "float32")
    assert f"--lm-head-bits {bits}" in model.qcompile.command


def test_a_quantized_lm_head_takes_8_or_4_bits(tiny):
    with pytest.raises(UsageError, match=r"lm_head_bits must be one of \(4, 8\); got 3"):
        hf.from_gptq(tiny, db=DB, lm_head_bits=3)


def test_a_missing_record_is_one_error_with_the_one_command(tiny, fused, tmp_path):
    """on_missing="error" refuses before generating, naming the one command; that command's
    specs (tune --from-gptq --fused --batch 1,16) are exactly the kernels the model runs."""
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    with pytest.raises(NoRecordError) as caught:
        hf.from_gptq(tiny, db=url, on_missing="error")
    command = f"qcompile tune --from-gptq {tiny} --target avx2 --batch 1,16 --fused --db {url}"
    assert str(caught.value).startswith("8 of the 8 kernels this model runs have no tuned "
                                        "record on avx2")
    assert str(caught.value).endswith(f"run: {command}")
    layers = qcompile.gptq.fuse_shared_inputs(qcompile.gptq.load(tiny))
    tuned = {spec.name() for m in (1, 16) for spec, _ in qcompile.gptq.distinct_specs(layers, m)}
    assert set(fused.qcompile.untuned) == tuned and fused.qcompile.specs == 8
    assert fused.qcompile.command == command.replace(url, DB)


def test_quantlinear_under_torch_compile(fused):
    """The custom operator traces: the layer compiled whole (fullgraph) matches eager, for a
    decode row and a few prompt rows."""
    layer = fused.model.layers[0].mlp.gate_up_proj
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(2))
    for rows in (1, 4):
        assert torch.equal(compiled(x[:rows]), layer(x[:rows]))


def test_a_decode_step_traces_without_graph_breaks(fused):
    """A whole decode step of the fused model (embeddings, three layers of pre-hooks, Columns,
    custom-operator calls and attention over a static KV cache, lm_head) is one graph:
    fullgraph=True raises at the first graph break. It gives eager's logits."""
    steps = {}
    for name in ("eager", "compiled"):
        cache = transformers.StaticCache(config=fused.config, max_cache_len=32)
        with torch.no_grad():
            fused(torch.tensor([PROMPT[:4]]), cache=cache, use_cache=True)  # the prompt
            step = fused if name == "eager" else torch.compile(fused, fullgraph=True,
                                                               backend="aot_eager")
            steps[name] = step(torch.tensor([[PROMPT[4]]]), cache=cache, use_cache=True,
                               position_ids=torch.tensor([[4]]),
                               cache_position=torch.tensor([4])).logits
    difference = (steps["compiled"] - steps["eager"]).abs()
    assert difference.max() <= 1e-5 * steps["eager"].abs().max(), difference.max()


def test_generate_command(tiny, reference, capsys):
    """``qcompile generate --prompt TEXT``: the reference's greedy tokens, and the timings."""
    code = main(["generate", "--from-gptq", str(tiny), "--prompt", "t5 t17 t42",
                 "--max-new-tokens", "8", "--target", "avx2", "--db", DB])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    expected = hf.generate(reference, torch.tensor([[5, 17, 42]]), 8).tokens[0].tolist()
    assert lines["prompt"] == "3 tokens: 5 17 42"
    assert lines["generated"] == f"{len(expected)} tokens: {' '.join(map(str, expected))}"
    assert lines["text"] == " ".join(f"t{t}" for t in expected if t < 60)
    assert lines["prefill"].startswith("3 tokens in ") and lines["prefill"].endswith("tokens/s")
    assert lines["decode"].endswith("tokens/s")
    assert lines["kernels"].startswith("8 specs on avx2, 0 tuned, 8 untuned; tune them once "
                                       f"with: qcompile tune --from-gptq {tiny}")
    assert np.isfinite(float(lines["decode"].split("= ")[1].split()[0]))
