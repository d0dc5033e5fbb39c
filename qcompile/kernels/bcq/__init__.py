"""Binary-coding quantized GEMV/GEMM by table lookups (LUT-GEMM)."""

from qcompile.kernels.bcq.family import FAMILY, BcqFamily
from qcompile.kernels.bcq.spec import BcqSpec

__all__ = ["FAMILY", "BcqFamily", "BcqSpec"]
