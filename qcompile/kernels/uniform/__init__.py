"""Uniform quantized GEMV/GEMM (QIGen; GPTQ layouts)."""

from qcompile.kernels.uniform.family import FAMILY, UniformFamily
from qcompile.kernels.uniform.spec import UniformSpec

__all__ = ["FAMILY", "UniformFamily", "UniformSpec"]
