"""Checks and conversions for tensors crossing into compiled kernels.

TVM kernels assume compact, 64-byte aligned buffers of an exact dtype and shape; a violation is
a wrong answer or a crash, not an exception. Everything handed to a kernel goes through here and
fails with a ValueError (ArgumentError) that names the argument and the numbers.
"""

from __future__ import annotations

import numpy as np

from qcompile.errors import ArgumentError

_ALIGNMENT = 64


def to_torch(name: str, value):
    """A torch tensor sharing memory with ``value`` (torch.Tensor or numpy.ndarray)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise ArgumentError(
        f"{name} must be a torch.Tensor or numpy.ndarray; got {type(value).__name__}")


def kernel_ready(tensor):
    """``tensor`` itself when compact and 64-byte aligned, else an aligned compact copy."""
    import torch

    if tensor.is_contiguous() and tensor.data_ptr() % _ALIGNMENT == 0:
        return tensor
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    out.copy_(tensor)
    return out


def activation(x, *, rows: int, cols: int, dtype: str, device):
    """Check an activation and return it as a kernel-ready [rows, cols] tensor.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape [cols] (when rows == 1) or [rows, cols]
    rows, cols : int
        The batch M and the reduction length K the kernel was compiled for.
    dtype : str
        The activation dtype the kernel was compiled for ("float32", ...).
    device : torch.device
        Where the prepared weights live.

    Returns
    -------
    (torch.Tensor of shape [rows, cols], bool)
        The tensor, and whether the input was 1-D (the output is squeezed back).
    """
    x = to_torch("x", x)
    want = f"torch.{dtype}"
    if str(x.dtype) != want:
        got = str(x.dtype).removeprefix("torch.")
        raise ArgumentError(f"x must be {dtype} for this kernel; got {got}")
    squeeze = x.dim() == 1
    shape = tuple(x.shape)
    if squeeze and rows == 1:
        x = x.reshape(1, -1)
    if x.dim() != 2 or tuple(x.shape) != (rows, cols):
        expect = f"[{cols}] or [{rows}, {cols}]" if rows == 1 else f"[{rows}, {cols}]"
        raise ArgumentError(f"x must have shape {expect} (M={rows}, K={cols}); got {list(shape)}")
    if x.device != device:
        raise ArgumentError(f"x is on {x.device} but the kernel's weights are on {device}")
    return kernel_ready(x), squeeze
