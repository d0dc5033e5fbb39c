"""MLP layers to and from one ``.npz`` file, so every rank of a torchrun job reads the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.gptq import GptqTensors
from qcompile.tp.mlp import MlpLayers

_FIELDS = ("qweight", "scales", "qzeros", "g_idx")
_META = ("bits", "group_size")


def save_mlp(path: str | Path, layers: MlpLayers) -> None:
    arrays = {}
    for name in ("up", "down", "gate"):
        layer = getattr(layers, name)
        if layer is None:
            continue
        for field in _FIELDS:
            arrays[f"{name}.{field}"] = getattr(layer, field)
        for field in _META:
            arrays[f"{name}.{field}"] = np.array(getattr(layer, field))
        arrays[f"{name}.zero_convention"] = np.array(layer.zero_convention)
    np.savez(path, **arrays)


def load_mlp(path: str | Path) -> MlpLayers:
    with np.load(path) as data:
        def layer(name: str) -> GptqTensors | None:
            if f"{name}.qweight" not in data:
                return None
            try:
                return GptqTensors.from_tensors(
                    **{field: data[f"{name}.{field}"] for field in _FIELDS},
                    bits=int(data[f"{name}.bits"]), group_size=int(data[f"{name}.group_size"]),
                    zero_convention=str(data[f"{name}.zero_convention"]),
                )
            except FormatError as error:
                raise FormatError(f"{path}: layer {name}: {error}") from None

        up, down = layer("up"), layer("down")
        if up is None or down is None:
            raise FormatError(f"{path} must hold an 'up' and a 'down' layer")
        return MlpLayers(up=up, down=down, gate=layer("gate"))
