"""What the tests share to build a kernel with fixed decisions and compare it with its reference."""

from __future__ import annotations

import numpy as np

import qcompile
from tuning_db import Storage


def relative_error(y, reference) -> float:
    """max |y - reference| / max |reference|, in float64.

    Parameters
    ----------
    y : numpy.ndarray or torch.Tensor
        A kernel's output, any float dtype (bfloat16 included), any device.
    reference : numpy.ndarray
        The reference output, same shape.
    """
    if hasattr(y, "detach"):  # a torch tensor: numpy has no bfloat16
        import torch

        y = y.detach().to("cpu", torch.float64).numpy()
    y = np.asarray(y, dtype=np.float64)
    return float(np.abs(y - reference).max() / np.abs(reference).max())


def compile_fixed(spec, preset, sketch, *decisions):
    """``spec``'s compute with ``sketch(sch, spec, hw, *decisions)`` applied, compiled for
    ``preset`` (a CPU target): the callable kernel function."""
    from qcompile import _tvm
    from schedules.variants import compute_for

    hw = preset.hardware()
    sch = sketch(_tvm.Schedule(compute_for(spec, "cpu")), spec, hw, *decisions)
    lib = _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw)))
    return lib[spec.name()]


def tune_and_load(spec, preset, tmp_path, trials: int = 4):
    """Tune ``spec`` for ``preset`` a few trials into a fresh sqlite database under
    ``tmp_path``, build its best record and load it: the tuned kernel (``qcompile.Kernel``)."""
    from qcompile.build import build
    from qcompile.tune import tune

    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    tune(spec, preset, storage=storage, trials=trials, progress=False,
         work_dir=str(tmp_path / "work"))
    return qcompile.load(build(spec, preset, tmp_path / "out", storage=storage).so_path)
