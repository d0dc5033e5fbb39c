"""QuantLinear and a whole model on the GPU (marked `cuda`: skipped without one): a CUDA target
puts the weights on the GPU, fp16/bf16 x takes the tensor-core kernels, float32 x the float
ones; every way a call runs (one kernel row count, chunks of 16, the dense prefill path) against
the float64 product; the three-layer Llama of tests/cpu/test_model.py in fp16 on the GPU against
its float64 dequantized model. Kernels are untuned and shared by the module (one cache
directory), and every row count runs the M = 16 kernel (``row_plan([16])``), so few are built.
Run with ``python -m pytest -m cuda tests/cuda/test_model_cuda.py``."""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import qcompile.gptq
from qcompile import hf
from qcompile.nn import QuantLinear, kernel_cache, row_plan
from qcompile.testing.kernels import relative_error

pytestmark = pytest.mark.cuda
DATA = Path(__file__).resolve().parents[1] / "data" / "gptq"
DB = "sqlite://"
#: max |y - ref| / max |ref|: the kernels' bounds (tests/cuda/test_uniform_mma_f16_cuda.py);
#: float32 x runs the float kernels.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("kernels")))
        yield


@pytest.fixture(scope="module")
def layer():
    """A real checkpoint's layer: GPTQModel 4-bit g32 asymmetric act_order (v1) with a bias,
    K=256, N=128."""
    layers = qcompile.gptq.load(DATA / "gptqmodel_b4_g32_act_asym_v1")
    return layers["model.layers.0.mlp.down_proj"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_quantlinear_on_the_gpu(cache, layer, dtype):
    """x on the GPU gives y on the GPU in x's dtype; 1 and 9 rows on the M = 16 kernel, 40
    rows in chunks of 16, 130 rows on the dense path; x on the CPU is one clear error."""
    module = QuantLinear(layer, kernel_cache("cuda", DB, "untuned"))
    assert module.device.type == "cuda" and (module.in_features, module.out_features) == (256, 128)
    module.plan_rows(row_plan([16]), dtype)
    torch_dtype = getattr(torch, dtype)
    weight = layer.tensors.dequantize().astype(np.float64)
    bias = layer.bias.astype(np.float64)
    for rows in (1, 9, 40, 130):
        x = (torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)) / 4).to(
            torch_dtype)
        y = module(x.cuda())
        assert y.device.type == "cuda" and y.dtype == torch_dtype and y.shape == (rows, 128)
        reference = x.double().numpy() @ weight + bias
        assert relative_error(y, reference) < TOLERANCE[dtype], rows
    with pytest.raises(Exception, match="x is on cpu; cuda kernels run on cuda"):
        module(x)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, cache) -> Path:
    """The three-layer Llama of tests/cpu/test_model.py (hidden 128, GQA, attention biases,
    tied embeddings, 4-bit g32 asymmetric act_order)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attention_bias=True, tie_word_embeddings=True, initializer_range=0.1,
        bos_token_id=61, eos_token_id=62, pad_token_id=63)
    model = transformers.LlamaForCausalLM(config)
    return hf.write_gptq(model, tmp_path_factory.mktemp("tiny-llama"), bits=4, group_size=32,
                         desc_act=True)


def test_tiny_llama_in_fp16_on_the_gpu(tiny):
    """The model and its kernels on the GPU (fp16, tensor cores): logits of 1, 9 and 130 rows
    against the float64 dequantized model, then 32 greedy tokens as that model's."""
    model = hf.from_gptq(tiny, target="cuda", db=DB, dtype="float16", batch_sizes=(16,))
    reference = hf.dequantized(tiny, torch.float64)
    assert model.device.type == "cuda" and model.qcompile.kernel_rows == (16,)
    prompt = [5, 17, 42, 8, 33, 1, 59, 12, 20]
    for length in (1, 9, 130):
        ids = (prompt * 15)[:length]
        with torch.no_grad():
            ours = model(torch.tensor([ids], device="cuda")).logits[0]
            theirs = reference(torch.tensor([ids])).logits[0].numpy()
        assert relative_error(ours, theirs) < 3e-3, length
    ids = torch.tensor([prompt])
    ours = hf.generate(model, ids, 32, min_new_tokens=32)
    assert ours.tokens.device.type == "cuda"
    theirs = hf.generate(reference, ids, 32, min_new_tokens=32)
    assert torch.equal(ours.tokens.cpu(), theirs.tokens)


def test_dequantized_on_the_gpu(tiny):
    """The dense reference built on the GPU (torch's dequantization there, act_order undone)
    gives the CPU-built one's float64 logits."""
    on_gpu = hf.dequantized(tiny, torch.float64, device="cuda")
    on_cpu = hf.dequantized(tiny, torch.float64)
    assert on_gpu.device.type == "cuda"
    ids = [5, 17, 42, 8, 33, 1, 59, 12, 20]
    with torch.no_grad():
        ours = on_gpu(torch.tensor([ids], device="cuda")).logits[0]
        theirs = on_cpu(torch.tensor([ids])).logits[0].numpy()
    assert relative_error(ours, theirs) < 1e-12
