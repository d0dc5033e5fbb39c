"""Weight layouts of the mixed family, chosen by the CPU schedule and packed at ``prepare`` time.

The format's default layout (formats/mixed.py) stores every per-column operand as [rows, N]: a
kernel that owns a tile of ``T`` columns reads ``4*T`` bytes of ``codes2`` per 16 rows, then
jumps a whole row of N (112 KiB at N = 28672): a new page per 2-bit group, in each of seven
strided streams per tile (codes2, meta2, scale2, zero2, codes4, scales4, zeros4), which the
hardware prefetchers do not follow across pages.

``n_tiled`` (tile T, a multiple of g2) is the uniform family's blocked layout
(layouts/uniform.py) for those seven operands: column tiles of T stored whole and contiguous,
row-major inside::

    codes2   [N/T, K2/16, T]      int32      codes2_tiled[j, r, c] = codes2[r, j*T + c]
    meta2    [N/T, G2, T]         uint8
    scale2   [N/T, G2, T/g2]      float16    scale2_tiled[j, g, c] = scale2[g, j*T/g2 + c]
    zero2    [N/T, G2, T/g2]      uint8
    codes4   [N/T, K4/8, T]       int32
    scales4  [N/T, K4/g4, T]      float16
    zeros4   [N/T, K4/g4, T]      uint8

so a parallel task that reads consecutive tiles reads one contiguous range of each. The
int8-activation kernel (compute_int8.py) reads codes2 and codes4 as byte planes [R, 1, N, 4];
tiled, they are [N/T, R, 1, T, 4] (layouts/uniform.py's int8 form), the others as above.
``plane_words`` (layouts/uniform.py) is the CUDA int8 kernel's (compute_cuda_int8.py): codes2 and
codes4 as those byte planes read as int32 words [R, 1, N] (the format's own words), the other
operands unchanged; its compute fixes it, and :func:`layout_of` knows it by the compute name.
``order`` and the CSR outliers (``row_ptr``, ``cols``, ``values``) keep their layout: they are
indexed by data, not by the tile. The CPU design space applies the layout with
``transform_layout`` on the function's parameters, so it is part of the schedule's trace (hence
of the tuning record); :func:`layout_of` reads it back from a scheduled function, the build
writes it into the manifest and ``prepare`` packs the arrays for it.
"""

from __future__ import annotations

import numpy as np

from qcompile.errors import SpecError
from qcompile.kernels.layouts.uniform import (
    N_TILED,
    PLANE_WORDS,
    describe,
    has_block,
    n_tiled,
    plane_words,
    plane_words_of,
)

__all__ = ["N_TILED", "OPERANDS", "PLANE_WORDS", "apply", "describe",
           "layout_of", "n_tiled", "pack", "plane_words", "unpack"]

#: Operands the layout rewrites: (name, a block that reads it, whether one of its columns
#: covers g2 columns of W: the second-order operands).
OPERANDS = (
    ("codes2", "group_dot2", False),
    ("meta2", "scale1", False),
    ("scale2", "scale1", True),
    ("zero2", "scale1", True),
    ("codes4", "group_dot4", False),
    ("scales4", "combine4", False),
    ("zeros4", "combine4", False),
)


def check_tile(n: int, g2: int, tile_n: int) -> None:
    """Raise SpecError unless ``tile_n`` divides N and is a multiple of g2 (a tile holds whole
    second-order groups)."""
    if tile_n <= 0 or n % tile_n or tile_n % g2:
        raise SpecError(f"layout tile {tile_n} must divide N={n} and be a multiple of g2={g2}")


def apply(sch, n: int, g2: int, tile_n: int) -> None:
    """Rewrite the per-column operands of ``sch``'s function into column tiles of ``tile_n``.

    Parameters
    ----------
    sch : Schedule
        An unscheduled mixed workload (compute.py).
    n : int
        N, which ``tile_n`` must divide.
    g2 : int
        Columns per second-order group; ``tile_n`` must be a multiple.
    tile_n : int
        Columns per tile.
    """
    check_tile(n, g2, tile_n)
    int8 = _is_int8(sch)
    for buffer, block, second_order in OPERANDS:
        if int8 and buffer in _PLANE_READERS:  # byte planes [U, 1, N, 4]
            sch.transform_layout(sch.get_sblock(_PLANE_READERS[buffer]), buffer,
                                 _plane_tiles_of(tile_n))
            continue
        per_tile = tile_n // g2 if second_order else tile_n
        sch.transform_layout(sch.get_sblock(block), buffer, _tiles_of(per_tile))


#: The int8-activation compute (compute_int8.py) reads its codes as byte planes in these blocks.
_PLANE_READERS = {"codes2": "unpack2", "codes4": "unpack4"}


def _is_int8(sch) -> bool:
    """Whether ``sch`` is the int8-activation compute (its codes are unpacked as bytes)."""
    return has_block(sch, "unpack2")


def _plane_tiles_of(tile_n: int):
    """(u, p, c, j) -> (c // tile_n, u, p, c % tile_n, j): byte planes in column tiles."""
    return lambda u, p, c, j: (c // tile_n, u, p, c % tile_n, j)


def _tiles_of(per_tile: int):
    """The index map (r, c) -> (c // per_tile, r, c % per_tile); TVM reads the map's arity
    from its signature, so the tile is bound by closure, not by a default argument."""
    return lambda r, c: (c // per_tile, r, c % per_tile)


def layout_of(func) -> dict | None:
    """The ``n_tiled`` layout a scheduled PrimFunc reads its weights in, from its codes2's
    shape; None for the format's default. (The CUDA int8 compute fixes ``plane_words``: its
    variant in schedules/variants.py names it.)"""
    for param in func.params:  # TVM 0.27: a parameter is its buffer (name, shape)
        if param.name == "codes2":
            shape = [int(d) for d in param.shape]
            if len(shape) in (3, 5):  # tiled words [N/T, R, T] or planes [N/T, U, 1, T, 4]
                return n_tiled(shape[2] if len(shape) == 3 else shape[3])
            return None
    return None


def _tile(layout: dict | None) -> int | None:
    if layout is None or layout.get("kind") == PLANE_WORDS:
        return None
    if layout.get("kind") != N_TILED:
        raise SpecError(f"unknown weight layout {layout!r}; known: {N_TILED}, {PLANE_WORDS}")
    return int(layout["tile_n"])


def pack(tensors: dict, layout: dict | None, g2: int) -> dict:
    """Default-layout operands -> operands in ``layout`` (new memory).

    Parameters
    ----------
    tensors : dict of str to torch.Tensor or numpy.ndarray
        The format's arrays (formats/mixed.py), each [rows, N] (second-order ones
        [G2, N/g2]); operands the layout does not rewrite are returned unchanged.
    layout : dict or None
        :func:`n_tiled`, :func:`plane_words` (codes2 and codes4, uint8 byte planes
        [R, 1, N, 4], become int32 [R, 1, N]) or None (no change).
    g2 : int
        Columns per second-order group.

    Returns
    -------
    dict
        The same names, same array type; for ``n_tiled`` the seven operands of
        :data:`OPERANDS` as [N/T, rows, T] ([N/T, G2, T/g2] for scale2 and zero2), contiguous.
    """
    if layout is not None and layout.get("kind") == PLANE_WORDS:
        return {**tensors, **{name: plane_words_of(tensors[name])
                              for name in _PLANE_READERS}}
    tile = _tile(layout)
    if tile is None:
        return dict(tensors)
    out = dict(tensors)
    for name, _, second_order in OPERANDS:
        t = tensors[name]
        if t.ndim == 4:  # the int8 kernel's byte planes [U, 1, N, 4]
            units, planes, cols, step = t.shape
            check_tile(cols, g2, tile)
            out[name] = _contiguous(_move_tiles_first(
                t.reshape(units, planes, cols // tile, tile, step)))
            continue
        per_tile = tile // g2 if second_order else tile
        rows, cols = t.shape
        check_tile(cols * (g2 if second_order else 1), g2, tile)
        out[name] = _contiguous(_swap01(t.reshape(rows, cols // per_tile, per_tile)))
    return out


def unpack(tensors: dict, layout: dict | None, g2: int) -> dict:
    """The inverse of :func:`pack`: operands in ``layout`` -> the format's default layout
    (for :func:`plane_words`, codes2 and codes4 back to byte planes uint8 [R, 1, N, 4])."""
    if layout is not None and layout.get("kind") == PLANE_WORDS:
        return {**tensors, **{name: _byte_planes_of(tensors[name]) for name in _PLANE_READERS}}
    if _tile(layout) is None:
        return dict(tensors)
    out = dict(tensors)
    for name, _, _ in OPERANDS:
        t = tensors[name]
        if t.ndim == 5:  # byte planes [N/T, U, 1, T, 4]
            tiles, units, planes, tile, step = t.shape
            out[name] = _contiguous(_move_tiles_back(t).reshape(units, planes, tiles * tile,
                                                                step))
            continue
        tiles, rows, per_tile = t.shape
        out[name] = _contiguous(_swap01(t).reshape(rows, tiles * per_tile))
    return out


def _byte_planes_of(words):
    """int32 words [R, 1, N] -> their bytes, uint8 [R, 1, N, 4] (little-endian), numpy or
    torch."""
    shape = (*words.shape, 4)
    if isinstance(words, np.ndarray):
        return np.ascontiguousarray(words).view(np.uint8).reshape(shape).copy()
    import torch

    return words.contiguous().view(torch.uint8).reshape(shape).contiguous()


def _swap01(t):
    """Swap the first two axes of a 3-D numpy array or torch tensor (a view)."""
    return t.transpose(1, 0, 2) if isinstance(t, np.ndarray) else t.permute(1, 0, 2)


def _move_tiles_first(t):
    """[U, P, N/T, T, 4] -> [N/T, U, P, T, 4] (a view), numpy or torch."""
    return t.transpose(2, 0, 1, 3, 4) if isinstance(t, np.ndarray) else t.permute(2, 0, 1, 3, 4)


def _move_tiles_back(t):
    """[N/T, U, P, T, 4] -> [U, P, N/T, T, 4] (a view), numpy or torch."""
    return t.transpose(1, 2, 0, 3, 4) if isinstance(t, np.ndarray) else t.permute(1, 2, 0, 3, 4)


def _contiguous(t):
    return np.ascontiguousarray(t) if isinstance(t, np.ndarray) else t.contiguous()
