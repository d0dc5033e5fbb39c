"""The local GEMM of a tensor-parallel rank: ``y = x @ W_shard`` for one quantized shard.

Two backends, chosen explicitly by the caller:

- :class:`KernelLinear` runs a compiled qcompile kernel (``qcompile.load`` from a directory, or
  any function from a spec to a loaded kernel, such as ``KernelCache.get``) on the shard;
- :class:`TorchDequantLinear` is the torch fallback, named as such: it dequantizes the shard once
  and multiplies with ``torch.matmul`` in the requested dtype (how the TP-aware paper measured
  its GEMMs, in fp16). It serves GPUs until qcompile's CUDA kernels cover a shape.

A shard is a :class:`~qcompile.formats.gptq.GptqTensors` or, for the rank-sorted algorithm's
down layer, a :class:`~qcompile.tp.sorted_rows.SortedRowShard`, which the kernels run in its
padded sequential layout (:meth:`~qcompile.tp.sorted_rows.SortedRowShard.sequential`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

import qcompile
from qcompile.errors import ArgumentError
from qcompile.formats.gptq import GptqTensors
from qcompile.kernels.uniform import UniformSpec
from qcompile.kernels.uniform.compute_cuda_mma_f16 import GROUP_SIZES, UNIT_ROWS
from qcompile.runtime import Kernel
from qcompile.tp.sorted_rows import SortedRowShard

#: The activation dtypes of the tensor-core kernels (compute_cuda_mma_f16).
_HALF_DTYPES = ("float16", "bfloat16")


#: :meth:`SortedRowShard.sequential`'s arguments for the tensor-core kernels (fp16/bf16
#: activations, compute_cuda_mma_f16): the group sizes they take, and K_pad a multiple of their
#: unit of rows (128). Their K split (``k_split``) does not need the units to divide evenly, so
#: the padded shard splits as the unsorted one of the same N does.
HALF_LAYOUT = {"row_multiple": UNIT_ROWS, "group_sizes": tuple(g for g in GROUP_SIZES if g > 0)}


def kernel_layer(shard: GptqTensors | SortedRowShard,
                 dtype: str = "float32") -> tuple[np.ndarray | None, GptqTensors]:
    """The sequential layer a uniform kernel of activations ``dtype`` runs for ``shard``, and
    the gather of its input.

    Returns
    -------
    index : numpy.ndarray of int64 [K_kernel], or None
        Columns of the shard's input [M, K_local] with a zero column appended (index K_local)
        that the kernel reads, in order (a padded SortedRowShard); None: the input as it is.
    layer : GptqTensors
        [K_kernel, N_local]: ``shard`` itself, or a SortedRowShard's ``sequential()`` layer.
    """
    if isinstance(shard, SortedRowShard):
        index, layer = shard.sequential(
            **(HALF_LAYOUT if dtype in _HALF_DTYPES else {}))
        if np.array_equal(index, np.arange(shard.in_features)):
            index = None  # no padding (whole groups, e.g. TP = 1): no gather per call
        return index, layer
    return None, shard


def shared_kernel_layer(shard: GptqTensors | SortedRowShard, dtype: str,
                        shared: dict) -> tuple[np.ndarray | None, GptqTensors]:
    """:func:`kernel_layer` of ``shard``, made once per (shard, dtype) and kept in ``shared``
    (the dict that :class:`KernelLinear`'s of one shard at several M share)."""
    key = (id(shard), dtype)
    if key not in shared:
        shared[key] = kernel_layer(shard, dtype)
    return shared[key]


def shard_spec(shard: GptqTensors | SortedRowShard, rows: int, dtype: str = "float32",
               shared: dict | None = None) -> UniformSpec:
    """The uniform kernel spec that multiplies ``rows`` activation rows of ``dtype`` ("float32",
    "float16" or "bfloat16") by ``shard`` (by its :func:`kernel_layer`; kept in ``shared``
    when given)."""
    _, layer = shared_kernel_layer(shard, dtype, {} if shared is None else shared)
    return UniformSpec(k=layer.in_features, n=layer.out_features, bits=layer.bits,
                       group_size=layer.group_size, m=rows, dtype=dtype)


class KernelLinear:
    """``y = x @ W_shard`` through a compiled qcompile kernel.

    Parameters
    ----------
    shard : GptqTensors or SortedRowShard
        A sequential (trivial g_idx) shard [K_local, N_local], or a rank-sorted row shard (run
        in its padded sequential layout, see :func:`kernel_layer`).
    kernels : str, Path or callable
        Directory holding ``<spec name>.so`` and its manifest for ``shard_spec(shard, rows)``
        (``qcompile build`` writes them), or a function from that spec to its loaded
        :class:`~qcompile.runtime.Kernel` (``qcompile.kernel_cache.KernelCache(...).get``).
    rows : int
        Activation rows M per call.
    dtype : str
        The activations' dtype: "float32", or "float16"/"bfloat16" (on a GPU, the tensor-core
        kernels).
    shared : dict, optional
        One dict for the KernelLinears of one shard at several M: its padded layer and its
        weights in each layout are made once and kept there.
    """

    backend = "qcompile"

    def __init__(self, shard: GptqTensors | SortedRowShard,
                 kernels: str | Path | Callable[[UniformSpec], Kernel], rows: int,
                 dtype: str = "float32", shared: dict | None = None) -> None:

        shared = {} if shared is None else shared
        index, layer = shared_kernel_layer(shard, dtype, shared)
        spec = shard_spec(layer, rows, dtype)
        if callable(kernels):
            self.kernel = kernels(spec)
        else:
            self.kernel = qcompile.load(str(Path(kernels) / f"{spec.name()}.so"))
        key = (id(shard), dtype, repr(self.kernel.layout))
        if key not in shared:
            shared[key] = self.kernel.prepare(qweight=layer.qweight, scales=layer.scales,
                                              qzeros=layer.qzeros,
                                              zero_convention=layer.zero_convention)
        # kernels of several M read one packing; each checks the digest of its own spec
        self.weights = replace(shared[key], spec_digest=spec.digest())
        self.in_features = shard.in_features
        self._set_index(index)

    def gather_first(self, columns: np.ndarray) -> None:
        """From now on take x with its columns in the order before ``columns`` (int64 [K_local],
        a permutation): ``self(x)`` computes what ``self(x[:, columns])`` did, in one gather
        (the rank-sorted algorithm's local sort Q_r and the padded layout's index composed)."""
        columns = np.asarray(columns, dtype=np.int64)
        if columns.shape != (self.in_features,) or not np.array_equal(
                np.sort(columns), np.arange(self.in_features)):
            raise ArgumentError(f"columns must be a permutation of 0..{self.in_features - 1}; "
                                f"got {columns.size} values")
        if self.index is None:
            index = columns
        else:  # the zero column (index K_local) stays where it is
            index = self.index.cpu().numpy()
            index = np.where(index < self.in_features,
                             columns[np.minimum(index, self.in_features - 1)], index)
        self._set_index(index)

    def _set_index(self, index: np.ndarray | None) -> None:
        """The columns of x the kernel reads (None: x as it is), on the kernel's device, and
        ``pads``: whether they include the zero column (padding rows) or only permute."""
        import torch

        self.index = (None if index is None else
                      torch.from_numpy(np.ascontiguousarray(index)).to(self.kernel.device))
        self.pads = index is not None and bool((index == self.in_features).any())

    def __call__(self, x):
        """x: [M, K_local] of the spec's dtype on the kernel's device -> [M, N_local], same
        dtype."""
        import torch

        if self.index is not None:
            if x.dim() != 2 or x.shape[1] != self.in_features:
                raise ArgumentError(f"x must have shape [M, {self.in_features}] (K_local of the "
                                    f"shard); got {list(x.shape)}")
            if self.pads:  # the padded layout: a zero column feeds the padding rows
                x = torch.nn.functional.pad(x, (0, 1))
            x = x[:, self.index]
        return self.kernel(x, self.weights)


class TorchDequantLinear:
    """The torch fallback: the shard dequantized once, then ``x @ W`` with torch.

    Parameters
    ----------
    shard : GptqTensors or SortedRowShard
        [K_local, N_local], any g_idx (dequantized as it is: no padding).
    dtype : torch.dtype
        Dtype of the dense weight and of the activations it accepts (fp16 on GPUs).
    device : str or torch.device
    """

    backend = "torch-dequant"

    def __init__(self, shard: GptqTensors, dtype, device) -> None:
        import torch

        weight = shard.dequantize().astype(np.float32)
        self.weight = torch.from_numpy(weight).to(device=device, dtype=dtype)

    def __call__(self, x):
        """x: [M, K_local] in the weight's dtype and device -> [M, N_local]."""
        if x.dtype != self.weight.dtype or x.device != self.weight.device:
            raise ArgumentError(
                f"x must be {self.weight.dtype} on {self.weight.device}; "
                f"got {x.dtype} on {x.device}"
            )
        return x @ self.weight
