"""Regenerate the real GPTQ checkpoints under tests/data/gptq/ with the real packers.

Each fixture is a one-layer Llama (hidden 128, intermediate 256, vocabulary 64, random weights,
attention and MLP biases) quantized by GPTQModel or AutoGPTQ on CPU with random calibration
tokens, then saved by the packer itself. Only the files a loader reads are kept:
``quantize_config.json``, ``config.json`` and ``model.safetensors`` (~0.1-0.3 MB each), plus
``packer_outputs.safetensors``: the packer's own forward of each layer on fixed rows.

The packers do not fit qcompile's environment (they pin other transformers, numpy and torch
versions), so each runs in a throwaway virtualenv of its own, with the CPU torch wheel installed
first so that nothing pulls CUDA wheels:

    python3 -m venv /tmp/gptq-packers && . /tmp/gptq-packers/bin/activate
    pip install /path/to/torch-2.13.0+cpu-*.whl
    pip install --no-deps gptqmodel==7.7.0
    pip install pypcre logbar device-smi safetensors threadpoolctl numpy packaging dill \\
        tokenicer defuser accelerate transformers pillow requests
    python tools/make_gptq_fixtures.py --packer gptqmodel

    python3 -m venv /tmp/autogptq-venv && . /tmp/autogptq-venv/bin/activate
    pip install /path/to/torch-2.13.0+cpu-*.whl
    pip install "numpy<2" "transformers<4.50" "datasets<3" "pyarrow<17" peft==0.12.0 \\
        safetensors sentencepiece rouge gekko accelerate tqdm
    pip install --no-deps auto-gptq==0.7.1
    python tools/make_gptq_fixtures.py --packer auto-gptq

This script is never imported by qcompile or its tests; it only writes the fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "gptq"
KEEP = ("quantize_config.json", "config.json", "model.safetensors", "packer_outputs.safetensors")

#: name -> settings. GPTQModel writes v1 ("gptq") or v2 ("gptq_v2"); AutoGPTQ writes v1 only.
GPTQMODEL = {
    "gptqmodel_b4_g32_act_asym_v1": dict(bits=4, group_size=32, desc_act=True, sym=False),
    "gptqmodel_b4_g128_sym_v2": dict(bits=4, group_size=128, desc_act=False, sym=True,
                                     format="gptq_v2"),
    "gptqmodel_b4_g128_act_asym_v2": dict(bits=4, group_size=128, desc_act=True, sym=False,
                                          format="gptq_v2"),
    "gptqmodel_b2_g32_act_static_v1": dict(bits=2, group_size=32, desc_act=True, sym=False,
                                           static_groups=True),
    "gptqmodel_b3_g128_act_asym_v2": dict(bits=3, group_size=128, desc_act=True, sym=False,
                                          format="gptq_v2"),
    "gptqmodel_b3_g32_sym_v1": dict(bits=3, group_size=32, desc_act=False, sym=True),
    "gptqmodel_b8_gcol_act_sym_v1": dict(bits=8, group_size=-1, desc_act=True, sym=True),
    "gptqmodel_b8_g32_asym_v2": dict(bits=8, group_size=32, desc_act=False, sym=False,
                                     format="gptq_v2"),
    # act_group_aware (GPTQModel's default without desc_act) needs groups
    "gptqmodel_b2_gcol_asym_v1": dict(bits=2, group_size=-1, desc_act=False, sym=False,
                                      act_group_aware=False),
}
AUTOGPTQ = {
    "autogptq_b4_g128_act_asym": dict(bits=4, group_size=128, desc_act=True, sym=False),
    "autogptq_b4_g32_sym": dict(bits=4, group_size=32, desc_act=False, sym=True),
    "autogptq_b3_g32_act_sym": dict(bits=3, group_size=32, desc_act=True, sym=True),
    "autogptq_b2_g128_act_static": dict(bits=2, group_size=128, desc_act=True, sym=False,
                                        static_groups=True),
    "autogptq_b8_gcol_asym": dict(bits=8, group_size=-1, desc_act=False, sym=False),
}


def tiny_llama(directory: Path) -> None:
    """A one-layer Llama with biases and a word-level tokenizer (the packers need one)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=64, attention_bias=True, mlp_bias=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # biases start at zero; make them visible in the output
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.05)
    model.save_pretrained(directory)
    vocab = {f"t{i}": i for i in range(60)}
    vocab.update({"<unk>": 60, "<s>": 61, "</s>": 62, "<pad>": 63})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>").save_pretrained(directory)


def calibration(count: int = 8, length: int = 32):
    import torch

    generator = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 60, (1, length), generator=generator),
             "attention_mask": torch.ones(1, length, dtype=torch.long)} for _ in range(count)]


def packer_outputs(model, out: Path) -> None:
    """The packer's own forward of every quantized module on fixed fp16 rows (M = 8), saved as
    ``packer_outputs.safetensors`` ({name}.x, {name}.y): the ground truth the tests hold our
    reading of the format to."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(2)
    tensors = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not hasattr(module, "qweight"):
                continue
            x = torch.randn(8, module.infeatures if hasattr(module, "infeatures")
                            else module.in_features, generator=generator).to(torch.float16)
            tensors[f"{name}.x"] = x
            tensors[f"{name}.y"] = module(x).float().contiguous()
    save_file(tensors, str(out / "packer_outputs.safetensors"))


def with_gptqmodel(base: Path, settings: dict, out: Path) -> None:
    os.environ.setdefault("GPTQMODEL_DISABLE_PACK_EXT", "1")  # no C++ JIT build
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    model = GPTQModel.load(str(base), QuantizeConfig(**settings), device="cpu")
    model.quantize(calibration(), batch_size=1)
    model.save(str(out))
    from gptqmodel import BACKEND

    packer_outputs(GPTQModel.load(str(out), device="cpu", backend=BACKEND.TORCH).model, out)


def with_autogptq(base: Path, settings: dict, out: Path) -> None:
    """AutoGPTQ's own quantizer (``GPTQ.fasterquant``), packer (``pack_model``: its
    QuantLinear.pack) and config writer, driven by hand: ``AutoGPTQForCausalLM.quantize``
    refuses to run without CUDA. One decoder layer, so quantizing every linear layer on the
    float model's activations is what its sequential loop would do for the first layer."""
    import torch
    from auto_gptq import BaseQuantizeConfig
    from auto_gptq.modeling._utils import find_layers, pack_model
    from auto_gptq.quantization import GPTQ
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    # fasterquant times itself with torch.cuda.synchronize(), which raises on a CPU-only torch;
    # with no GPU there is nothing to wait for.
    torch.cuda.synchronize = lambda *args, **kwargs: None
    config = BaseQuantizeConfig(**settings)
    model = LlamaForCausalLM.from_pretrained(str(base), torch_dtype=torch.float16)
    model.eval()
    linears = {name: module for name, module in find_layers(model.model.layers).items()}
    solvers = {name: GPTQ(module) for name, module in linears.items()}
    for solver in solvers.values():
        solver.quantizer.configure(config.bits, perchannel=True, sym=config.sym, mse=False)
    hooks = [module.register_forward_hook(
        lambda mod, inp, outp, name=name: solvers[name].add_batch(inp[0].data, outp.data))
        for name, module in linears.items()]
    with torch.no_grad():
        for batch in calibration():
            model(**batch)
    for hook in hooks:
        hook.remove()
    quantizers = {}
    for name, solver in solvers.items():
        scale, zero, g_idx = solver.fasterquant(percdamp=config.damp_percent,
                                                group_size=config.group_size,
                                                actorder=config.desc_act,
                                                static_groups=config.static_groups)
        quantizers[f"model.layers.{name}"] = (solver.quantizer, scale, zero, g_idx)
    pack_model(model, quantizers, config.bits, config.group_size, use_triton=False,
               desc_act=config.desc_act, force_layer_back_to_cpu=True)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    model.config.save_pretrained(str(out))
    packer_outputs(model, out)


PACKERS = {"gptqmodel": (GPTQMODEL, with_gptqmodel), "auto-gptq": (AUTOGPTQ, with_autogptq)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packer", required=True, choices=sorted(PACKERS))
    parser.add_argument("--only", nargs="*", help="fixture names to regenerate (default: all)")
    args = parser.parse_args(argv)
    fixtures, quantize = PACKERS[args.packer]
    with tempfile.TemporaryDirectory(prefix="qcompile-fixtures-") as scratch:
        base = Path(scratch) / "tiny-llama"
        tiny_llama(base)
        for name, settings in fixtures.items():
            if args.only and name not in args.only:
                continue
            saved = Path(scratch) / name
            quantize(base, settings, saved)
            target = OUT / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for file in KEEP:
                if (saved / file).is_file():
                    shutil.copy(saved / file, target / file)
            (target / "packer.json").write_text(json.dumps(
                {"packer": args.packer, "settings": settings}, indent=2) + "\n")
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
