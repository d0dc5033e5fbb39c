"""The one module of the harness that reaches into qcompile past its public surface.

qcompile's kernels are being reorganised (variants, layouts and quantizers moving); keeping
every such import here means a move touches this file only. Everything else in tools/ uses
``qcompile.kernels`` (families, specs), ``qcompile.kernel_cache``, ``qcompile.build``,
``qcompile.runtime``/``qcompile.load`` and ``qcompile.tune``.
"""

from __future__ import annotations

import numpy as np


def quantized_activations(x: np.ndarray, group_size: int) -> np.ndarray:
    """x rounded to int8 per row and K group, as the int8-activation kernels do (float64)."""
    from qcompile.kernels.uniform.compute_int8 import quantized_activations as rounded

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
