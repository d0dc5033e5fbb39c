"""How candidates are built and timed while tuning: sized for small machines.

MetaSchedule's LocalBuilder starts fresh worker processes for every batch, and its default build
function imports ``tvm.s_tir.tensor_intrin`` in each (20-30 s on 2 cores, primer G2). Our design
spaces never tensorize, so :func:`fast_build` skips that import; workers then start in the few
seconds ``import tvm`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass


def fast_build(mod, target, _params):
    """LocalBuilder's build function without the tensor-intrinsic import.

    Returns a ``runtime.Module`` (``tvm.tirx.build``), which LocalBuilder exports; ``tvm.compile``
    would return an ``Executable`` that it cannot export (primer G4).
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


@dataclass(frozen=True)
class MeasurePolicy:
    """How each candidate is built and timed (an explicit value, like MetaSchedule's
    EvaluatorConfig, so that a record can say how it was measured).

    Attributes
    ----------
    build_workers : int
        Parallel build processes (the machine's cores).
    build_timeout_s, run_timeout_s : float
        Per-batch limits; a 2-core machine needs generous ones (primer G2, G8).
    number, repeat, min_repeat_ms : int
        ``time_evaluator`` settings: ``repeat`` medians of ``number`` calls, each repeat at
        least ``min_repeat_ms`` long.
    """

    build_workers: int = 2
    build_timeout_s: float = 120.0
    run_timeout_s: float = 120.0
    number: int = 10
    repeat: int = 3
    min_repeat_ms: int = 40

    def builder(self):
        from qcompile._tvm import ms

        return ms.builder.LocalBuilder(max_workers=self.build_workers,
                                       timeout_sec=self.build_timeout_s, f_build=fast_build)

    def runner(self, f_alloc_argument=None):
        """LocalRunner with these settings; ``f_alloc_argument`` (a family's
        ``measure_arguments``) makes the operands, None: MetaSchedule's random fill."""
        from qcompile._tvm import ms

        config = ms.runner.EvaluatorConfig(number=self.number, repeat=self.repeat,
                                           min_repeat_ms=self.min_repeat_ms,
                                           enable_cpu_cache_flush=False)
        return ms.runner.LocalRunner(timeout_sec=self.run_timeout_s, evaluator_config=config,
                                     f_alloc_argument=f_alloc_argument)
