"""``QuantLinear``: one GPTQ layer as a torch module that runs tuned qcompile kernels.

    layers = qcompile.gptq.load("checkpoint/")
    m = QuantLinear.from_gptq(layers["model.layers.0.mlp.down_proj"], target="avx2", db=URL)
    y = m(x)                   # x [..., K] float32, float16 or bfloat16 -> y [..., N], x's dtype

The target decides the device: a CPU preset ("avx2", "avx512") runs on the CPU, a CUDA preset
("cuda", "sm80", ...) on the GPU, where the weights live from the start and x must be. fp16 and
bf16 x on a GPU take the tensor-core kernels (variant ``uniform_cuda_mma_f16``) where the shape
fits them, float32 x the float kernels, and ``int8_activations=True`` the int8 ones.

    replace_linear(model, layers, target="avx2", db=URL)   # every nn.Linear named in layers

How a call runs, by the number of activation rows R (all leading dimensions flattened):

- R <= MAX_KERNEL_ROWS (16): the tuned kernel of the smallest M >= R that has a record in the
  database (M is part of the spec: each M is a workload of its own), x zero-padded to M rows.
- R >= ``prefill_rows``: the prefill path, the weight dequantized once per call and one dense
  matmul (torch's GEMM: float32 on the CPU, x's dtype on the GPU), which beats the GEMV-shaped
  kernels on many rows (crossover measured by tools/bench.py prefill,
  docs/design/gptq-checkpoints.md "Prefill crossover").
- in between: the M = 16 kernel over chunks of 16 rows.

The kernel of each row count is chosen once, at its first call, or for every count up front
by :meth:`QuantLinear.plan_rows` (what a model does before it generates: nothing is looked up
or built mid-generation). act_order layers are reordered once when the module is built and x
is gathered per call (``prepare``). A shape with no tuned record follows ``on_missing``
(default "error": the message gives the ``qcompile tune`` command; see
:mod:`qcompile.kernel_cache`).

A call is the PyTorch custom operator ``qcompile::quant_linear`` (``torch.library``, with a
fake implementation for tracing), so ``torch.compile`` traces through a QuantLinear without a
graph break; the operator finds its module by an integer handle.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable
from dataclasses import replace

import torch

from qcompile.errors import ArgumentError, FormatError, NoRecordError
from qcompile.gptq import GptqLayer, QuantizeConfig, layers_from_state_dict
from qcompile.kernel_cache import KernelCache
from qcompile.kernels.uniform import FAMILY, UniformSpec
from qcompile.kernels.uniform.dense_torch import dequantize_on_device
from qcompile.kernels.uniform.spec import INT8_BITS
from qcompile.runtime import DEVICE_OF_KIND

#: Largest activation row count with kernels of its own (the issue's small-batch range).
MAX_KERNEL_ROWS = 16

#: Rows from which the dense prefill path is used (tools/bench.py prefill;
#: docs/design/gptq-checkpoints.md, "Prefill crossover").
PREFILL_ROWS = 128

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

_caches: dict[tuple, KernelCache] = {}

#: One dense weight buffer per layer shape, dtype and device, shared by the prefill calls of
#: every layer of that shape (calls of one model run one after another): fresh memory's page
#: faults would cost more than the dequantization, and a GPU keeps one buffer instead of a
#: dense copy per layer. Guarded by _scratch_lock.
_scratch: dict[tuple, torch.Tensor] = {}
_scratch_lock = threading.Lock()


#: QuantLinear modules by handle: the custom operator takes an int, which torch.compile keeps
#: as a constant of the graph, where a module could not be an operator's argument.
_modules: weakref.WeakValueDictionary[int, QuantLinear] = weakref.WeakValueDictionary()
_handles = itertools.count()


@torch.library.custom_op("qcompile::quant_linear", mutates_args=())
def quant_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """``y = x @ W + bias`` of the QuantLinear with this handle (``QuantLinear.handle``).

    Parameters
    ----------
    x : torch.Tensor, float32/float16/bfloat16 [..., K], CPU
    handle : int

    Returns
    -------
    torch.Tensor of x's dtype, shape [..., N], contiguous (never a view of x)
    """
    return _modules[handle].compute(x)


@quant_linear.register_fake
def _quant_linear_fake(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _modules[handle].out_features))


def row_plan(kernel_rows: Iterable[int], counts: int = MAX_KERNEL_ROWS) -> dict[int, int]:
    """Which kernel serves each row count: count R (1..``counts``) -> the smallest M >= R of
    ``kernel_rows`` (x zero-padded to M rows).

    Parameters
    ----------
    kernel_rows : iterable of int
        The M with kernels, each in 1..MAX_KERNEL_ROWS; the largest at least ``counts``.
    counts : int
        The largest row count a kernel serves: MAX_KERNEL_ROWS (16, which also serves the
        chunks of longer calls) unless ``prefill_rows`` sends fewer rows to the dense path.

    Returns
    -------
    dict of int to int
    """
    available = sorted(set(kernel_rows))
    if counts and (not available or available[0] < 1 or available[-1] > MAX_KERNEL_ROWS
                   or available[-1] < counts):
        raise ArgumentError(f"kernel rows must lie in 1..{MAX_KERNEL_ROWS} and reach "
                            f"{counts}; got {available}")
    return {count: next(m for m in available if m >= count) for count in range(1, counts + 1)}


def kernel_cache(target: str = "avx2", db: str | None = None, on_missing: str = "error",
                 tune_trials: int = 64) -> KernelCache:
    """The process-wide :class:`KernelCache` for these settings (layers of one shape share
    their kernels)."""
    key = (target, db, on_missing, tune_trials)
    if key not in _caches:
        _caches[key] = KernelCache(target, db, on_missing=on_missing, tune_trials=tune_trials)
    return _caches[key]


class QuantLinear(torch.nn.Module):
    """``y = x @ W + bias`` for one GPTQ layer (W [K, N] = in x out features).

    Parameters
    ----------
    layer : qcompile.gptq.GptqLayer
        The layer's checked tensors (``qcompile.gptq.load``).
    kernels : KernelCache
        Where tuned kernels come from (target, database, ``on_missing``).
    prefill_rows : int
        Rows from which a call takes the dense prefill path.
    int8_activations : bool
        Run the integer dot-product kernels (x rounded to int8 per group: about 1e-2 relative
        error; 2/3/4-bit layers). float16/bfloat16 x is converted to float32 for them.
    """

    def __init__(self, layer: GptqLayer, kernels: KernelCache, *,
                 prefill_rows: int = PREFILL_ROWS, int8_activations: bool = False) -> None:
        super().__init__()
        self.layer_name = layer.name
        self.in_features = layer.in_features
        self.out_features = layer.out_features
        self.bits = layer.bits
        self.group_size = layer.group_size
        self.act_order = layer.act_order
        self.kernels = kernels
        self.prefill_rows = prefill_rows
        self.int8_activations = int8_activations
        if int8_activations:
            layer.spec(m=1, int8_activations=True)  # its rules (bits, N), with their numbers
        self._checkpoint = layer.checkpoint
        self.device = torch.device(DEVICE_OF_KIND[kernels.preset.kind])
        base = layer.spec(m=1)
        self._prepared = FAMILY.prepare(base, device=self.device.type, **layer.kernel_tensors())
        self._plans: dict[tuple[int, str], int] = {}
        self._runners: dict[tuple[int, str], tuple] = {}
        self._layouts: dict[str, object] = {}
        self.handle = next(_handles)
        _modules[self.handle] = self

    @classmethod
    def from_gptq(cls, layer: GptqLayer, target: str = "avx2", db: str | None = None, *,
                  on_missing: str = "error", tune_trials: int = 64,
                  prefill_rows: int = PREFILL_ROWS,
                  int8_activations: bool = False) -> QuantLinear:
        """A QuantLinear for ``layer`` on ``target`` with kernels from database ``db``.

        ``on_missing`` says what a shape without a tuned record does: "error" (default; the
        message gives the command that tunes it), "untuned" (a correct untuned kernel, with a
        warning) or "tune" (tune ``tune_trials`` candidates on first use).
        """
        kernels = kernel_cache(target, db, on_missing, tune_trials)
        return cls(layer, kernels, prefill_rows=prefill_rows, int8_activations=int8_activations)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, group_size={self.group_size}, act_order={self.act_order}, "
                f"bias={'bias' in self._prepared.extras}, target={self.kernels.preset.name}, "
                f"device={self.device.type}")

    def spec(self, m: int, dtype: str = "float32") -> UniformSpec:
        if self.int8_activations:
            return UniformSpec(k=self.in_features, n=self.out_features, bits=self.bits,
                               group_size=self.group_size, m=m, int8_activations=True)
        return UniformSpec(k=self.in_features, n=self.out_features, bits=self.bits,
                           group_size=self.group_size, m=m, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] float32/float16/bfloat16 on the module's device (:attr:`device`: the
        CPU for CPU targets, the GPU for CUDA ones) -> [..., N] in x's dtype."""
        self._check(x)
        return quant_linear(x, self.handle)

    def _check(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise ArgumentError(f"x must be a torch.Tensor; got {type(x).__name__}")
        dtype = _DTYPES.get(x.dtype)
        if dtype is None:
            got = str(x.dtype).removeprefix("torch.")
            raise ArgumentError(f"x must be float32, float16 or bfloat16; got {got}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ArgumentError(f"x must have shape [..., K] with K={self.in_features} "
                                f"({self.layer_name}); got {list(x.shape)}")
        if x.device.type != self.device.type:
            raise ArgumentError(f"x is on {x.device}; {self.kernels.preset.name} kernels run "
                                f"on {self.device.type} (x.to({self.device.type!r}))")

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """What the custom operator runs: :meth:`forward` without the checks and outside
        autograd (x as forward checks it)."""
        dtype = _DTYPES[x.dtype]
        leading = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        count = rows.shape[0]
        if count == 0:
            y = rows.new_empty((0, self.out_features))
        elif count >= self.prefill_rows:
            y = self._prefill(rows)
        elif count > MAX_KERNEL_ROWS:
            y = torch.cat([self._kernel_rows(chunk, dtype)
                           for chunk in rows.split(MAX_KERNEL_ROWS)])
        else:
            y = self._kernel_rows(rows, dtype)
        return y.reshape(*leading, self.out_features)

    def _kernel_rows(self, rows: torch.Tensor, dtype: str) -> torch.Tensor:
        if self.int8_activations and dtype != "float32":  # the int8 kernel takes float32 x
            return self._kernel_rows(rows.to(torch.float32), "float32").to(rows.dtype)
        count = rows.shape[0]
        m, kernel, prepared = self._runner(count, dtype)
        if m > count:
            rows = torch.cat([rows, rows.new_zeros((m - count, self.in_features))])
        return kernel(rows.contiguous(), prepared)[:count]

    def _runner(self, count: int, dtype: str):
        """(M, kernel, prepared weights) serving ``count`` rows of ``dtype``, resolved once."""
        runner = self._runners.get((count, dtype))
        if runner is None:
            runner = self._make_runner(self._plan(count, dtype), dtype)
            self._runners[(count, dtype)] = runner
        return runner

    def _make_runner(self, m: int, dtype: str) -> tuple:
        spec = self.spec(m, dtype)
        kernel = self.kernels.get(spec, self._hint(m, dtype))
        return m, kernel, replace(self._packed(kernel), spec_digest=spec.digest())

    def kernel_dtype(self, dtype: str) -> str:
        """The activation dtype of the kernels that serve x of ``dtype`` (int8 kernels take
        float32 x)."""
        return "float32" if self.int8_activations else dtype

    def plan_rows(self, plan: dict[int, int], dtype: str = "float32", *,
                  prefill: bool = True) -> None:
        """Resolve now the kernel of every row count in ``plan``, so that no call looks up,
        builds or packs anything.

        Parameters
        ----------
        plan : dict of int to int
            Row count R -> the M whose kernel serves it (:func:`row_plan`).
        dtype : str
            x's dtype: "float32", "float16" or "bfloat16".
        prefill : bool
            Also build the prefill path's dequantization (calls of ``prefill_rows`` rows or
            more).

        Raises
        ------
        NoRecordError
            An M without a tuned record, under ``on_missing="error"``.
        """
        dtype = self.kernel_dtype(dtype)
        runners = {m: self._make_runner(m, dtype) for m in sorted(set(plan.values()))}
        for count, m in plan.items():
            self._runners[(count, dtype)] = runners[m]
        if prefill and self.device.type == "cpu":  # the GPU dequantizes with torch: no build
            from qcompile.kernels.uniform.dense import dequantizer

            dequantizer(self.spec(1), self.kernels.preset)

    def _packed(self, kernel):
        """The prepared weights in ``kernel``'s layout: packed once per layout and shared by
        every kernel that reads it (the GPTQ-layout copy serves prefill and dequantization)."""
        key = repr(kernel.layout)
        packed = self._layouts.get(key)
        if packed is None:
            packed = kernel.relayout(self._prepared)
            self._layouts[key] = packed
        return packed

    def _plan(self, count: int, dtype: str) -> int:
        """The M that serves ``count`` rows: the smallest M >= count with a tuned record, else
        ``count`` itself (whose resolution then follows ``on_missing``)."""
        key = (count, dtype)
        if key not in self._plans:
            found = next((m for m in range(count, MAX_KERNEL_ROWS + 1)
                          if self.kernels.has_record(self.spec(m, dtype))), None)
            self._plans[key] = found or count
        return self._plans[key]

    def _hint(self, m: int, dtype: str) -> str:
        if self._checkpoint is None:
            return ""
        dtype_flag = "" if dtype == "float32" else f" --dtype {dtype}"
        if self.int8_activations:
            dtype_flag = " --int8-activations"
        return (f"; or for every layer of the checkpoint: qcompile tune --from-gptq "
                f"{self._checkpoint} --target {self.kernels.preset.name} --batch {m}{dtype_flag}")

    def dense_weight(self) -> torch.Tensor:
        """W [K, N] float32 on the module's device, in the prepared row order (act_order:
        rows P)."""
        return self._dequantize(torch.float32)

    def _dequantize(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """W [K, N] of ``dtype`` (float32 on the CPU, whose compiled dequantization writes
        float32), into ``out`` when given."""
        if self.device.type == "cpu":
            from qcompile.kernels.uniform.dense import dequantize

            return dequantize(self.spec(1), self._prepared, self.kernels.preset, out=out)
        return dequantize_on_device(self.spec(1), self._prepared, dtype, out=out)

    def _prefill(self, rows: torch.Tensor) -> torch.Tensor:
        # the CPU multiplies in float32 (its GEMM), the GPU in x's dtype with float32 sums
        # (cuBLAS), as a dense fp16/bf16 layer would
        dtype = rows.dtype if self.device.type == "cuda" else torch.float32
        permutation = self._prepared.extras.get("perm")
        x = rows.to(dtype)
        if permutation is not None:
            x = x[:, permutation]
        shape = (self.in_features, self.out_features, dtype, self.device)
        with _scratch_lock:
            if shape not in _scratch:
                _scratch[shape] = torch.empty(shape[:2], dtype=dtype, device=self.device)
            y = x @ self._dequantize(dtype, out=_scratch[shape])
        bias = self._prepared.extras.get("bias")
        if bias is not None:
            y = y.float().add_(bias)
        return y.to(rows.dtype)


def replace_linear(model: torch.nn.Module, layers, *, config: QuantizeConfig | dict | None = None,
                   target: str = "avx2", db: str | None = None, on_missing: str = "error",
                   tune_trials: int = 64, int8_activations: bool = False) -> list[str]:
    """Replace the ``nn.Linear`` modules of ``model`` named in ``layers`` by QuantLinear.

    Parameters
    ----------
    model : torch.nn.Module
    layers : dict of str to GptqLayer, or a GPTQ state dict
        ``qcompile.gptq.load(path)``, or tensors named ``<module>.qweight`` etc. (then
        ``config`` gives the quantization settings, a QuantizeConfig or its JSON dict).
    target, db, on_missing, tune_trials
        As :meth:`QuantLinear.from_gptq`.
    int8_activations : bool
        Integer dot-product kernels for the 2/3/4-bit layers (8-bit layers keep float32
        activations); see :class:`QuantLinear`.

    Returns
    -------
    list of str
        The names of the replaced modules. A named module that is missing, not an
        ``nn.Linear``, or of another shape raises FormatError.
    """
    if layers and not all(isinstance(v, GptqLayer) for v in layers.values()):
        if config is None:
            raise FormatError("a GPTQ state dict needs its quantization config (config=...)")
        if isinstance(config, dict):
            config = QuantizeConfig.from_dict(config, "config")
        layers = layers_from_state_dict(layers, config)
    kernels = kernel_cache(target, db, on_missing, tune_trials)
    replaced = []
    for name, layer in layers.items():
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise FormatError(f"the model has no module {name!r} for GPTQ layer {name}") from None
        if not isinstance(module, torch.nn.Linear):
            raise FormatError(f"{name} is a {type(module).__name__}, not an nn.Linear")
        if (module.in_features, module.out_features) != (layer.in_features, layer.out_features):
            raise FormatError(
                f"{name}: the model's nn.Linear is {module.in_features}x{module.out_features} "
                f"(in x out) but the checkpoint's layer is "
                f"{layer.in_features}x{layer.out_features}")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        int8 = int8_activations and layer.bits in INT8_BITS
        setattr(parent, child, QuantLinear(layer, kernels, int8_activations=int8))
        replaced.append(name)
    return replaced


__all__ = ["MAX_KERNEL_ROWS", "PREFILL_ROWS", "NoRecordError", "QuantLinear", "kernel_cache",
           "replace_linear"]
