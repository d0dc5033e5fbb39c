"""The one module of the harness that reaches into qcompile past its public surface.

Keeping every such import here means a move inside qcompile touches this file only. Everything
else in tools/ uses ``qcompile.kernels`` (families, specs), ``qcompile.kernel_cache``,
``qcompile.build``, ``qcompile.runtime``/``qcompile.load`` and ``qcompile.tune``.
"""

from __future__ import annotations

import numpy as np


def quantized_activations(x: np.ndarray, group_size: int) -> np.ndarray:
    """x rounded to int8 per row and K group, as the int8-activation kernels do (float64)."""
    from qcompile.kernels.tir.activations import quantized_activations as rounded

    return rounded(x, group_size)


def gptq_codes(qweight: np.ndarray, bits: int, k: int) -> np.ndarray:
    """Unpacked GPTQ weight codes [K, N] (int64)."""
    from qcompile.formats import bitpack

    return bitpack.unpack(qweight, bits, k).astype(np.int64)


def gptq_zeros(qzeros: np.ndarray, bits: int, n: int, convention: str = "v1") -> np.ndarray:
    """Zero-points [groups, N] of packed GPTQ ``qzeros`` (v1 stores z - 1)."""
    from qcompile.formats.gptq import unpack_zeros

    return unpack_zeros(qzeros, bits, n, convention).astype(np.int64)


def pack_gptq_zeros(zeros: np.ndarray, bits: int, convention: str = "v1") -> np.ndarray:
    from qcompile.formats.gptq import pack_zeros

    return pack_zeros(zeros, bits, convention)


def kernel_ready(tensor):
    """``tensor`` when compact and aligned as the compiled functions want it, else a copy."""
    from qcompile.tensors import kernel_ready as ready

    return ready(tensor)


def gptq_tensors(tensors: dict, bits: int, group_size: int):
    """``qcompile.formats.gptq.GptqTensors`` of a uniform family's example tensors."""
    from qcompile.formats.gptq import GptqTensors

    return GptqTensors.from_tensors(qweight=tensors["qweight"], scales=tensors["scales"],
                                    qzeros=tensors["qzeros"], g_idx=tensors.get("g_idx"),
                                    bits=bits, group_size=group_size)


def scrambled_g_idx(plain, rng):
    """The same GPTQ codes with a scrambled g_idx, as GPTQ's desc_act writes it."""
    from qcompile.formats.gptq import GptqTensors

    k = plain.in_features
    g_idx = (np.arange(k) // plain.group_size)[np.argsort(rng.permutation(k))].astype(np.int32)
    return GptqTensors.from_tensors(qweight=plain.qweight, scales=plain.scales,
                                    qzeros=plain.qzeros, bits=plain.bits,
                                    group_size=plain.group_size, g_idx=g_idx)


def replay_best(storage, spec, onto, preset, out_dir):
    """(path of the exported .so, record id): ``spec``'s best record replayed on the workload
    of ``onto`` (another spec of the same family: the same schedule, e.g. with act_order)."""
    from qcompile import _tvm
    from qcompile.build import export
    from qcompile.trust.workloads import workload_database
    from schedules.variants import compute_for

    target = _tvm.Target(preset.tvm_target(preset.hardware()))
    _, record = workload_database(storage, spec, target).best(
        _tvm.normalize_mod(compute_for(spec, preset.kind)))
    mod = workload_database(storage, onto, target).replay(
        _tvm.normalize_mod(compute_for(onto, preset.kind)), record)
    so, _ = export(onto, preset, target, mod, out_dir,
                   {"id": record.id, "replayed_from": spec.name()})
    return so, record.id


def tvm_target(preset):
    """The TVM target of a target preset on this host's hardware."""
    from qcompile import _tvm

    return _tvm.Target(preset.tvm_target(preset.hardware()))
