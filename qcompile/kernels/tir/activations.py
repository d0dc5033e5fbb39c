"""int8 activations: x rounded per row and group to [-127, 127], on the host (what a kernel
multiplies, for references) and in TIR (the blocks that round x on a GPU)."""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.tir.planes import STEP

#: Activations are scaled to [-127, 127].
X_LEVELS = 127


def quantized_activations(x, group_size: int):
    """The activations the kernel actually multiplies, dequantized (host side, numpy).

    Parameters
    ----------
    x : numpy.ndarray of float32, shape [M, K]
    group_size : int
        The spec's group size (-1: K).

    Returns
    -------
    numpy.ndarray of float64, shape [M, K]
        ``rint(x * (127 / amax)) * amax / 127`` per row and group, rounded as the kernel
        rounds (float32, ties to even): ``x_hat @ W`` is the kernel's output up to float32
        accumulation. ``x - x_hat`` is the int8 rounding error.
    """
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    size = k if group_size == -1 else group_size
    groups = x.reshape(m, k // size, size)
    amax = np.abs(groups).max(axis=2, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    inverse = np.where(amax > 0, np.float32(X_LEVELS) / safe, np.float32(0)).astype(np.float32)
    codes = np.rint((groups * inverse).astype(np.float32))
    return (codes.astype(np.float64) * (amax.astype(np.float64) / X_LEVELS)).reshape(m, k)


def quantized(value, inverse):
    """int32 ``rint(value * inverse)``, in [-127, 127] (``inverse`` = 127 / amax, or 0)."""
    return T.Cast("int32", T.nearbyint(value * inverse))


def inverse_of(amax, portable: bool = False):
    """float32 ``127 / amax``, or 0 for an all-zero group (its codes are then all 0).

    Rounded as IEEE division (``__fdiv_rn``): TVM compiles CUDA with ``--use_fast_math``, whose
    approximate division would round some activations differently from the host's
    (tir.activations.quantized_activations), and the kernel would not compute what it documents.
    """
    if portable:
        quotient = T.float32(X_LEVELS) / amax
    else:
        quotient = T.call_pure_extern("float32", "__fdiv_rn", T.float32(X_LEVELS), amax)
    return T.Select(amax > T.float32(0), quotient, T.float32(0))


def step_of(amax):
    """float32 ``amax / 127``: the value of one step of x's int8 grid (what the sums of
    rounded x are scaled back by)."""
    return amax * T.float32(1.0 / X_LEVELS)


def packed_word(values):
    """int32 of :data:`STEP` int32 values in [-128, 127], byte j holding value j (two's
    complement bytes, little-endian): the x word a dp4a takes."""
    word = T.uint32(0)
    for j, value in enumerate(values):
        byte = T.bitwise_and(T.Cast("uint32", value), T.uint32(0xFF))
        word = T.bitwise_or(word, T.shift_left(byte, T.uint32(8 * j)))
    return T.Cast("int32", word)


def quantize_x_blocks(M: int, G: int, gsize: int, column, word, portable: bool = False):
    """A TIR macro ``(x, order, x_amax, x_inverse, xq_words, xq_sum, x_step)``: the blocks that
    round x [M, K] to int8 per row and group of ``gsize`` (``x_amax``, ``x_inverse``,
    ``x_pack``, ``x_qsum``, ``x_step``; see the module docstring), shared by the dp4a and
    tensor-core computes and the mixed family's dp4a compute (a new macro per function: TVM
    suffixes the block names of a macro's later expansions).

    ``column(order, m, g, r)``: the column of x holding element r of group g (``order``: the
    macro's argument, the mixed family's group order; the uniform family passes x and ignores
    it). ``word(x, order, m, g, w, inverse)``: int32 word w of group g's rounded x, in the
    storage order of the codes it multiplies."""
    group_words = gsize // STEP            # int32 words of x per group

    @T.macro
    def quantize(x, order, x_amax, x_inverse, xq_words, xq_sum, x_step):
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_amax"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():  # the identity of max, so TVM matches a reducer across threads
                    x_amax[vm, vg] = T.min_value("float32")
                x_amax[vm, vg] = T.max(x_amax[vm, vg], T.fabs(x[vm, column(order, vm, vg, vr)]))
        for m, g in T.grid(M, G):
            with T.sblock("x_inverse"):
                vm, vg = T.axis.remap("SS", [m, g])
                x_inverse[vm, vg] = inverse_of(x_amax[vm, vg], portable)
        for m, g, w in T.grid(M, G, group_words):
            with T.sblock("x_pack"):
                vm, vg, vw = T.axis.remap("SSS", [m, g, w])
                xq_words[vm, vg * group_words + vw] = word(x, order, vm, vg, vw,
                                                           x_inverse[vm, vg])
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_qsum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    xq_sum[vm, vg] = 0
                xq_sum[vm, vg] = xq_sum[vm, vg] + quantized(
                    x[vm, column(order, vm, vg, vr)], x_inverse[vm, vg])
        for m, g in T.grid(M, G):
            with T.sblock("x_step"):
                vm, vg = T.axis.remap("SS", [m, g])
                x_step[vm, vg] = step_of(x_amax[vm, vg])

    return quantize
