"""Reading GPTQ checkpoints (GPTQModel, AutoGPTQ, optimum): safetensors shards plus the
quantization config, into one checked :class:`GptqLayer` per quantized module.

    layers = qcompile.gptq.load("path/to/checkpoint")
    layer = layers["model.layers.0.mlp.down_proj"]
    layer.spec(m=1)            # the UniformSpec of a kernel for it
    layer.tensors              # qcompile.formats.gptq.GptqTensors (K x N, checkpoint layout)

The config is ``quantize_config.json`` or ``config.json``'s ``quantization_config``:
``bits``, ``group_size``, ``desc_act``, ``sym``, ``static_groups``, and ``checkpoint_format``
(or ``format``): "gptq" is v1 (zero-points stored as z - 1), "gptq_v2" stores z; a config that
names neither is v1. GPTQModel's per-module ``dynamic`` overrides are applied. Every tensor is
checked against the config and the others of its layer (../shared/formats/gptq.md); a
malformed checkpoint raises :class:`~qcompile.errors.FormatError` naming the tensor, the rule
and the numbers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.act_order import is_trivial
from qcompile.formats.gptq import GptqTensors, as_numpy, concatenate, pack_zeros
from qcompile.kernels.uniform import UniformSpec
from qcompile.kernels.uniform.spec import INT8_BITS

#: checkpoint_format -> zero-point convention. Other GPTQ layouts (marlin, bitblas, the planar
#: "gptq_p") repack the codes and are not read.
ZERO_CONVENTION_OF_FORMAT = {"gptq": "v1", "gptq_v2": "v2"}

#: Tensors of one quantized module, by suffix; g_idx and bias are optional.
REQUIRED = ("qweight", "qzeros", "scales")
OPTIONAL = ("g_idx", "bias")

CONFIG_FILE = "quantize_config.json"


@dataclass(frozen=True)
class QuantizeConfig:
    """The quantization settings of a checkpoint (or of one module, after ``dynamic``).

    Attributes
    ----------
    bits : int
        2, 3, 4 or 8.
    group_size : int
        -1 (one group per column) or the rows of K per group.
    desc_act, sym, static_groups : bool
        act_order, symmetric quantization, groups fixed before act_order's permutation.
    checkpoint_format : str
        "gptq" (v1) or "gptq_v2" (v2).
    source : str
        Where the settings came from, for messages.
    dynamic : dict
        GPTQModel's per-module overrides: regex (``-:`` prefix = not quantized) -> settings.
    """

    bits: int
    group_size: int
    desc_act: bool = False
    sym: bool = True
    static_groups: bool = False
    checkpoint_format: str = "gptq"
    source: str = CONFIG_FILE
    dynamic: dict[str, Any] = field(default_factory=dict)

    @property
    def zero_convention(self) -> str:
        return ZERO_CONVENTION_OF_FORMAT[self.checkpoint_format]

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> QuantizeConfig:
        """Check and read a quantization config; errors name ``source``, the field and value."""
        method = data.get("quant_method", "gptq")
        if str(method).lower() != "gptq":
            raise FormatError(f"{source}: quant_method={method!r} is not a GPTQ checkpoint "
                              "(expected 'gptq')")
        for key in ("bits", "group_size"):
            if key not in data:
                raise FormatError(f"{source}: the quantization config has no {key!r}")
        checkpoint_format = data.get("checkpoint_format") or data.get("format") or "gptq"
        if not isinstance(checkpoint_format, str) or \
                checkpoint_format not in ZERO_CONVENTION_OF_FORMAT:
            raise FormatError(
                f"{source}: checkpoint_format={checkpoint_format!r} is not supported; supported: "
                f"{sorted(ZERO_CONVENTION_OF_FORMAT)} (other layouts repack the codes)"
            )
        pack_dtype = data.get("pack_dtype", "int32")
        if pack_dtype != "int32":
            raise FormatError(f"{source}: pack_dtype={pack_dtype!r} is not supported; GPTQ "
                              "kernels read codes packed in int32")
        dynamic = data.get("dynamic") or {}
        if not isinstance(dynamic, dict):
            raise FormatError(f"{source}: 'dynamic' must map module regexes to settings; got "
                              f"{type(dynamic).__name__}")
        _check_dynamic(dynamic, source)
        config = cls(
            bits=_integer(data["bits"], "bits", source),
            group_size=_integer(data["group_size"], "group_size", source),
            desc_act=bool(data.get("desc_act", False)),
            sym=bool(data.get("sym", True)),
            static_groups=bool(data.get("static_groups", False)),
            checkpoint_format=checkpoint_format,
            source=source,
            dynamic=dynamic,
        )
        config.check()
        return config

    def check(self) -> None:
        if self.bits not in bitpack.SUPPORTED_BITS:
            raise FormatError(f"{self.source}: bits={self.bits} is not supported; supported bit "
                              f"widths: {bitpack.SUPPORTED_BITS}")
        if self.group_size != -1 and self.group_size <= 0:
            raise FormatError(f"{self.source}: group_size={self.group_size} must be -1 (one "
                              "group per column) or positive")

    def for_module(self, name: str) -> QuantizeConfig | None:
        """The settings of module ``name`` after ``dynamic`` overrides (GPTQModel's rule: the
        first matching ``-:`` pattern excludes the module, the first positive pattern that
        matches overrides); None when the module is excluded."""
        for pattern, overrides in self.dynamic.items():
            if pattern.startswith("-:"):
                if re.match(pattern[2:], name):
                    return None
                continue
            if re.match(pattern.removeprefix("+:"), name):
                settings = {k: v for k, v in (overrides or {}).items() if k in DYNAMIC_KEYS}
                source = f"{self.source} (dynamic {pattern!r})"
                module = replace(self, source=source, dynamic={}, **settings)
                module.check()
                return module
        return self


@dataclass(frozen=True)
class GptqLayer:
    """One quantized linear module of a checkpoint: ``y = x @ W + bias``.

    Attributes
    ----------
    name : str
        The module's name ("model.layers.0.mlp.down_proj").
    tensors : GptqTensors
        qweight int32 [K*bits/32, N], qzeros int32 [G, N*bits/32], scales float16 [G, N],
        g_idx int32 [K], checked; K = in_features, N = out_features.
    bias : numpy.ndarray of float32, shape [N], or None
    config : QuantizeConfig
        The module's settings.
    checkpoint : str or None
        The directory it was read from (for messages that give a command to run).
    parts : tuple of (str, int)
        For layers fused by :func:`fuse_shared_inputs`: the names and out_features of the
        checkpoint's layers whose columns it holds, in order; empty for a checkpoint's layer.
    """

    name: str
    tensors: GptqTensors
    bias: np.ndarray | None
    config: QuantizeConfig
    checkpoint: str | None = None
    parts: tuple[tuple[str, int], ...] = ()

    @property
    def in_features(self) -> int:
        return self.tensors.in_features

    @property
    def out_features(self) -> int:
        return self.tensors.out_features

    @property
    def bits(self) -> int:
        return self.tensors.bits

    @property
    def group_size(self) -> int:
        return self.tensors.group_size

    @property
    def act_order(self) -> bool:
        """True when g_idx is not ``k // group_size`` (desc_act without static groups): the
        kernel reads reordered rows and gathers x."""
        return not is_trivial(self.tensors.g_idx, self.tensors.group_size)

    def spec(self, m: int = 1, dtype: str = "float32", act_order: bool = False,
             int8_activations: bool = False):
        """The :class:`~qcompile.kernels.uniform.UniformSpec` that runs this layer on ``m``
        activation rows of ``dtype`` (``act_order=True``: the gather fused in the kernel;
        ``int8_activations=True``: the integer dot-product kernel, which takes float32 x)."""
        if int8_activations:
            dtype = "float32"
        return UniformSpec(k=self.in_features, n=self.out_features, bits=self.bits,
                           group_size=self.group_size, m=m, dtype=dtype, act_order=act_order,
                           int8_activations=int8_activations)

    def kernel_tensors(self) -> dict[str, Any]:
        """Keyword arguments of the uniform family's ``prepare`` for this layer."""
        return {"qweight": self.tensors.qweight, "scales": self.tensors.scales,
                "qzeros": self.tensors.qzeros, "g_idx": self.tensors.g_idx,
                "zero_convention": self.tensors.zero_convention, "bias": self.bias}

    def dequantize(self) -> np.ndarray:
        """The reference weight W [K, N], float32."""
        return self.tensors.dequantize()

    def reference(self, x) -> np.ndarray:
        """float64 ``x @ W + bias`` for x [..., K] (any float dtype, torch or numpy)."""
        y = np.asarray(as_numpy("x", x), dtype=np.float64) @ self.dequantize().astype(np.float64)
        return y + self.bias if self.bias is not None else y


def distinct_specs(layers: dict[str, GptqLayer], m: int = 1, dtype: str = "float32",
                   int8_activations: bool = False) -> list[tuple[Any, list[str]]]:
    """The kernel specs a checkpoint needs for ``m`` rows of ``dtype``, each once, with the
    layers that share it (act_order layers share the kernel of their shape: the gather is a
    separate step), in the order of their first layer. ``int8_activations``: the integer
    dot-product kernels (float32 x; 8-bit layers keep the float kernel)."""
    specs: dict[Any, list[str]] = {}
    for name, layer in layers.items():
        int8 = int8_activations and layer.bits in INT8_BITS
        specs.setdefault(layer.spec(m=m, dtype=dtype, int8_activations=int8), []).append(name)
    return list(specs.items())


#: Layers that read the same input, by the name of the module they are fused into: a
#: Llama-family attention's q/k/v projections and its MLP's gate/up projections.
SHARED_INPUTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                 "gate_up_proj": ("gate_proj", "up_proj")}


def fuse_shared_inputs(layers: dict[str, GptqLayer]) -> dict[str, GptqLayer]:
    """The layers as one kernel each runs them: every group of :data:`SHARED_INPUTS` under
    one parent module (``model.layers.0.self_attn.{q,k,v}_proj``) becomes one layer of their
    columns side by side (``model.layers.0.self_attn.qkv_proj``, ``parts`` naming them), so
    one kernel reads the input once for all of them.

    A group fuses when its layers have the same bits, group size and g_idx (act_order);
    ``sym`` and the zero-point convention need not agree, since the zero-points are stored
    per column either way. A group that does not fuse keeps its layers as they are.

    Parameters
    ----------
    layers : dict of str to GptqLayer
        ``load(path)``.

    Returns
    -------
    dict of str to GptqLayer
        Each fused layer where the first of its parts stood, the other layers unchanged.
    """
    fused: dict[str, GptqLayer] = {}
    absorbed: dict[str, str] = {}  # part name -> fused name
    for name in layers:
        parent, _, child = name.rpartition(".")
        for fused_child, members in SHARED_INPUTS.items():
            names = [f"{parent}.{member}" if parent else member for member in members]
            if child != members[0] or not all(n in layers for n in names):
                continue
            group = [layers[n] for n in names]
            if not _fusable(group):
                continue
            fused_name = f"{parent}.{fused_child}" if parent else fused_child
            fused[fused_name] = _concatenate(fused_name, group)
            absorbed.update(dict.fromkeys(names, fused_name))
    result = {}
    for name, layer in layers.items():
        if name not in absorbed:
            result[name] = layer
        elif absorbed[name] not in result:
            result[absorbed[name]] = fused[absorbed[name]]
    return result


def _fusable(group: list[GptqLayer]) -> bool:
    first = group[0]
    return all(layer.bits == first.bits and layer.group_size == first.group_size
               and layer.in_features == first.in_features
               and np.array_equal(layer.tensors.g_idx, first.tensors.g_idx)
               for layer in group[1:])


def _concatenate(name: str, group: list[GptqLayer]) -> GptqLayer:
    bias = None
    if any(layer.bias is not None for layer in group):  # a part without one adds zeros
        bias = np.concatenate([layer.bias if layer.bias is not None
                               else np.zeros(layer.out_features, np.float32) for layer in group])
    return GptqLayer(name=name, tensors=concatenate([layer.tensors for layer in group]),
                     bias=bias, config=group[0].config, checkpoint=group[0].checkpoint,
                     parts=tuple((layer.name, layer.out_features) for layer in group))


def read_config(directory: str | Path) -> QuantizeConfig:
    """The quantization config of a checkpoint directory: ``quantize_config.json``, else
    ``config.json``'s ``quantization_config``."""
    directory = Path(directory)
    own = directory / CONFIG_FILE
    if own.is_file():
        return QuantizeConfig.from_dict(_read_json(own), CONFIG_FILE)
    model = directory / "config.json"
    if model.is_file():
        data = _read_json(model)
        if "quantization_config" in data:
            config = data["quantization_config"]
            if not isinstance(config, dict):
                raise FormatError(f"{model}: 'quantization_config' must be a JSON object; got "
                                  f"{type(config).__name__}")
            return QuantizeConfig.from_dict(config, "config.json quantization_config")
        raise FormatError(f"{model} has no 'quantization_config' and there is no {CONFIG_FILE}: "
                          "not a quantized checkpoint")
    raise FormatError(f"{directory} has neither {CONFIG_FILE} nor config.json: not a GPTQ "
                      "checkpoint directory")


def shard_files(directory: str | Path) -> list[Path]:
    """The checkpoint's safetensors files: those of ``model.safetensors.index.json`` when it
    exists, else every ``*.safetensors`` in the directory."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise FormatError(f"{index} has no 'weight_map'")
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FormatError(f"{index.name} names shards that do not exist: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FormatError(f"{directory} holds no *.safetensors file")
    return files


def load(path: str | Path) -> dict[str, GptqLayer]:
    """Read every quantized layer of a GPTQ checkpoint.

    Parameters
    ----------
    path : str or Path
        The checkpoint directory (safetensors shards and the config), or one ``.safetensors``
        file whose directory holds the config.

    Returns
    -------
    dict of str to GptqLayer
        Module name -> layer, in the order of the names; modules without ``.qweight`` (norms,
        embeddings, layers excluded by ``dynamic``) are not in it.

    Raises
    ------
    qcompile.errors.FormatError
        A missing or unreadable config, a setting out of range (bits=5), a missing tensor, a
        tensor of the wrong dtype or shape, a group size that does not divide K, or a g_idx
        that does not give each group ``group_size`` rows; the message names the tensor.
    """
    path = Path(path)
    if path.is_file() and path.suffix != ".safetensors":
        raise FormatError(f"{path} is a file, not a checkpoint directory or a .safetensors "
                          "shard")
    if path.is_file():
        files, directory = [path], path.parent
    elif path.is_dir():
        directory = path
        files = shard_files(directory)
    else:
        raise FormatError(f"no checkpoint at {path}")
    config = read_config(directory)
    layers = layers_from_state_dict(_read_quantized_tensors(files), config,
                                    checkpoint=str(directory))
    if not layers:
        raise FormatError(f"{path} holds no GPTQ layer (no tensor named '<module>.qweight')")
    return layers


def save(directory: str | Path, layers: dict[str, GptqTensors], config: QuantizeConfig, *,
         tensors: dict[str, Any] | None = None, model_config: dict[str, Any] | None = None
         ) -> Path:
    """Write a GPTQ checkpoint that :func:`load` (and GPTQModel's, AutoGPTQ's loaders) read.

    Parameters
    ----------
    directory : str or Path
        Created if missing; ``model.safetensors``, ``quantize_config.json`` and (with
        ``model_config``) ``config.json`` are written into it.
    layers : dict of str to GptqTensors
        Module name -> its tensors, stored as ``<name>.qweight`` int32 [K*bits/32, N],
        ``.qzeros`` int32 [G, N*bits/32] (repacked in ``config``'s zero-point convention),
        ``.scales`` float16 [G, N] and ``.g_idx`` int32 [K].
    config : QuantizeConfig
        bits, group_size, desc_act, sym, static_groups, checkpoint_format and ``dynamic``;
        every layer must have the bits and group size the config gives its name.
    tensors : dict of str to torch.Tensor, optional
        The rest of the state dict, stored as they are (embeddings, norms, lm_head, biases as
        ``<name>.bias``).
    model_config : dict, optional
        The model's ``config.json`` (a transformers config's ``to_dict()``); the quantization
        config is added to it as ``quantization_config``.

    Returns
    -------
    Path
        The directory.
    """
    import torch  # the writer's only user makes torch models; reading needs no torch here
    from safetensors.torch import save_file

    config.check()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: value.detach().contiguous() for name, value in (tensors or {}).items()}
    for name, layer in layers.items():
        module = config.for_module(name)  # after its ``dynamic`` override, if any
        if module is None or (layer.bits, layer.group_size) != (module.bits, module.group_size):
            said = "excludes it" if module is None else \
                f"says {module.bits}-bit, group_size={module.group_size}"
            raise FormatError(f"{name} is {layer.bits}-bit with group_size={layer.group_size} "
                              f"but the config {said}")
        qzeros = layer.qzeros
        if layer.zero_convention != config.zero_convention:
            qzeros = pack_zeros(layer.zeros(), layer.bits, config.zero_convention)
        arrays = {"qweight": np.asarray(layer.qweight).view(np.int32),  # int32 or uint32
                  "qzeros": np.asarray(qzeros).view(np.int32),
                  "scales": np.asarray(layer.scales).astype(np.float16),
                  "g_idx": np.asarray(layer.g_idx).astype(np.int32)}
        for suffix, array in arrays.items():
            state[f"{name}.{suffix}"] = torch.from_numpy(np.ascontiguousarray(array))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    quantization = {"quant_method": "gptq", "bits": config.bits, "group_size": config.group_size,
                    "desc_act": config.desc_act, "sym": config.sym,
                    "static_groups": config.static_groups,
                    "checkpoint_format": config.checkpoint_format, "pack_dtype": "int32"}
    if config.dynamic:
        quantization["dynamic"] = config.dynamic
    (directory / CONFIG_FILE).write_text(json.dumps(quantization, indent=2) + "\n")
    if model_config is not None:
        data = {**model_config, "quantization_config": quantization}
        (directory / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    return directory


def layers_from_state_dict(state_dict, config: QuantizeConfig,
                           checkpoint: str | None = None) -> dict[str, GptqLayer]:
    """The GPTQ layers of a state dict (``<module>.qweight``, ``.qzeros``, ``.scales``,
    ``.g_idx``, ``.bias`` as torch tensors; other entries are ignored), checked as in
    :func:`load`. ``state_dict`` may also map module names to {suffix: tensor}."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in state_dict.items():
        if isinstance(value, dict):
            grouped.setdefault(key, {}).update(value)
            continue
        module, _, suffix = key.rpartition(".")
        grouped.setdefault(module, {})[suffix] = value
    quantized = {name: {s: t for s, t in found.items() if s in (*REQUIRED, *OPTIONAL)}
                 for name, found in grouped.items()
                 if any(s in found for s in REQUIRED)}
    layers = {}
    for name in sorted(quantized):
        module = config.for_module(name)
        if module is not None:
            layers[name] = _layer(name, quantized[name], module, checkpoint)
    return layers


def _layer(name: str, found: dict[str, Any], config: QuantizeConfig,
           checkpoint: str | None) -> GptqLayer:
    missing = [suffix for suffix in REQUIRED if suffix not in found]
    if missing:
        raise FormatError(
            f"{name}.{missing[0]} is missing from the checkpoint: a GPTQ layer needs "
            f"{', '.join(REQUIRED)} (found {', '.join(sorted(found))})")
    arrays = {}
    for suffix, value in found.items():
        arrays[suffix] = _to_numpy(f"{name}.{suffix}", value, suffix)
    try:
        tensors = GptqTensors.from_tensors(
            qweight=arrays["qweight"], scales=arrays["scales"], qzeros=arrays["qzeros"],
            g_idx=arrays.get("g_idx"), bits=config.bits, group_size=config.group_size,
            zero_convention=config.zero_convention)
    except FormatError as error:
        raise FormatError(_name_the_tensor(name, str(error), config)) from None
    bias = arrays.get("bias")
    if bias is not None:
        if bias.shape != (tensors.out_features,):
            raise FormatError(f"{name}.bias must have shape [N]=({tensors.out_features},); "
                              f"got {tuple(bias.shape)}")
        bias = bias.astype(np.float32)
    return GptqLayer(name=name, tensors=tensors, bias=bias, config=config, checkpoint=checkpoint)


_DTYPES = {"qweight": ("int32",), "qzeros": ("int32",), "scales": ("float16",),
           "g_idx": ("int32", "int64"), "bias": ("float16", "bfloat16", "float32")}


def _to_numpy(full_name: str, tensor, suffix: str) -> np.ndarray:
    """A torch tensor (or numpy array) as numpy, after checking its dtype."""
    if isinstance(tensor, np.ndarray):
        import torch

        tensor = torch.from_numpy(tensor)
    dtype = str(tensor.dtype).removeprefix("torch.")
    allowed = _DTYPES[suffix]
    if dtype not in allowed:
        raise FormatError(f"{full_name} must be {' or '.join(allowed)}; got {dtype}")
    if dtype == "bfloat16":
        tensor = tensor.float()
    return tensor.numpy()


def _name_the_tensor(name: str, message: str, config: QuantizeConfig) -> str:
    """Prefix a GptqTensors message with the module, naming the tensor it starts with."""
    for suffix in (*REQUIRED, "g_idx"):
        if message.startswith(f"{suffix} "):
            return f"{name}.{message} ({config.bits}-bit, group_size={config.group_size} "\
                   f"from {config.source})"
    return f"{name}: {message} ({config.bits}-bit, group_size={config.group_size} from " \
           f"{config.source})"


def _read_quantized_tensors(files: list[Path]) -> dict[str, dict[str, Any]]:
    """module name -> {suffix: torch tensor} for every module with a GPTQ tensor (a module's
    tensors may sit in different shards)."""
    from safetensors import safe_open

    def open_file(file: Path):
        try:
            return safe_open(str(file), framework="pt")
        except Exception as error:  # safetensors raises its own error types for bad headers
            raise FormatError(f"{file} is not a readable safetensors file: {error}") from None

    names_in = {}
    for file in files:
        with open_file(file) as handle:
            names_in[file] = list(handle.keys())
    modules = {name.rpartition(".")[0] for names in names_in.values() for name in names
               if name.rpartition(".")[2] in REQUIRED}
    suffixes = (*REQUIRED, *OPTIONAL)
    found: dict[str, dict[str, Any]] = {}
    for file, names in names_in.items():
        wanted = [n for n in names
                  if n.rpartition(".")[0] in modules and n.rpartition(".")[2] in suffixes]
        if not wanted:
            continue
        with open_file(file) as handle:
            for tensor_name in wanted:
                module, _, suffix = tensor_name.rpartition(".")
                try:
                    tensor = handle.get_tensor(tensor_name)
                except Exception as error:  # a truncated or corrupt shard: safetensors' errors
                    raise FormatError(f"{file}: tensor {tensor_name} is not readable: "
                                      f"{error}") from None
                found.setdefault(module, {})[suffix] = tensor
    return found


#: The settings a ``dynamic`` override may change (others are ignored, as GPTQModel does).
DYNAMIC_KEYS = ("bits", "group_size", "desc_act", "sym")


def _check_dynamic(dynamic: dict, source: str) -> None:
    """Every ``dynamic`` pattern compiles and every override is a mapping whose ``bits`` and
    ``group_size`` are integers, or a FormatError names the pattern and the rule."""
    for pattern, overrides in dynamic.items():
        regex = pattern[2:] if pattern.startswith(("-:", "+:")) else pattern
        try:
            re.compile(regex)
        except re.error as error:
            raise FormatError(f"{source}: dynamic pattern {pattern!r} is not a valid regular "
                              f"expression: {error}") from None
        if overrides is None or pattern.startswith("-:"):
            continue
        if not isinstance(overrides, dict):
            raise FormatError(f"{source}: dynamic {pattern!r} must map settings to values; got "
                              f"{type(overrides).__name__}")
        for key in ("bits", "group_size"):
            if key in overrides:
                _integer(overrides[key], key, f"{source} (dynamic {pattern!r})")


def _integer(value, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{source}: {key} must be an integer; got {value!r}")
    return value


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise FormatError(f"{path} is not readable JSON: {error}") from None
    if not isinstance(data, dict):
        raise FormatError(f"{path} must hold a JSON object; got {type(data).__name__}")
    return data


#: Rows of K per group of an lm_head quantized at load (qcompile.hf's ``lm_head_bits``).
LM_HEAD_GROUP = 128
#: Bit widths a quantized lm_head takes (fewer lose too much of the logits).
LM_HEAD_BITS = (4, 8)


def lm_head_spec(directory: str | Path, bits: int, m: int, dtype: str) -> UniformSpec:
    """The kernel spec of a checkpoint's lm_head quantized to ``bits`` at load, from its
    ``config.json`` (hidden_size x vocab_size, groups of :data:`LM_HEAD_GROUP`)."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
        hidden, vocabulary = int(config["hidden_size"]), int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise FormatError(f"{path}: no hidden_size and vocab_size for the lm_head "
                          f"({type(error).__name__}: {error})") from None
    return UniformSpec(k=hidden, n=vocabulary, bits=bits, group_size=LM_HEAD_GROUP, m=m,
                       dtype=dtype)
