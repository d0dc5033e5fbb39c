"""Weight layout of the bcq family's rotated CUDA kernel (bcq/compute_cuda_rotated.py): within
each group, column n's chunks of 8 rows (bytes of the sign planes) rotated by
``r(n) = (n // 4) % cpg``, so that the lanes of a warp read different slots of a table row."""

from __future__ import annotations

import numpy as np

from qcompile.formats.bcq import WORD_BITS

#: The layout's name in manifests and ``PreparedWeights.extras["layout"]``.
ROTATED_CHUNKS = "rotated_chunks"

#: Activations per table: a key is one byte of a packed word.
MU = 8

#: Adjacent columns a thread owns (one 128-bit load of a word per plane and row of words):
#: the unit of the rotation, ``r(n) = (n // COLS) % cpg``.
COLS = 4


def rotation(n, cpg: int):
    """The chunk offset of column ``n`` (an int expression or array): ``(n // COLS) % cpg``."""
    return n // COLS % cpg


def layout(group_size: int) -> dict:
    """The layout descriptor ``{"kind": "rotated_chunks", "chunks": cpg, "cols": 4}``."""
    return {"kind": ROTATED_CHUNKS, "chunks": int(group_size // MU), "cols": COLS}


def rotate_planes(planes, group_size: int):
    """Packed planes in the format's layout -> the rotated layout (a numpy array in, a numpy
    array out; a torch tensor in, one on its device out).

    Parameters
    ----------
    planes : int32 [q, K / 32, N]
        Bit ``k % 32`` of word ``[i, k // 32, n]``: sign of row k (qcompile.formats.bcq).
    group_size : int
        Rows per group (a multiple of 32 whose chunks of 8 divide 32: 32, 64, 128, 256).

    Returns
    -------
    int32 [q, K / 32, N]
        Within each group, byte s of column n's bytes (bytes in memory order, the little-endian
        words of the group one after another) holds the group's chunk ``(s + r(n)) % cpg``.
    """
    import torch

    if isinstance(planes, np.ndarray):
        return rotate_planes(torch.from_numpy(np.ascontiguousarray(planes)), group_size).numpy()
    cpg = group_size // MU
    q, words, n = planes.shape
    groups = words * WORD_BITS // group_size
    by_column = planes.transpose(1, 2).contiguous().view(torch.uint8)   # [q, N, K / 8] bytes
    chunks = by_column.reshape(q, n, groups, cpg)
    columns = torch.arange(n, device=planes.device)
    source = (torch.arange(cpg, device=planes.device)[None, :]
              + rotation(columns, cpg)[:, None]) % cpg
    rotated = torch.gather(chunks, 3, source[None, :, None, :].expand(q, n, groups, cpg))
    return rotated.contiguous().view(torch.int32).reshape(q, n, words).transpose(1, 2).contiguous()
