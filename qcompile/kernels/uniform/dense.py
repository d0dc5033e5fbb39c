"""The uniform family's weights dequantized to a dense fp32 matrix: the first half of the prefill
path (``x @ W`` by torch's GEMM once M is large).

One TensorIR block, ``dequantize``: ``w[k, n] = s[g, n] * (q[k, n] - z[g, n])`` over the
operands ``prepare`` made (rows already in act_order's P order), with a fixed schedule: packed
words of K in parallel, the fields of a word unrolled, N vectorized. It only streams the codes
in and the matrix out, so there is nothing to tune: it runs near memory bandwidth as it is.
"""

from __future__ import annotations

import math
import threading

from qcompile import _tvm
from qcompile._tvm import T
from qcompile.kernels.base import PreparedWeights
from qcompile.kernels.layouts.uniform import describe
from qcompile.kernels.tir.codes import field_expr, field_scale_expr, fields_per_word
from qcompile.kernels.uniform.spec import UniformSpec

_built: dict[tuple[str, str], object] = {}
_lock = threading.Lock()


def dequantize_compute(spec: UniformSpec):
    """PrimFunc ``(qweight int32 [K*bits/32, N], scales float16 [G, N], zeros uint8 [G, N])
    -> w float32 [K, N]`` for ``spec``'s K, N, bits and group size."""

    K, N, G = spec.k, spec.n, spec.groups
    rows, bits, gsize = spec.packed_rows, spec.bits, spec.effective_group_size
    symbol = f"dequantize_b{spec.bits}_g{gsize}_k{K}_n{N}"

    @T.prim_func(s_tir=True)
    def dequantize(
        qweight: T.Buffer((rows, N), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        w: T.Buffer((K, N), "float32"),
    ):
        T.func_attr({"global_symbol": symbol, "tirx.noalias": True})
        for k, n in T.grid(K, N):
            with T.sblock("dequantize"):
                vk, vn = T.axis.remap("SS", [k, n])
                w[vk, vn] = T.Cast("float32", scales[vk // gsize, vn]) * (
                    field_expr(qweight, vk, vn, bits) * field_scale_expr(vk, bits)
                    - T.Cast("float32", zeros[vk // gsize, vn]))

    return dequantize


def schedule(sch, spec: UniformSpec, lanes: int):
    """Words of K in parallel, each word's fields unrolled, N in vectors of ``lanes``."""
    block = sch.get_sblock("dequantize")
    k, n = sch.get_loops(block)
    words, fields = sch.split(k, factors=[None, fields_per_word(spec.bits)])
    n_outer, n_lanes = sch.split(n, factors=[None, math.gcd(spec.n, lanes)])
    sch.reorder(words, n_outer, fields, n_lanes)
    sch.parallel(words)
    sch.unroll(fields)
    sch.vectorize(n_lanes)
    return sch


def dequantizer(spec: UniformSpec, preset):
    """The compiled dequantization for ``spec`` on CPU ``preset``, built once per process."""
    key = (f"{spec.bits}/{spec.group_size}/{spec.k}/{spec.n}", preset.name)
    with _lock:
        if key not in _built:

            hw = preset.hardware()
            sch = schedule(_tvm.Schedule(dequantize_compute(spec)), spec, hw.fp32_lanes)
            target = _tvm.Target(preset.tvm_target(hw))
            function = _tvm.tvm.compile(sch.mod, target=target)
            _built[key] = function[sch.mod["main"].attrs["global_symbol"]]
        return _built[key]


def dequantize(spec: UniformSpec, prepared: PreparedWeights, preset, out=None):
    """W [K, N] float32 (rows in the prepared order) from ``prepare``'s operands:
    ``scales[g] * (q - zeros[g])`` with ``g = k // group_size``.

    ``out`` (float32 [K, N], contiguous) is written instead of a new tensor: reusing one buffer
    saves the page faults of fresh memory, which cost more than the dequantization itself here
    (docs/design/gptq-checkpoints.md, "Prefill crossover")."""
    import torch

    if out is None:
        out = torch.empty((spec.k, spec.n), dtype=torch.float32)
    elif out.shape != (spec.k, spec.n) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{spec.k}, {spec.n}] tensor; got "
                         f"{str(out.dtype).removeprefix('torch.')} {list(out.shape)}")
    layout = prepared.extras.get("layout")
    if layout is not None:

        raise ValueError(f"dequantize reads GPTQ's layout; these weights are packed as "
                         f"{describe(layout)}: prepare them without a layout")
    dequantizer(spec, preset)(*prepared.tensors[:3], out)
    return out
