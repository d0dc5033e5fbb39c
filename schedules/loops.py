"""Loop helpers every design space shares (CPU and GPU)."""

from __future__ import annotations

from qcompile._tvm import Schedule


def loops_below(sch: Schedule, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop`` (which must enclose it), outermost first."""
    loops = sch.get_loops(block)
    target = sch.get(loop)
    for depth, candidate in enumerate(loops):
        if sch.get(candidate).same_as(target):
            return loops[depth + 1 :]
    raise ValueError(f"block {sch.get(block).name_hint!r} is not inside the given loop")
