"""Weight layouts of the uniform family, chosen by the schedule and packed at ``prepare`` time.

A GEMV streams every weight once, so how the bytes lie decides how close a kernel gets to the
memory bandwidth. GPTQ's layout (qweight [K*b/32, N], scales and zeros [G, N]) makes a kernel
that owns a tile of ``T`` columns read ``4*T`` bytes, then jump a whole row of N: a new page
every few rows and three strided streams per tile. QIGen stores the matrix in blocks instead.

``n_tiled`` (tile T) is that blocked layout: column tiles of T = t_u * lanes, each stored whole
and contiguous, K-major inside::

    qweight  [N/T, K*b/32, T]   int32      qweight_tiled[j, r, c] = qweight[r, j*T + c]
    scales   [N/T, G, T]        float16
    zeros    [N/T, G, T]        uint8

so a parallel task reading consecutive tiles reads one contiguous range of each operand. The
design space applies it with ``transform_layout`` on the function's parameters: the layout is
part of the schedule's trace, hence of the tuning record, and :func:`layout_of` reads it back from
a scheduled function (the build writes it into the manifest; ``Kernel.prepare`` packs for it).

``plane_words`` is the CUDA dp4a kernel's (compute_cuda_int8.py): the CPU int8 kernel's byte
planes, uint8 [U, P, N, 4], read as int32 words [U, P, N] (the same bytes), so one register holds
the 4 bytes a ``dp4a`` takes. Its compute, not its schedule, fixes it; :func:`layout_of` knows it
by the function's compute name. ``mma_tiles`` is the tensor-core kernel's (compute_cuda_mma.py):
the same words grouped per group and 8-column tile, [G, N/8, 8 * units per group], in the order
a warp's fragment loads read them (compute_cuda_mma.word_position: each warp load one
contiguous stretch), and scales and zeros with each lane's values of a warp's columns together
(compute_cuda_mma.scale_position).

Z-order (the paper's option for blocks of K x N) is not used: with one pass over the weights per
GEMV and whole-K column tiles, tiles are already read in address order; a Z curve would only
interleave K blocks of neighbouring tiles.
"""

from __future__ import annotations

from qcompile.errors import SpecError
from qcompile.formats import bitpack

#: The layout name in manifests and ``PreparedWeights.extras["layout"]``.
N_TILED = "n_tiled"
#: The CUDA int8 kernel's codes: the byte planes (tir.planes.byte_planes, uint8 [U, P, N, 4])
#: read as int32 words [U, P, N], 4 codes per byte lane for ``dp4a`` (compute_cuda_int8.py).
PLANE_WORDS = "plane_words"

#: The tensor-core kernel's operands (compute_cuda_mma.py): codes [G, N/8, 8 * units per group]
#: in compute_cuda_mma.word_position's order, scales and zeros [G, N] with the columns of each
#: warp in compute_cuda_mma.scale_position's order.
MMA_TILES = "mma_tiles"

#: The fp16/bf16 tensor-core kernel's operands (compute_cuda_mma_f16.py), codes as mma's A
#: operand: int32 [N/16, K/128, 64 b], each lane's 2 b words of a unit and 16-column tile in
#: word_position's order, every code at the bits its register decodes it from in place
#: (code_position); scales and zeros [G, N] with each warp's columns in its scale_position order.
MMA_F16 = "mma_f16_a"

#: Operands the layout rewrites, with the block that reads each.
_OPERANDS = (("qweight", "group_dot"), ("scales", "combine"), ("zeros", "combine"))


def n_tiled(tile_n: int) -> dict:
    """The layout descriptor ``{"kind": "n_tiled", "tile_n": T}``."""
    return {"kind": N_TILED, "tile_n": int(tile_n)}


def plane_words() -> dict:
    """The layout descriptor ``{"kind": "plane_words"}`` (:data:`PLANE_WORDS`)."""
    return {"kind": PLANE_WORDS}


def mma_tiles(bits: int, group_units: int, tiles: int) -> dict:
    """The layout descriptor ``{"kind": "mma_tiles", "bits": b, "group_units": U,
    "tiles": t}`` (:data:`MMA_TILES`; ``tiles``: 8-column tiles per warp)."""
    return {"kind": MMA_TILES, "bits": int(bits), "group_units": int(group_units),
            "tiles": int(tiles)}


def mma_f16(bits: int, block_rows: int) -> dict:
    """The layout descriptor ``{"kind": "mma_f16_a", "bits": b, "block_rows": B}``
    (:data:`MMA_F16`; B: rows of K within which the kernel orders them,
    compute_cuda_mma_f16.block_rows)."""
    return {"kind": MMA_F16, "bits": int(bits), "block_rows": int(block_rows)}


def apply(sch, n: int, tile_n: int) -> None:
    """Rewrite qweight, scales and zeros of ``sch``'s function into column tiles of ``tile_n``.

    Parameters
    ----------
    sch : Schedule
        An unscheduled uniform workload: the float32 compute (qweight int32 [R, N], read by
        ``group_dot``) or the int8 one (qweight uint8 [U, P, N, 4], read by ``unpack``).
    n : int
        N, which ``tile_n`` must divide.
    tile_n : int
        Columns per tile.
    """
    if tile_n <= 0 or n % tile_n:
        raise SpecError(f"layout tile {tile_n} must divide N={n}")
    for buffer, block in _OPERANDS:
        if buffer == "qweight" and _is_int8(sch):
            sch.transform_layout(sch.get_sblock("unpack"), buffer,
                                 lambda u, p, c, j: (c // tile_n, u, p, c % tile_n, j))
            continue
        sch.transform_layout(sch.get_sblock(block), buffer,
                             lambda r, c: (c // tile_n, r, c % tile_n))


def _is_int8(sch) -> bool:
    """Whether ``sch`` is the int8-activation compute (its codes are unpacked as bytes)."""
    return has_block(sch, "unpack")


def has_block(sch, name: str) -> bool:
    """Whether ``sch``'s function has a block called ``name``."""
    try:
        sch.get_sblock(name)
    except Exception:  # TVM raises its own ScheduleError when the block is missing
        return False
    return True


def layout_of(func) -> dict | None:
    """The ``n_tiled`` layout a scheduled PrimFunc of the CPU (or float CUDA) computes reads
    its weights in, from its qweight's shape; None for GPTQ's layout. (The CUDA int8 computes
    fix theirs: their variants in schedules/variants.py name it.)"""
    for param in func.params:  # TVM 0.27: a parameter is its buffer (name, shape)
        if param.name == "qweight":
            shape = [int(d) for d in param.shape]
            if len(shape) in (3, 5):  # tiled float32 [N/T, R, T] or int8 [N/T, U, P, T, 4]
                return n_tiled(shape[2] if len(shape) == 3 else shape[3])
            return None
    return None


def pack(tensors: dict, layout: dict | None) -> dict:
    """GPTQ-layout operands -> operands in ``layout`` (torch tensors, new memory).

    Parameters
    ----------
    tensors : dict of str to torch.Tensor
        ``qweight`` int32 [R, N] (or the int8 kernel's uint8 [U, P, N, 4]), ``scales``
        float16 [G, N], ``zeros`` uint8 [G, N] and any other operands (returned unchanged).
    layout : dict or None
        :func:`n_tiled` or None (no change).
    """
    if layout is None:
        return dict(tensors)
    if layout.get("kind") == PLANE_WORDS:
        return {**tensors, "qweight": plane_words_of(tensors["qweight"])}
    if layout.get("kind") == MMA_TILES:
        return {**tensors, **_mma_tiles_of(tensors, layout)}
    if layout.get("kind") == MMA_F16:
        return {**tensors, **_mma_f16_of(tensors, int(layout["bits"]), int(layout["block_rows"]))}
    if layout.get("kind") != N_TILED:
        raise SpecError(f"unknown weight layout {layout!r}; known: {N_TILED}, {PLANE_WORDS}, "
                        f"{MMA_TILES}, {MMA_F16}")
    tile = int(layout["tile_n"])
    out = dict(tensors)
    for name, _ in _OPERANDS:
        t = tensors[name]
        n = t.shape[-2] if t.dim() == 4 else t.shape[-1]
        if n % tile:
            raise SpecError(f"layout tile {tile} must divide N={n} ({name})")
        if t.dim() == 4:  # int8 kernel's byte planes [U, P, N, 4]
            units, planes, _, step = t.shape
            out[name] = (t.reshape(units, planes, n // tile, tile, step)
                         .permute(2, 0, 1, 3, 4).contiguous())
            continue
        rows = t.shape[0]
        out[name] = t.reshape(rows, n // tile, tile).permute(1, 0, 2).contiguous()
    return out


def plane_words_of(planes):
    """uint8 byte planes [U, P, N, 4] -> int32 [U, P, N] (the same bytes, little-endian), numpy
    or torch (new memory)."""
    import numpy as np

    is_numpy = isinstance(planes, np.ndarray)
    dtype = planes.dtype if is_numpy else str(planes.dtype).removeprefix("torch.")
    if str(dtype) != "uint8" or planes.ndim != 4 or planes.shape[-1] != 4:
        raise SpecError(f"layout {PLANE_WORDS} packs the int8 kernel's byte planes, uint8 "
                        f"[U, P, N, 4]; got {dtype} {list(planes.shape)}")
    if is_numpy:
        return np.ascontiguousarray(planes).view(np.int32)[..., 0].copy()
    import torch

    return planes.contiguous().view(torch.int32).squeeze(-1).contiguous()


def _mma_tiles_of(tensors: dict, layout: dict) -> dict:
    """GPTQ operands (codes as the dp4a kernel's byte planes uint8 [U, 1, N, 4], scales
    float16 and zeros uint8 [G, N]; torch) -> ``qweight`` int32 [G, N/8, 8 * group_units],
    ``scales`` and ``zeros`` [G, N] in the :data:`MMA_TILES` orders (new memory)."""

    from qcompile.kernels.uniform.compute_cuda_mma import (
        TILE_N,
        TILES_PER_WARP,
        scale_position,
        word_position,
    )

    words = plane_words_of(tensors["qweight"])
    units, _, n = words.shape
    per_group, bits, tiles = (int(layout[key]) for key in ("group_units", "bits", "tiles"))
    if tiles != TILES_PER_WARP:
        raise SpecError(f"layout {MMA_TILES}: {tiles} tiles per warp; this version's kernel "
                        f"takes {TILES_PER_WARP}: rebuild the kernel")
    columns = TILE_N * tiles
    if units % per_group or n % columns:
        raise SpecError(f"layout {MMA_TILES}: {units} words along K must be whole groups of "
                        f"{per_group} and N={n} whole warps of {columns} columns")

    # [U, N] -> [G, N/8, 8 columns, group_units], then each tile's words in word_position order
    tiled = (words.reshape(units // per_group, per_group, n // TILE_N, TILE_N)
             .permute(0, 2, 3, 1).reshape(units // per_group, n // TILE_N, TILE_N * per_group))
    qweight = _reorder_runs(tiled, lambda i: word_position(i // per_group, i % per_group, bits,
                                                     per_group), TILE_N * per_group)
    return {"qweight": qweight,
            **{name: _reorder_runs(tensors[name], scale_position, columns)
               for name in ("scales", "zeros")}}


def _reorder_runs(t, position, width):
    """Last dimension of ``t`` (torch, a multiple of ``width``): element i of each run of
    ``width`` moves to ``position(i)`` (new memory)."""
    import torch

    order = [0] * width
    for i in range(width):
        order[position(i)] = i
    runs = t.reshape(*t.shape[:-1], t.shape[-1] // width, width)
    index = torch.tensor(order, device=t.device)
    return runs.index_select(-1, index).reshape(t.shape).contiguous()


def _mma_f16_of(tensors: dict, bits: int, block: int) -> dict:
    """GPTQ operands (qweight int32 [K*b/32, N], scales float16 and zeros uint8 [G, N]; torch)
    -> ``qweight`` int32 [N/16, K/128, 64 b] in compute_cuda_mma_f16's word_position and
    code_position order, ``scales`` and ``zeros`` in its scale_position order (new memory)."""
    import numpy as np
    import torch

    from qcompile.kernels.uniform.compute_cuda_mma_f16 import (
        TILE_COLUMNS,
        UNIT_ROWS,
        WARP_COLUMNS,
        code_position,
        scale_position,
        word_position,
        words_per_lane,
    )

    packed = tensors["qweight"]
    if packed.dim() != 2 or packed.dtype != torch.int32:
        raise SpecError(f"layout {MMA_F16} packs GPTQ's qweight, int32 [K*b/32, N]; got "
                        f"{packed.dtype} {list(packed.shape)}")
    codes = bitpack.unpack(packed.cpu().numpy(), bits)                 # int32 [K, N]
    k, n = codes.shape
    if k % UNIT_ROWS or n % WARP_COLUMNS or block not in (32, 64, 128):
        raise SpecError(f"layout {MMA_F16}: K={k} must be a multiple of {UNIT_ROWS}, "
                        f"N={n} of {WARP_COLUMNS}, and the block of {block} rows 32, 64 or 128")
    # words [N/16, K/128, 64 b]: each field of a lane's words holds bits of one code (the
    # packing is the same for fp16 and bf16 x: code_position's dtype only moves offsets)
    words = np.zeros((n // TILE_COLUMNS, k // UNIT_ROWS, 32 * words_per_lane(bits)),
                     dtype=np.uint32)
    by_unit = codes.reshape(k // UNIT_ROWS, UNIT_ROWS, n // TILE_COLUMNS,
                            TILE_COLUMNS).astype(np.uint32)
    for lane in range(32):
        for word, bit, width, code_bit, row, column in code_position(bits, "float16", block,
                                                                     lane):
            field = (by_unit[:, row, :, column] >> np.uint32(code_bit)) & np.uint32(
                (1 << width) - 1)
            words[:, :, word_position(lane, word, bits)] |= field.T << np.uint32(bit)
    device = packed.device
    return {"qweight": torch.from_numpy(words.view(np.int32)).to(device),
            **{name: _reorder_runs(tensors[name], scale_position, WARP_COLUMNS)
               for name in ("scales", "zeros")}}


def describe(layout: dict | None) -> str:
    if layout is None:
        return "gptq [K*b/32, N]"
    if layout.get("kind") == PLANE_WORDS:
        return f"{PLANE_WORDS} (byte planes as int32 words [U, P, N])"
    if layout.get("kind") == MMA_F16:
        return (f"{MMA_F16} (codes as mma's A operand, two per half2 register, words "
                f"[N/16, K/128, 64 b], rows ordered within blocks of {layout['block_rows']})")
    if layout.get("kind") == MMA_TILES:
        return (f"{MMA_TILES} (words per group and 8-column tile [G, N/8, "
                f"{8 * layout['group_units']}], {layout['tiles']} tiles per warp)")
    return f"{layout['kind']} (tiles of {layout['tile_n']} columns)"
