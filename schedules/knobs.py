"""Categorical knobs: a design-space decision drawn from an explicit list of values.

A knob is a ``sample_categorical`` instruction in the schedule's trace, so it replays from a
tuning record like any other decision. Its candidates are written out in the design space (the
tables in each module's docstring list them), which keeps the space small and legible; a
``fixed`` value pins the decision, still as a sampling instruction, so that a hand-picked
configuration has the same trace shape as the tuned ones.

MetaSchedule's own mutators change tile sizes, unroll steps on its own annotations, and
threadIdx.x extents in one pattern; none changes a general categorical decision, so
:class:`MutateCategorical` does: it moves one knob of a trace to another of its candidates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from qcompile._tvm import Schedule, derived_object, ms
from qcompile.errors import SpecError

#: The trace instruction of a knob.
_SAMPLE_CATEGORICAL = "SampleCategorical"


#: Probability a knob's ``prior`` value gets (the rest is spread evenly over the others).
PRIOR_WEIGHT = 0.75


def choose(sch: Schedule, name: str, candidates: Sequence[int], fixed: dict | None = None,
           prior: dict | None = None):
    """Sample one of ``candidates`` (uniform prior); ``fixed[name]``, if present, pins it.

    Parameters
    ----------
    sch : Schedule
    name : str
        The knob's name (error messages, ``fixed`` keys).
    candidates : sequence of int
        The values the search may choose; at least one.
    fixed : dict, optional
        ``{name: value}`` pinning knobs; a value outside ``candidates`` raises ``SpecError``.
    prior : dict, optional
        ``{name: value}`` favoured knobs: the value gets probability :data:`PRIOR_WEIGHT`
        (sampling and mutation still reach every candidate); ignored when not a candidate.

    Returns
    -------
    ExprRV
        The decision, usable as a split factor or an annotation value.
    """
    values = [int(v) for v in candidates]
    if not values:
        raise SpecError(f"knob {name!r} has no candidate values")
    decision = None
    if fixed is not None and name in fixed:
        value = int(fixed[name])
        if value not in values:
            raise SpecError(f"knob {name}={value} is not a candidate here; candidates: {values}")
        decision = values.index(value)
    probs = [1.0 / len(values)] * len(values)
    if prior is not None and len(values) > 1 and prior.get(name) in values:
        rest = (1.0 - PRIOR_WEIGHT) / (len(values) - 1)
        probs = [PRIOR_WEIGHT if v == prior[name] else rest for v in values]
    return sch.sample_categorical(values, probs, decision=decision)


def categorical_decisions(trace) -> list[tuple[list[int], int]]:
    """``(candidates, chosen value)`` of every knob of ``trace``, in sampling order."""
    out = []
    for inst in trace.insts:
        if inst.kind.name != _SAMPLE_CATEGORICAL:
            continue
        candidates = [int(v) for v in inst.attrs[0]]
        out.append((candidates, candidates[int(trace.get_decision(inst))]))
    return out


@derived_object
class MutateCategorical(ms.mutator.PyMutator):
    """Move one categorical decision of a trace to another of its candidates, at random.

    Each clone keeps its own random stream, seeded from the tuning context's seed, so a tuning
    run is repeatable for a given seed.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._seed = seed
        self._rng = random.Random(seed)

    def _initialize_with_tune_context(self, context) -> None:
        self._seed = int(context.rand_state) & 0xFFFFFFFF
        self._rng = random.Random(self._seed)

    def apply(self, trace, _rand_state):
        knobs = [inst for inst in trace.insts
                 if inst.kind.name == _SAMPLE_CATEGORICAL and len(inst.attrs[0]) > 1]
        if not knobs:
            return None
        inst = self._rng.choice(knobs)
        current = int(trace.get_decision(inst))
        others = [i for i in range(len(inst.attrs[0])) if i != current]
        return trace.with_decision(inst, self._rng.choice(others), remove_postproc=True)

    def clone(self):
        return MutateCategorical(self._rng.randrange(1 << 31))
