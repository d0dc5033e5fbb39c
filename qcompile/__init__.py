"""qcompile: an autotuning compiler service for quantized LLM kernels, built on Apache TVM.

The light entry points are importable without TVM: ``import qcompile`` costs milliseconds, and
TVM (seconds to import) loads only when a kernel is loaded, built or tuned.

>>> k = qcompile.load("kernels/uniform_b4_g128_k4096_n4096_m1_f32.so")   # doctest: +SKIP
>>> w = k.prepare(qweight=qweight, scales=scales, qzeros=qzeros)       # doctest: +SKIP
>>> y = k(x, w)                                                         # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qcompile._version import __version__

if TYPE_CHECKING:
    from qcompile.runtime import Kernel


def load(path: str) -> Kernel:
    """Load a kernel exported by ``qcompile build``.

    Parameters
    ----------
    path : str
        Path of the ``<name>.so``; its manifest ``<name>.json`` must sit beside it.

    Returns
    -------
    Kernel
        Callable as ``kernel(x, prepared)``; see :class:`qcompile.runtime.Kernel`.

    Raises
    ------
    qcompile.errors.LoadError
        One line, when the manifest is missing, corrupt or malformed in any way, the ``.so``
        does not match the sha256 the manifest records, or this host lacks a CPU flag (or the
        GPU architecture) the library needs. These checks catch accidents and mismatched
        copies; they cannot make a library from someone you do not trust safe to load
        (:func:`qcompile.runtime.load_kernel`).
    """
    from qcompile.runtime import load_kernel  # here: keeps ``import qcompile`` to milliseconds

    return load_kernel(path)


__all__ = ["__version__", "load"]
