"""llama.cpp's llama-bench as the CPU model benchmark's peer (tools/harness/llama_bench.py): a
GGUF of a transformers Llama written with llama.cpp's own writer, read back, quantized by
llama-quantize and run by llama-bench.

The tools are built from the llama-cpp-python sdist (~7 min on 2 cores, once per machine), which
does not fit CI: those tests run only when the build is in the cache
(``<QCOMPILE_LLAMA_CPP_DIR or ~/.cache/qcompile/llama.cpp/<version>>/tools``) or when
``QCOMPILE_LLAMA_CPP=1`` asks for it, as the GEMV peer's tests do. The rotary row order needs no
build and always runs.
"""

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
llama_cpp = importlib.import_module("tools.harness.llama_cpp")
llama_bench = importlib.import_module("tools.harness.llama_bench")

#: The build cache as the user has it (conftest points XDG_CACHE_HOME at tmp_path later).
CACHE = llama_cpp.cache_dir()


def test_rotary_rows_pair_each_heads_halves():
    """transformers rotates dimension i of a head with i + d/2; llama.cpp with its neighbour:
    row 2i of a head in the GGUF is transformers' row i, row 2i + 1 is its row i + d/2."""
    heads, head_dim, k = 3, 8, 5
    weight = np.arange(heads * head_dim * k, dtype=np.float32).reshape(heads * head_dim, k)
    out = llama_bench.rotary_rows(weight, heads)
    for head in range(heads):
        for i in range(head_dim // 2):
            np.testing.assert_array_equal(out[head * head_dim + 2 * i],
                                          weight[head * head_dim + i])
            np.testing.assert_array_equal(out[head * head_dim + 2 * i + 1],
                                          weight[head * head_dim + head_dim // 2 + i])


@pytest.fixture(scope="module")
def tools():
    before = os.environ.get("QCOMPILE_LLAMA_CPP_DIR")
    os.environ["QCOMPILE_LLAMA_CPP_DIR"] = str(CACHE)
    try:
        if (not (llama_bench.tools_dir() / "manifest.json").is_file()
                and os.environ.get("QCOMPILE_LLAMA_CPP") != "1"):
            pytest.skip(f"llama.cpp's tools are not built in {llama_bench.tools_dir()}; "
                        "QCOMPILE_LLAMA_CPP=1 builds them (minutes, once)")
        yield llama_bench.build()
    finally:
        if before is None:
            os.environ.pop("QCOMPILE_LLAMA_CPP_DIR", None)
        else:
            os.environ["QCOMPILE_LLAMA_CPP_DIR"] = before


@pytest.fixture(scope="module")
def tiny_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_gguf_holds_the_models_weights(tools, tiny_model, tmp_path):
    path = llama_bench.write_gguf(tiny_model, tmp_path / "tiny-f16.gguf")
    reader = llama_bench._gguf().GGUFReader(str(path))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(tensors) == 3 + 2 * 9
    state = {k: v.detach().numpy() for k, v in tiny_model.state_dict().items()}
    np.testing.assert_array_equal(tensors["blk.1.ffn_down.weight"],
                                  state["model.layers.1.mlp.down_proj.weight"].astype(np.float16))
    np.testing.assert_array_equal(
        tensors["blk.0.attn_k.weight"],
        llama_bench.rotary_rows(state["model.layers.0.self_attn.k_proj.weight"], 2)
        .astype(np.float16))
    np.testing.assert_array_equal(tensors["output_norm.weight"], state["model.norm.weight"])


def test_llama_bench_times_a_quantized_gguf(tools, tiny_model, tmp_path):
    source = llama_bench.write_gguf(tiny_model, tmp_path / "tiny-f16.gguf")
    quantized = llama_bench.quantize(tools, source, tmp_path / "tiny-q4_0.gguf", "Q4_0")
    assert quantized.stat().st_size < source.stat().st_size / 2
    figures = llama_bench.run_bench(tools, quantized, threads=1, prompt=32, tokens=8,
                                    repetitions=1)
    assert figures["decode_tokens_per_s"] > 0 and figures["prefill_tokens_per_s"] > 0


def test_bad_inputs_are_one_line(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        llama_bench.quantize(Path("/nonexistent"), tmp_path / "a.gguf", tmp_path / "b.gguf",
                             "Q5_X")
