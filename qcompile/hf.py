"""A GPTQ checkpoint as a Hugging Face transformers model whose linear layers run qcompile
kernels, ready to ``generate()``.

    model = qcompile.hf.from_gptq("Llama-2-7B-GPTQ/", target="avx2", db=URL)
    out = model.generate(input_ids, max_new_tokens=32, do_sample=False)

:func:`from_gptq` builds the model of the checkpoint's ``config.json`` (a Llama-family
architecture: :data:`MODEL_TYPES`) without allocating its dense weights, swaps every quantized
``nn.Linear`` for a :class:`~qcompile.nn.QuantLinear` (:func:`~qcompile.nn.replace_linear`),
loads the other tensors (embeddings, norms, lm_head) from the safetensors, and then resolves,
before it returns, the kernel of every row count the model will run (:func:`prepare_kernels`):
nothing is looked up, tuned or built during generation.

Layers that read the same input run as one kernel (``fuse=True``): an attention's q/k/v
projections and an MLP's gate/up projections, their columns side by side
(:func:`qcompile.gptq.fuse_shared_inputs`). The fused layer is a child of the attention (or
MLP) module, ``self_attn.qkv_proj``; a forward pre-hook feeds the module the fused output in
place of its input, and ``q_proj``, ``k_proj``, ``v_proj`` become :class:`Columns` that take
their share of it (the module's own forward only reshapes their outputs).

:func:`dequantized` builds the same model with dense weights ``W = dequantize(...)`` (the
reference the tests hold the kernels to), :func:`write_gptq` quantizes a transformers model
into a GPTQ checkpoint (round to nearest; for tests and benchmarks), and :func:`generate`
times prefill and decode separately.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open

from qcompile import gptq
from qcompile.errors import FormatError, NoRecordError, UsageError
from qcompile.kernels.uniform import FAMILY
from qcompile.kernels.uniform.dense_torch import dequantize_on_device
from qcompile.nn import (
    MAX_KERNEL_ROWS,
    PREFILL_ROWS,
    QuantLinear,
    replace_linear,
    row_plan,
)
from qcompile.quantize.rtn import quantize_rtn
from tuning_db.url import db_option

#: ``config.json`` model types whose decoder layers this module runs: a Llama-family attention
#: (q/k/v/o projections, the input used only through them) and a gated MLP (gate/up/down).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def from_gptq(path: str | Path, target: str = "avx2", db: str | None = None, *,
              dtype: str = "float32", on_missing: str = "untuned", tune_trials: int = 64,
              fuse: bool = True, batch_sizes: Sequence[int] = (1,),
              prefill_rows: int = PREFILL_ROWS, int8_activations: bool = False,
              lm_head_bits: int | None = None):
    """A transformers causal LM of a GPTQ checkpoint, running on qcompile kernels.

    Parameters
    ----------
    path : str or Path
        The checkpoint directory: ``config.json`` (a Llama-family model), the quantization
        config and the safetensors shards (``qcompile.gptq.load``).
    target : str
        A target preset (``qcompile targets``): a CPU one ("avx2", "avx512") runs the model
        on the CPU, a CUDA one ("cuda", "sm80", ...) on the GPU (inputs go to ``model.device``).
    db : str, optional
        The tuning database's URL (default: $QCOMPILE_DB, else the user's SQLite file).
    dtype : str
        The activations' dtype, and the dense weights': "float32", "float16" or "bfloat16".
    on_missing : str
        A kernel without a tuned record: "untuned" (default: built from the design space's
        seeded decisions, with one warning that gives the ``qcompile tune`` command), "error"
        (NoRecordError with that command) or "tune" (tuned now, ``tune_trials`` candidates).
    tune_trials : int
        Candidates per kernel under ``on_missing="tune"``.
    fuse : bool
        Run q/k/v and gate/up as one kernel each where their quantization allows it.
    batch_sizes : sequence of int
        The rows of a decode step (sequences generated at once) that get kernels of their
        own; other row counts run the smallest larger kernel, x zero-padded.
    prefill_rows : int
        Calls of this many rows or more (a long prompt) take the dense prefill path.
    int8_activations : bool
        The integer dot-product kernels for 2/3/4-bit layers (x rounded to int8 per group).
    lm_head_bits : int, optional
        Quantize the dense lm_head at load (round to nearest, 8 or 4 bits, groups of 128 rows:
        :func:`lm_head_layer`) and run it on a qcompile kernel, as llama.cpp's Q4_K_M keeps it
        in 6 bits: a token then reads a quarter of its bytes at 8 bits instead of float32's.
        None (default) keeps it dense and exact.

    Returns
    -------
    transformers.PreTrainedModel
        In eval mode, without gradients, every quantized layer a QuantLinear whose kernels
        are resolved; ``model.qcompile`` is the :class:`KernelReport`.

    Raises
    ------
    FormatError
        No checkpoint there, a config that is not a Llama-family model, a tensor the model
        lacks or does not take, bits the kernels lack.
    NoRecordError
        ``on_missing="error"`` and a kernel has no tuned record (the message gives the one
        command that tunes them all).
    """
    if dtype not in _DTYPES:
        raise UsageError(f"dtype must be one of {sorted(_DTYPES)}; got {dtype!r}")
    directory = _checkpoint_directory(path)
    config = model_config(directory)
    layers = gptq.load(directory)
    run_layers = gptq.fuse_shared_inputs(layers) if fuse else layers
    model = _skeleton(config, _DTYPES[dtype])
    _install_fused(model, run_layers)
    replace_linear(model, run_layers, target=target, db=db, on_missing=on_missing,
                   tune_trials=tune_trials, int8_activations=int8_activations)
    _load_dense_tensors(model, directory, set(layers), _DTYPES[dtype])
    if lm_head_bits is not None:  # on the kernel cache the layers already use
        kernels = next(m.kernels for m in model.modules() if isinstance(m, QuantLinear))
        quantize_lm_head(model, lm_head_bits, kernels, checkpoint=str(directory))
    device = torch.device("cpu")
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.prefill_rows = prefill_rows
            device = module.device
    model.to(device)  # a CUDA target's kernels and weights are on the GPU already
    model.qcompile = prepare_kernels(model, batch_sizes=batch_sizes, dtype=dtype,
                                     checkpoint=str(directory), fused=fuse)
    if device.type == "cpu":
        warn_if_thread_pools_spin()
    return model


def lm_head_layer(weight: torch.Tensor, bits: int, checkpoint: str | None = None
                  ) -> gptq.GptqLayer:
    """The lm_head's weight quantized by rounding to nearest, as a GPTQ layer named "lm_head".

    Parameters
    ----------
    weight : torch.Tensor, float [vocabulary, hidden]
        ``lm_head.weight`` (nn.Linear's layout), any float dtype, any device.
    bits : int
        One of :data:`qcompile.gptq.LM_HEAD_BITS`; groups of
        :data:`qcompile.gptq.LM_HEAD_GROUP` rows of K (hidden).

    Raises
    ------
    UsageError
        Other bits, or a hidden size that the groups do not divide.
    """
    if bits not in gptq.LM_HEAD_BITS:
        raise UsageError(f"lm_head_bits must be one of {gptq.LM_HEAD_BITS}; got {bits}")
    vocabulary, hidden = weight.shape
    if hidden % gptq.LM_HEAD_GROUP:
        raise UsageError(f"a quantized lm_head needs a hidden size divisible by "
                         f"{gptq.LM_HEAD_GROUP}; this model's is {hidden}")
    tensors = quantize_rtn(weight.detach().float().cpu().numpy().T, bits, gptq.LM_HEAD_GROUP)
    config = gptq.QuantizeConfig(bits=bits, group_size=gptq.LM_HEAD_GROUP, sym=False,
                                 source="lm_head_bits")
    return gptq.GptqLayer(name="lm_head", tensors=tensors, bias=None, config=config,
                          checkpoint=checkpoint)


def quantize_lm_head(model: torch.nn.Module, bits: int, kernels, *,
                     checkpoint: str | None = None) -> QuantLinear:
    """Replace ``model.lm_head`` (a dense nn.Linear) by a QuantLinear of its weight rounded to
    ``bits`` (:func:`lm_head_layer`), on ``kernels``' target; the embeddings keep their own
    weight where the two were tied. Returns the new module."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise FormatError(f"the model's lm_head is a {type(head).__name__}"
                          f"{' with a bias' if getattr(head, 'bias', None) is not None else ''}"
                          "; only a bias-free nn.Linear can be quantized")
    quantized = QuantLinear(lm_head_layer(head.weight, bits, checkpoint), kernels)
    model.lm_head = quantized
    return quantized


def warn_if_thread_pools_spin() -> None:
    """One warning when torch's OpenMP threads would spin beside the kernels' thread pool.

    After each parallel region torch's OpenMP workers keep spinning for a while; on a CPU
    model the next call is usually a qcompile kernel, whose own worker threads then share the
    cores with spinning ones (TinyLlama on 2 cores: 3.6 decode tokens/s, 9.6 with
    OMP_WAIT_POLICY=PASSIVE; docs/results.md). The policy is read once, when torch loads
    OpenMP, so only the environment of a new process can set it.
    """
    import os
    import warnings

    if torch.get_num_threads() > 1 and os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        warnings.warn("torch's OpenMP threads spin between calls and slow qcompile's CPU "
                      "kernels about 2.5x in a model: start Python with "
                      "OMP_WAIT_POLICY=PASSIVE (the qcompile CLI and tools/bench.py do), or "
                      "torch.set_num_threads(1)", RuntimeWarning, stacklevel=3)


def dequantized(path: str | Path, dtype: torch.dtype = torch.float64,
                device: str | torch.device = "cpu"):
    """The checkpoint's model with dense weights ``W = dequantize(qweight, scales, qzeros,
    g_idx)`` in ``dtype``: the float reference of :func:`from_gptq` (same architecture, same
    other tensors), and the transformers peer of the benchmarks.

    Parameters
    ----------
    path : str or Path
        As :func:`from_gptq`.
    dtype : torch.dtype
        The weights' and activations' dtype (float64 for a reference).
    device : str or torch.device
        Where the model lives. The CPU dequantizes with numpy (float32), a GPU with torch on
        the GPU (float32 too, :func:`qcompile.kernels.uniform.dense_torch.dequantize_on_device`):
        the same values, each rounded once to ``dtype``.

    Returns
    -------
    transformers.PreTrainedModel
        Eval mode, no gradients, plain ``nn.Linear`` layers (unfused, as transformers has
        them), on ``device``.
    """
    device = torch.device(device)
    return with_layers(path, lambda layer: dense_linear(layer, dtype, device), dtype=dtype,
                       device=device)


def with_layers(path: str | Path, make_layer, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", fuse: bool = False):
    """The checkpoint's model with every quantized layer made by ``make_layer``: the dense
    reference (:func:`dequantized`), or a benchmark's model on another library's GPTQ layers.

    Parameters
    ----------
    path : str or Path
        As :func:`from_gptq`.
    make_layer : callable
        ``make_layer(layer)`` for each :class:`qcompile.gptq.GptqLayer` returns a module on
        ``device`` that maps x [..., in_features] of ``dtype`` to [..., out_features] (bias
        included).
    dtype : torch.dtype
        The other tensors' dtype (embeddings, norms, lm_head).
    device : str or torch.device
    fuse : bool
        Layers that share their input become one, as in :func:`from_gptq` (``make_layer``
        then gets the fused ``qkv_proj`` and ``gate_up_proj`` layers).

    Returns
    -------
    transformers.PreTrainedModel
        Eval mode, no gradients, on ``device``.
    """
    directory = _checkpoint_directory(path)
    config = model_config(directory)
    layers = gptq.load(directory)
    run_layers = gptq.fuse_shared_inputs(layers) if fuse else layers
    model = _skeleton(config, dtype)
    _install_fused(model, run_layers)
    for name, layer in run_layers.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, make_layer(layer))
    _load_dense_tensors(model, directory, set(layers), dtype)
    return model.to(device)


def dense_linear(layer: gptq.GptqLayer, dtype: torch.dtype,
                 device: str | torch.device = "cpu") -> torch.nn.Linear:
    """An ``nn.Linear`` of ``layer``'s dequantized weight: weight [N, K] and bias [N] in
    ``dtype`` on ``device``, rows in the checkpoint's order (act_order undone)."""
    device = torch.device(device)
    linear = torch.nn.Linear(layer.in_features, layer.out_features,
                             bias=layer.bias is not None, device="meta")
    if device.type == "cpu":
        weight = torch.from_numpy(layer.dequantize().T)
    else:
        spec = layer.spec(m=1)
        prepared = FAMILY.prepare(spec, device=device.type, **layer.kernel_tensors())
        rows = dequantize_on_device(spec, prepared, torch.float32)  # prepared row order P
        permutation = prepared.extras.get("perm")
        if permutation is not None:  # prepared row i is the checkpoint's row P[i]
            rows = torch.empty_like(rows).index_copy_(0, permutation, rows)
        weight = rows.T
    linear.weight = torch.nn.Parameter(weight.to(device, dtype).contiguous(),
                                       requires_grad=False)
    if layer.bias is not None:
        linear.bias = torch.nn.Parameter(torch.from_numpy(layer.bias).to(device, dtype),
                                         requires_grad=False)
    return linear


def model_config(directory: str | Path):
    """The transformers config of a checkpoint's ``config.json``, without its quantization
    config; a model type outside :data:`MODEL_TYPES` is a FormatError."""
    file = Path(directory) / "config.json"
    if not file.is_file():
        raise FormatError(f"{directory} has no config.json: a model needs its architecture "
                          "(qcompile.gptq.load reads the quantized layers alone)")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise FormatError(f"{file} is not readable JSON: {error}") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if model_type not in MODEL_TYPES:
        raise FormatError(f"{file}: model_type={model_type!r} is not a Llama-family model; "
                          f"qcompile.hf runs {', '.join(MODEL_TYPES)}")
    data = {k: v for k, v in data.items() if k not in ("quantization_config", "model_type")}
    return transformers.AutoConfig.for_model(model_type, **data)


@dataclass(frozen=True)
class KernelReport:
    """What :func:`prepare_kernels` resolved.

    Attributes
    ----------
    specs : int
        Distinct kernel specs the model runs (shape, bits, group size, rows, dtype).
    untuned : tuple of str
        The names of those without a tuned record (run untuned, or tuned now).
    kernel_rows : tuple of int
        The row counts M with kernels of their own, before tuned ones of other M join.
    command : str
        The one command that tunes every kernel the model runs ("" when every call takes
        the dense path).
    """

    specs: int
    untuned: tuple[str, ...]
    kernel_rows: tuple[int, ...]
    command: str


def prepare_kernels(model: torch.nn.Module, *, batch_sizes: Sequence[int] = (1,),
                    dtype: str = "float32", checkpoint: str = "DIR",
                    fused: bool = True) -> KernelReport:
    """Resolve now the kernel of every row count every QuantLinear of ``model`` will run.

    The M that get kernels: each of ``batch_sizes`` (a decode step's rows) and the largest
    count below the layers' ``prefill_rows`` that a kernel serves (16, the chunks of a
    prompt; 1 when prefill_rows is 2), plus every M of 1..16 with a tuned record. Count R
    then runs the smallest of them >= R (:func:`qcompile.nn.row_plan`), a prompt of
    ``prefill_rows`` rows or more the dense path, whose dequantization is built here too.

    Parameters
    ----------
    model : torch.nn.Module
        With QuantLinear layers (``from_gptq``, ``replace_linear``), all of one KernelCache.
    batch_sizes : sequence of int
        Decode rows, each in 1..16.
    dtype : str
        The activations' dtype.
    checkpoint : str
        The checkpoint's directory, for the command in messages.
    fused : bool
        Whether the model fused q/k/v and gate/up (the command then tunes the fused shapes).

    Returns
    -------
    KernelReport

    Raises
    ------
    NoRecordError
        The layers' ``on_missing`` is "error" and a kernel has no tuned record: one message
        for all of them, with the one command that tunes them.
    """
    modules = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not modules:
        raise FormatError("the model has no QuantLinear layer to prepare")
    bad = [b for b in batch_sizes if not 1 <= b <= MAX_KERNEL_ROWS]
    if bad:
        raise UsageError(f"batch sizes must lie in 1..{MAX_KERNEL_ROWS}; got {bad[0]}")
    kernels = modules[0].kernels
    largest = min(modules[0].prefill_rows - 1, MAX_KERNEL_ROWS)  # the prompt chunks' rows
    required = sorted({b for b in batch_sizes if b <= largest} | ({largest} if largest else set()))
    by_shape: dict[object, list[QuantLinear]] = {}
    for module in modules:
        by_shape.setdefault(module.spec(1, module.kernel_dtype(dtype)), []).append(module)
    untuned, specs, plans = [], 0, {}
    for shape, group in by_shape.items():
        module = group[0]
        kernel_dtype = module.kernel_dtype(dtype)
        tuned = {m for m in range(1, largest + 1)
                 if kernels.has_record(module.spec(m, kernel_dtype))}
        specs += len(set(required) | tuned)
        untuned += [module.spec(m, kernel_dtype).name() for m in required if m not in tuned]
        plans[shape] = row_plan(tuned | set(required), largest)
    command = _tune_command(kernels, checkpoint, required, dtype, modules, fused)
    report = KernelReport(specs=specs, untuned=tuple(untuned), kernel_rows=tuple(required),
                          command=command)
    if untuned and kernels.on_missing == "error":
        raise NoRecordError(f"{len(untuned)} of the {specs} kernels this model runs have no "
                            f"tuned record on {kernels.preset.name} in "
                            f"{kernels.storage.display_url} (first: {untuned[0]}); run: "
                            f"{command}")
    if untuned and kernels.on_missing == "untuned":
        warnings.warn(f"{len(untuned)} of the {specs} kernels this model runs have no tuned "
                      f"record: running them untuned (correct, slower); tune them once with: "
                      f"{command}", stacklevel=2)
    with warnings.catch_warnings():  # the one line above speaks for every kernel
        warnings.simplefilter("ignore")
        for shape, group in by_shape.items():
            for module in group:
                module.plan_rows(plans[shape], dtype)
    return report


def _tune_command(kernels, checkpoint: str, rows: Sequence[int], dtype: str,
                  modules: list[QuantLinear], fused: bool) -> str:
    if not rows:  # every call takes the dense path: no kernel to tune
        return ""
    flags = [f"--batch {','.join(map(str, rows))}"]
    if any(m.int8_activations for m in modules):
        flags.append("--int8-activations")
    elif dtype != "float32":
        flags.append(f"--dtype {dtype}")
    if fused:
        flags.append("--fused")
    head = next((m for m in modules if m.layer_name == "lm_head"), None)
    if head is not None:  # quantized at load (lm_head_bits)
        flags.append(f"--lm-head-bits {head.bits}")
    db = db_option(kernels.storage.display_url)
    return (f"qcompile tune --from-gptq {checkpoint} --target {kernels.preset.name} "
            f"{' '.join(flags)}{' ' + db if db else ''}")


class Columns(torch.nn.Module):
    """Columns ``[start, start + width)`` of a fused layer's output: what one of its parts
    (``q_proj``, say) returns when the module's pre-hook fed it that output.

    Parameters
    ----------
    fused : str
        The fused layer's name, for ``repr``.
    start, width : int
    """

    def __init__(self, fused: str, start: int, width: int) -> None:
        super().__init__()
        self.fused, self.start, self.width = fused, start, width

    def extra_repr(self) -> str:
        return f"{self.fused}[..., {self.start}:{self.start + self.width}]"

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """y [..., N of the fused layer] -> [..., width], a view."""
        return y[..., self.start:self.start + self.width]


class _FeedFused:
    """A forward pre-hook: the module's input (first positional argument, or the keyword
    ``hidden_states`` or ``x``) replaced by its fused child's output."""

    def __init__(self, child: str) -> None:
        self.child = child

    def __call__(self, module, args, kwargs):
        fused = getattr(module, self.child)
        if args:
            return (fused(args[0]), *args[1:]), kwargs
        key = "hidden_states" if "hidden_states" in kwargs else "x"
        return args, {**kwargs, key: fused(kwargs[key])}


def _install_fused(model: torch.nn.Module, layers: dict[str, gptq.GptqLayer]) -> None:
    """For every fused layer: a placeholder nn.Linear at its name (replace_linear swaps it),
    its parts as Columns, and the pre-hook on their parent module."""
    for name, layer in layers.items():
        if not layer.parts:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        start = 0
        for part_name, width in layer.parts:
            setattr(parent, part_name.rpartition(".")[2], Columns(child, start, width))
            start += width
        parent.add_module(child, torch.nn.Linear(layer.in_features, layer.out_features,
                                                 bias=False, device="meta"))
        parent.register_forward_pre_hook(_FeedFused(child), with_kwargs=True)


def _checkpoint_directory(path: str | Path) -> Path:
    directory = Path(path)
    if not directory.is_dir():
        raise FormatError(f"no checkpoint directory at {path}")
    return directory


def _skeleton(config, dtype: torch.dtype):
    """The model of ``config`` with its parameters on the meta device (no memory, no random
    initialisation); its rotary embeddings, whose buffers are computed, not loaded, are
    made on the CPU."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, module in list(model.named_modules()):
        if name.endswith("rotary_emb"):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, type(module)(config=config))
    return model


def _load_dense_tensors(model, directory: Path, quantized: set[str], dtype: torch.dtype) -> None:
    """The checkpoint's other tensors (embeddings, norms, lm_head, unquantized layers) into
    ``model`` in ``dtype``; every parameter and buffer must come from it (a tied lm_head from
    the embeddings), or FormatError names the first missing one."""
    state = {}
    for file in gptq.shard_files(directory):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key.rpartition(".")[0] not in quantized:
                    state[key] = handle.get_tensor(key).to(dtype)
    expected = dict(model.state_dict(keep_vars=True))
    unexpected = sorted(k for k in state if k not in expected and "rotary_emb" not in k)
    if unexpected:
        raise FormatError(f"{directory}: tensor {unexpected[0]} has no place in the "
                          f"{model.config.model_type} model ({len(unexpected)} such tensors)")
    for key, value in state.items():
        if key in expected and tuple(expected[key].shape) != tuple(value.shape):
            raise FormatError(f"{directory}: {key} has shape {list(value.shape)}; the model "
                              f"expects {list(expected[key].shape)}")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False,
                          assign=True)
    tied = model.config.tie_word_embeddings and isinstance(model.get_output_embeddings(),
                                                           torch.nn.Linear)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    missing = [name for name, tensor in model.state_dict(keep_vars=True).items()
               if tensor.device.type == "meta"]
    if missing:
        raise FormatError(f"{directory} lacks {missing[0]} ({len(missing)} tensors of the "
                          f"{model.config.model_type} model are missing)")
    model.eval()
    model.requires_grad_(False)


@dataclass(frozen=True)
class Generation:
    """The tokens of one greedy :func:`generate` call and its timings.

    Attributes
    ----------
    tokens : torch.Tensor of int64, shape [B, new tokens]
    prompt_tokens : int
        Tokens of the prompt, all rows (B x prompt length).
    prefill_s : float
        From the call to the first new token (the prompt's forward pass).
    decode_s : float
        From the first new token to the last (one forward pass per token).
    """

    tokens: torch.Tensor
    prompt_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        """New tokens after the first, all rows, per second (None for one new token)."""
        steps = self.tokens.shape[1] - 1
        return steps * self.tokens.shape[0] / self.decode_s if steps > 0 else None


class _StepTimes(transformers.LogitsProcessor):
    """Notes the time of each decoding step (right after its forward pass); scores pass
    through unchanged."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        if scores.is_cuda:  # the step's kernels have finished, not only been queued
            torch.cuda.synchronize(scores.device)
        self.times.append(time.perf_counter())
        return scores


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> Generation:
    """Greedy ``model.generate`` with prefill and decode timed apart.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    input_ids : torch.Tensor of int64, shape [B, L]
        On any device: moved to the model's.
    max_new_tokens : int
    **kwargs
        More arguments of ``generate`` (``min_new_tokens``, say).

    Returns
    -------
    Generation
    """
    steps = _StepTimes()
    input_ids = input_ids.to(model.device)
    pad = model.config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             logits_processor=transformers.LogitsProcessorList([steps]),
                             pad_token_id=pad, **kwargs)
    return Generation(tokens=out[:, input_ids.shape[1]:], prompt_tokens=input_ids.numel(),
                      prefill_s=steps.times[0] - started,
                      decode_s=steps.times[-1] - steps.times[0])


def write_gptq(model, directory: str | Path, *, bits: int = 4, group_size: int = 128,
               sym: bool = False, desc_act: bool = False, static_groups: bool = False,
               checkpoint_format: str = "gptq", seed: int = 0, tokenizer=None) -> Path:
    """Quantize every linear layer of ``model``'s decoder layers by rounding to nearest and
    write a GPTQ checkpoint of it (``qcompile.gptq.save``): for tests and benchmarks (a GPTQ
    quantizer would round with the Hessian's help; the format is the same).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A Llama-family causal LM; its other tensors are stored as they are.
    directory : str or Path
    bits, group_size, sym, static_groups, checkpoint_format
        As in quantize_config.json ("gptq": v1 zero-points, "gptq_v2": v2).
    desc_act : bool
        act_order: each input's rows are quantized in a random order (GPTQ's would come from
        the Hessian), the same for the layers that share the input, as GPTQ's is; with
        ``static_groups`` the groups stay sequential.
    seed : int
        The act_order orders' seed.
    tokenizer : optional
        Saved beside the weights (``save_pretrained``) when given.

    Returns
    -------
    Path
        The checkpoint directory.
    """
    config = gptq.QuantizeConfig(bits=bits, group_size=group_size, desc_act=desc_act, sym=sym,
                                 static_groups=static_groups,
                                 checkpoint_format=checkpoint_format, source="write_gptq")
    convention = config.zero_convention
    rng = np.random.default_rng(seed)
    orders: dict[str, np.ndarray] = {}
    layers, quantized = {}, set()
    shared = {member: group for group, members in gptq.SHARED_INPUTS.items()
              for member in members}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or ".layers." not in f".{name}":
            continue
        parent, _, child = name.rpartition(".")
        weight = module.weight.detach().float().numpy().T  # [K, N]
        order = None
        if desc_act and not static_groups:
            key = f"{parent}.{shared.get(child, child)}"  # one order per input
            order = orders.setdefault(key, rng.permutation(weight.shape[0]))
        layers[name] = quantize_rtn(weight, bits, group_size, sym=sym,
                                    zero_convention=convention, order=order)
        quantized.add(name)
    tensors = {key: value for key, value in model.state_dict().items()
               if not (key.rpartition(".")[0] in quantized and key.endswith(".weight"))}
    if model.config.tie_word_embeddings:  # safetensors stores a tensor once
        tensors = {k: v for k, v in tensors.items() if not k.startswith("lm_head.")}
    model_json = model.config.to_dict()
    directory = gptq.save(directory, layers, config, tensors=tensors, model_config=model_json)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory


__all__ = ["MODEL_TYPES", "Columns", "Generation", "KernelReport", "dense_linear", "dequantized",
           "from_gptq", "generate", "model_config", "prepare_kernels", "with_layers",
           "write_gptq"]
