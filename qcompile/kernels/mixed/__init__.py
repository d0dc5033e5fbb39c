"""Mixed 2/4/16-bit matrices with sparse fp16 outliers (mixed-2-4-16-async-dequant.md)."""

from qcompile.kernels.mixed.family import FAMILY, MixedFamily
from qcompile.kernels.mixed.spec import MixedSpec

__all__ = ["FAMILY", "MixedFamily", "MixedSpec"]
