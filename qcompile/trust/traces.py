"""Records are data, never code: what a tuning record's trace may hold.

TVM replays a trace whenever a record is read back (``TuningRecord.from_json``, MetaSchedule's
search seeding from the database, ``build``), and a trace can hold far more than our design
spaces ever emit: an ``Annotate`` with ``pragma_import_llvm`` links arbitrary LLVM IR into the
kernel library (a function in ``@llvm.global_ctors`` runs when the library is loaded), a
TransformLayout input is a TVM JSON graph from which TVM builds whatever objects it names, and a
decision's instruction index is written into an array without a bounds check.

So a trace is checked as plain JSON, before TVM sees it, against a :class:`TracePolicy` derived
from our own design spaces for the record's spec and target kind (:func:`policy_for`): the spec's
space functions (schedules/) are run on its compute for a few hardware models and everything
they emit is collected. A trace may then hold only:

- instruction kinds the spaces emit, ``EnterPostproc`` included: the derivation marks the end of
  each sketch as MetaSchedule does before running the postprocessors on every candidate it
  measures (ours, ``schedules._search_settings``, only check and add no instruction; one that
  schedules would have to be applied here too, and the tuner's own commit check would fail at
  once until it is);
- per kind, the attribute shapes the spaces emit (arity and JSON types) and, at every string
  attribute position, only the exact strings seen there (block names, scopes, thread axes,
  tensor intrinsics);
- per kind, the input types seen (random variables, numbers, lists, ``None``, JSON-quoted
  strings only as the exact strings seen, IndexMap JSON only where the spaces use it);
- annotation keys the spaces emit, each with the value types seen for it (a sampled variable,
  an int, a list of ints, a string only as the exact strings seen) and its values no larger
  than the largest one seen (a sampled value counts with all of its candidates);
- IndexMap JSON whose nodes are only of the TVM types our layouts use;
- random variables defined by an earlier instruction's outputs before they are used (each name
  once), decisions only for sampling instructions, in range (a categorical index within its
  candidates, a tile of the sampled length);
- integers within ``int_range``: from the smallest number the spaces emit (``-1``: "last
  position") to the larger of the largest number they emit and the longest loop any schedule of
  the workload could have (the largest block iteration domain or buffer of the unscheduled
  workload: splitting and fusing loops can never make one longer, so no split factor, tile or
  fused extent beyond it is legitimate); floats finite and in that range too;
- at most twice as many instructions as the longest trace the spaces emit.

Anything else raises :class:`~qcompile.errors.RecordRefused` naming the record (first 12 hex
digits of its digest), the instruction (index and kind, the key of an annotation) and the rule.

Callers: the tuning database's view of a spec (:mod:`qcompile.trust.workloads` hands
``SqlDatabase`` the check): ``commit_measurement`` (a trace our tuner produced: a refusal is our
bug), ``ranked`` (a refused record is skipped with one warning), ``replay`` (before replaying,
for build and re-measurement); and import/merge, through :func:`check_record_trace`.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import targets
from qcompile.errors import QCompileError, RecordRefused, SpecError
from qcompile.kernels import spec_from_dict
from targets.hardware import CpuHardware

#: Seed of the schedules the policy is derived from (their decisions do not matter, only what
#: the spaces emit).
SEED = 1

#: Nesting of lists in an instruction's inputs, attributes or decision beyond which a trace is
#: refused (ours nest two deep; this keeps the checker's recursion bounded).
MAX_NESTING = 8

#: A trace may hold up to this many times the instructions of the longest trace the spaces
#: emit: room for spaces that grow with a hardware model, while replay work stays bounded.
INSTRUCTION_SLACK = 2

#: An IndexMap's JSON may be up to this many times longer than the longest the spaces emit.
INDEX_MAP_SLACK = 4

#: TVM's names of random variables in trace JSON: blocks, loops, sampled values.
_RV_NAME = re.compile(r"[blv][0-9]{1,9}")

#: Messages show at most this many allowed values and this many characters of a found one.
_LIST_AT_MOST = 16
_SHOW_AT_MOST = 60


@dataclass(frozen=True)
class AnnotationRule:
    """What one annotation key may carry.

    Attributes
    ----------
    value_types : frozenset of str
        ``"number"``, ``"list[number]"``, ``"str"``, or ``"rv:<kind>"`` (a variable sampled by
        an instruction of that kind).
    strings : frozenset of str
        The exact (JSON-quoted) string values seen, when ``"str"`` is among the types.
    low, high : int
        The range of the values: ints, list elements, every candidate of a sampled value.
    """

    value_types: frozenset[str]
    strings: frozenset[str]
    low: int
    high: int


@dataclass(frozen=True, eq=False)
class TracePolicy:
    """What a trace of one spec on one target kind may hold (module docstring; derive it with
    :func:`policy_for`).

    Attributes
    ----------
    label : str
        ``"<spec name> on <target kind>"``, for messages.
    kinds : frozenset of str
        Instruction kinds.
    attr_shapes : mapping of str to frozenset of tuple of str
        Per kind, the JSON type signatures of its attribute list (numbers are one type:
        TVM's own JSON writes ``true`` as ``1`` and ``1.0`` as ``1``).
    attr_strings : mapping of (str, int) to frozenset of str
        Per (kind, attribute position), the exact strings seen there.
    input_types : mapping of str to frozenset of str
        Per kind, the types its inputs hold (list elements included): ``rv``, ``none``,
        ``number``, ``list``, ``str``, ``index_map``.
    input_strings : mapping of str to frozenset of str
        Per kind (other than Annotate), the exact JSON-quoted string inputs seen.
    annotations : mapping of str to AnnotationRule
        Per annotation key.
    decision_shapes : mapping of str to frozenset of str
        Per sampling kind, the JSON type signatures of its decision.
    index_map_nodes : frozenset of str
        TVM node types inside IndexMap JSON.
    index_map_keys : frozenset of str
        Top-level keys of IndexMap JSON.
    index_map_chars : int
        Longest IndexMap JSON accepted.
    int_range : tuple of (int, int)
        Smallest and largest number accepted anywhere.
    max_instructions : int
        Longest trace accepted.
    """

    label: str
    kinds: frozenset[str]
    attr_shapes: Mapping[str, frozenset[tuple[str, ...]]]
    attr_strings: Mapping[tuple[str, int], frozenset[str]]
    input_types: Mapping[str, frozenset[str]]
    input_strings: Mapping[str, frozenset[str]]
    annotations: Mapping[str, AnnotationRule]
    decision_shapes: Mapping[str, frozenset[str]]
    index_map_nodes: frozenset[str]
    index_map_keys: frozenset[str]
    index_map_chars: int
    int_range: tuple[int, int]
    max_instructions: int


# ---- public functions -------------------------------------------------------------------------


def policy_for(spec, target_kind: str) -> TracePolicy:
    """The trace policy of ``spec`` on ``target_kind``, derived from our design spaces.

    Parameters
    ----------
    spec : KernelSpec
        The workload's spec.
    target_kind : str
        ``"cpu"`` or ``"cuda"`` (or a target: see :func:`target_kind_of`).

    Returns
    -------
    TracePolicy
        Cached per (spec digest, target kind) for the life of the process.

    Raises
    ------
    SpecError
        No design space of ours takes ``spec`` on ``target_kind`` with any hardware model (so
        no record of it can be one of ours).
    """
    kind = target_kind_of(target_kind)
    key = (spec.digest(), kind)
    with _LOCK:
        policy = _POLICIES.get(key)
        if policy is None:
            policy = _derive(spec, kind)
            _POLICIES[key] = policy
        return policy


def check_trace(trace: Any, policy: TracePolicy, *, digest: str) -> None:
    """Refuse ``trace`` unless ``policy`` allows everything it holds.

    Parameters
    ----------
    trace : list
        A trace as parsed JSON: ``[[instruction, ...], [[index, decision], ...]]``, each
        instruction ``[kind, inputs, attrs, outputs]`` (``record_json(record)[0]``, or
        ``json.loads(record.trace_json)``).
    policy : TracePolicy
        From :func:`policy_for` for the record's spec and target kind.
    digest : str
        The record's digest; its first 12 characters name the record in the message.

    Raises
    ------
    RecordRefused
        One line: ``record <digest[:12]>: <where> <rule>``.
    """
    try:
        _Checker(policy).trace(trace)
    except _Refusal as refusal:
        raise RecordRefused(f"record {str(digest)[:12]}: {refusal}") from None


def check_record_trace(trace: str | list, spec, target_kind, *, digest: str) -> None:
    """Refuse a record's trace unless our design spaces for its spec and target could emit it.

    The one call for code that takes records in (import, merge, a shared database): derives (or
    reuses) the policy of ``spec`` on ``target_kind`` and checks ``trace`` against it, before
    TVM ever parses the trace.

    Parameters
    ----------
    trace : str or list
        The record's ``trace_json`` text as stored or exported, or that JSON already parsed.
    spec : KernelSpec or dict
        The workload's spec, or its dict (``spec.to_dict()``, a workload's parsed
        ``spec_json``), validated by ``spec_from_dict``.
    target_kind : str, dict or tvm.target.Target
        ``"cpu"`` or ``"cuda"``, or the record's target (``{"kind": "llvm", ...}`` is "cpu").
    digest : str
        The record's digest (recompute it from the content first); its first 12 characters
        name the record in the message.

    Raises
    ------
    RecordRefused
        The trace is not JSON, breaks a rule of the policy, or no design space of ours takes
        the spec on that target (message: ``record <digest[:12]>: <where> <rule>``).

    Examples
    --------
    >>> check_record_trace(record.trace_json, json.loads(workload.spec_json),
    ...                    json.loads(record.target_json), digest=record.digest)  # doctest: +SKIP
    """
    short = str(digest)[:12]
    if isinstance(trace, str | bytes):
        try:
            trace = json.loads(trace)
        except (ValueError, RecursionError) as error:
            raise RecordRefused(f"record {short}: trace is not JSON ({error})") from None
    try:
        if isinstance(spec, Mapping):
            spec = spec_from_dict(dict(spec))
        policy = policy_for(spec, target_kind)
    except (QCompileError, ValueError, TypeError) as error:
        raise RecordRefused(f"record {short}: no trace can be checked: {error}") from None
    check_trace(trace, policy, digest=str(digest))


def target_kind_of(target) -> str:
    """``"cpu"`` or ``"cuda"`` for a target kind name (``"llvm"`` is "cpu"), a target dict
    (its ``"kind"``) or a ``tvm.target.Target``; ValueError for any other kind."""
    if isinstance(target, Mapping):
        name = target.get("kind")
    elif isinstance(target, str):
        name = target
    else:
        name = getattr(getattr(target, "kind", None), "name", None)
    kind = {"llvm": "cpu", "cpu": "cpu", "cuda": "cuda"}.get(name)
    if kind is None:
        raise ValueError(f"no design spaces for target kind {name!r}; known: cpu (llvm), cuda")
    return kind


def hardware_models(target_kind: str) -> list:
    """The hardware models a policy is derived with.

    CPU: this host's model for each CPU preset (AVX2, AVX-512) and two fixed reference models (a
    small AVX2 machine, a large AVX-512 server), so that a record tuned on another host, whose
    caches and cores gave the spaces other numbers, still passes. CUDA: every CUDA preset's GPU
    model (fixed per preset).
    """
    presets = [p for p in targets.PRESETS.values() if p.kind == target_kind]
    models = [p.hardware() for p in presets]
    if target_kind == "cpu":
        models += [
            CpuHardware(l1d_bytes=32 << 10, l2_bytes=256 << 10, l3_bytes=8 << 20,
                        vector_registers=16, vector_bits=256, cores=1),
            CpuHardware(l1d_bytes=48 << 10, l2_bytes=2 << 20, l3_bytes=64 << 20,
                        vector_registers=32, vector_bits=512, cores=64),
        ]
    return list(dict.fromkeys(models))


# ---- derivation -------------------------------------------------------------------------------

_LOCK = threading.Lock()
_POLICIES: dict[tuple[str, str], TracePolicy] = {}


def _derive(spec, target_kind: str) -> TracePolicy:
    """Run ``spec``'s design spaces on its compute for every hardware model and collect what
    their traces hold."""
    from qcompile import _tvm
    from schedules import get_design_space
    from schedules.variants import compute_for
    from tuning_db.database import _plain_json

    mod = _tvm.normalize_mod(compute_for(spec, target_kind))
    space = get_design_space(spec, target_kind)
    traces, problems = [], []
    for hw in hardware_models(target_kind):
        try:
            schedules = space(_tvm.Schedule(mod, seed=SEED), spec, hw)
        except (QCompileError, ValueError, RuntimeError) as error:  # not on this model
            problems.append(str(error))
            continue
        for sch in schedules:
            sch.enter_postproc()
            traces.append(_plain_json(sch.trace.as_json()))
    if not traces:
        raise SpecError(f"no design space of ours takes {spec.name()} on {target_kind}: "
                        f"{problems[0] if problems else 'the spaces are empty'}")
    seen = _Seen()
    for trace in traces:
        seen.trace(trace)
    return seen.policy(f"{spec.name()} on {target_kind}", _longest_loop(mod))


def _longest_loop(mod) -> int:
    """The longest loop any schedule of ``mod`` could have: the largest product of the loops
    around a block, or of a buffer's dimensions that a block reads or writes (loops whose
    extent is not a constant, the mixed family's outlier loops, are left out)."""
    from qcompile import _tvm

    sch = _tvm.Schedule(mod)
    longest = 1
    todo = list(sch.get_child_blocks(sch.get_sblock("root")))
    while todo:
        block = todo.pop()
        extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
        sizes = [_product(extents)]
        stmt = sch.get(block)
        sizes += [_product(region.source.shape) for region in (*stmt.reads, *stmt.writes)]
        longest = max([longest, *sizes])
        todo += list(sch.get_child_blocks(block))
    return longest


def _product(values) -> int:
    out = 1
    for value in values:
        if hasattr(value, "value"):  # a constant IntImm; others are left out
            out *= int(value.value)
    return out


class _Seen:
    """What the derived traces hold, gathered one trace at a time."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.attr_shapes: dict[str, set] = defaultdict(set)
        self.attr_strings: dict[tuple[str, int], set] = defaultdict(set)
        self.input_types: dict[str, set] = defaultdict(set)
        self.input_strings: dict[str, set] = defaultdict(set)
        self.annotation_types: dict[str, set] = defaultdict(set)
        self.annotation_strings: dict[str, set] = defaultdict(set)
        self.annotation_ints: dict[str, list] = defaultdict(list)
        self.decision_shapes: dict[str, set] = defaultdict(set)
        self.index_map_nodes: set[str] = set()
        self.index_map_keys: set[str] = set()
        self.index_map_chars = 0
        self.ints: list[float] = []
        self.longest = 0

    def trace(self, trace) -> None:
        insts, decisions = trace
        self.longest = max(self.longest, len(insts))
        defined: dict[str, list] = {}
        for kind, inputs, attrs, outputs in insts:
            self.kinds.add(kind)
            self.attr_shapes[kind].add(tuple(_shape(a) for a in attrs))
            for position, attr in enumerate(attrs):
                if isinstance(attr, str):
                    self.attr_strings[(kind, position)].add(attr)
            self.ints += _numbers(attrs)
            for kind_of_input, value in _leaves(inputs):
                self.input_types[kind].add(kind_of_input)
                if kind_of_input == "str" and kind != "Annotate":
                    self.input_strings[kind].add(value)
                elif kind_of_input == "index_map":
                    self._index_map(value)
                elif kind_of_input == "number":
                    self.ints.append(value)
            if kind == "Annotate":
                self._annotation(attrs[0], inputs[1], defined)
            for name in outputs:
                defined[name] = [kind, attrs]
        for index, decision in decisions:
            self.decision_shapes[insts[index][0]].add(_shape(decision))
            self.ints += _numbers([decision])

    def _annotation(self, key: str, value, defined) -> None:
        value_type = _annotation_type(value, defined)
        self.annotation_types[key].add(value_type)
        if value_type == "str":
            self.annotation_strings[key].add(value)
        self.annotation_ints[key] += _annotation_numbers(value, defined)

    def _index_map(self, text: str) -> None:
        graph = json.loads(text)
        self.index_map_keys.update(graph)
        self.index_map_nodes.update(node["type"] for node in graph["nodes"])
        self.index_map_chars = max(self.index_map_chars, len(text))

    def policy(self, label: str, longest_loop: int) -> TracePolicy:
        def frozen(mapping):
            return {key: frozenset(values) for key, values in mapping.items()}

        annotations = {}
        for key, types in self.annotation_types.items():
            ints = self.annotation_ints[key] or [0]
            annotations[key] = AnnotationRule(
                value_types=frozenset(types), strings=frozenset(self.annotation_strings[key]),
                low=min(0, *ints), high=max(ints))
        low = min(0, *self.ints) if self.ints else 0
        high = max(longest_loop, *self.ints) if self.ints else longest_loop
        return TracePolicy(
            label=label, kinds=frozenset(self.kinds), attr_shapes=frozen(self.attr_shapes),
            attr_strings=frozen(self.attr_strings), input_types=frozen(self.input_types),
            input_strings=frozen(self.input_strings), annotations=annotations,
            decision_shapes=frozen(self.decision_shapes),
            index_map_nodes=frozenset(self.index_map_nodes),
            index_map_keys=frozenset(self.index_map_keys),
            index_map_chars=INDEX_MAP_SLACK * self.index_map_chars,
            int_range=(int(low), int(high)),
            max_instructions=INSTRUCTION_SLACK * self.longest)


# ---- checking ---------------------------------------------------------------------------------


class _Refusal(Exception):
    """A rule broken: ``str(refusal)`` is ``"<where> <rule>"``."""


class _TooDeep(Exception):
    """Lists nested deeper than :data:`MAX_NESTING` (the caller says where)."""


class _Checker:
    """One pass over a trace against a policy; raises :class:`_Refusal` at the first break."""

    def __init__(self, policy: TracePolicy) -> None:
        self.policy = policy
        #: RV name -> (kind, attrs) of the instruction that defined it.
        self.defined: dict[str, list] = {}

    def trace(self, trace) -> None:
        if not (isinstance(trace, list) and len(trace) == 2
                and all(isinstance(part, list) for part in trace)):
            raise _Refusal("trace is not [instructions, decisions] (two lists)")
        insts, decisions = trace
        if len(insts) > self.policy.max_instructions:
            raise _Refusal(f"trace has {len(insts)} instructions, over the "
                           f"{self.policy.max_instructions} allowed for {self.policy.label}")
        for index, inst in enumerate(insts):
            try:
                self.instruction(index, inst)
            except _TooDeep as error:
                raise _Refusal(f"instruction {index} {inst[0]!s:.40} {error}") from None
        try:
            self.decisions(insts, decisions)
        except _TooDeep as error:
            raise _Refusal(f"decisions: {error}") from None

    # -- instructions

    def instruction(self, index: int, inst) -> None:
        where = f"instruction {index}"
        if not (isinstance(inst, list) and len(inst) == 4):
            raise _Refusal(f"{where} is not [kind, inputs, attrs, outputs] (a list of 4)")
        kind, inputs, attrs, outputs = inst
        # an Annotate is judged by its key, even where no space of this spec annotates
        if kind != "Annotate" and (not isinstance(kind, str) or kind not in self.policy.kinds):
            raise _Refusal(f"{where} kind {_show(kind)} is not one our design spaces emit for "
                           f"{self.policy.label} (allowed: {_listed(self.policy.kinds)})")
        where = f"instruction {index} {kind}"
        if not all(isinstance(part, list) for part in (inputs, attrs, outputs)):
            raise _Refusal(f"{where}: inputs, attrs and outputs must be lists")
        if kind == "Annotate":  # its key and value first: the rule that matters there
            self.annotation(where, inputs, attrs)
            inputs = inputs[:1]
        self.attributes(where, kind, attrs)
        self.inputs(where, kind, inputs)
        self.outputs(where, kind, attrs, outputs)

    def attributes(self, where: str, kind: str, attrs: list) -> None:
        shape = tuple(_shape(a) for a in attrs)
        allowed = self.policy.attr_shapes.get(kind, frozenset())
        if shape not in allowed:
            raise _Refusal(f"{where} attributes of types {_types(shape)} are not what our "
                           f"design spaces emit (allowed: {_listed(map(_types, allowed))})")
        for position, attr in enumerate(attrs):
            if isinstance(attr, str):
                strings = self.policy.attr_strings.get((kind, position), frozenset())
                if attr not in strings:
                    raise _Refusal(f"{where} attribute {position} {_show(attr)} is not one our "
                                   f"design spaces emit for {self.policy.label} "
                                   f"(allowed: {_listed(strings)})")
        self.numbers(where, attrs)

    def inputs(self, where: str, kind: str, inputs: list) -> None:
        allowed = self.policy.input_types.get(kind, frozenset())
        for input_type, value in _leaves(inputs):
            if input_type not in allowed:
                raise _Refusal(f"{where} input {_show(value)} ({input_type}) is of a type our "
                               f"design spaces never give it (allowed: {_listed(allowed)})")
            if input_type == "rv" and value not in self.defined:
                raise _Refusal(f"{where} uses {_show(value)}, which no earlier instruction "
                               "defines")
            if input_type == "str" and kind != "Annotate":
                strings = self.policy.input_strings.get(kind, frozenset())
                if value not in strings:
                    raise _Refusal(f"{where} input {_show(value)} is not one our design spaces "
                                   f"emit (allowed: {_listed(strings)})")
            if input_type == "index_map":
                self.index_map(where, value)
            if input_type == "number":
                self.number(where, value)

    def annotation(self, where: str, inputs: list, attrs: list) -> None:
        if not (len(attrs) == 1 and isinstance(attrs[0], str)):
            raise _Refusal(f"{where} attributes {_show(attrs)} are not [key]")
        key = attrs[0]
        rule = self.policy.annotations.get(key)
        where = f"{where} key {_show(key)}"
        if rule is None:
            raise _Refusal(f"{where} is not one our design spaces emit for {self.policy.label} "
                           f"(allowed: {_listed(self.policy.annotations)})")
        if len(inputs) != 2:
            raise _Refusal(f"{where} has {len(inputs)} inputs, not [target, value]")
        value = inputs[1]
        value_type = _annotation_type(value, self.defined)
        if value_type == "rv:undefined":
            raise _Refusal(f"{where} uses {_show(value)}, which no earlier instruction defines")
        if value_type not in rule.value_types:
            raise _Refusal(f"{where} value {_show(value)} ({value_type}) is not of a type our "
                           f"design spaces give it (allowed: {_listed(rule.value_types)})")
        if value_type == "str" and value not in rule.strings:
            raise _Refusal(f"{where} value {_show(value)} is not one our design spaces emit "
                           f"(allowed: {_listed(rule.strings)})")
        for number in _annotation_numbers(value, self.defined):
            if not rule.low <= number <= rule.high:
                raise _Refusal(f"{where} value {_show(number)} is outside [{rule.low}, "
                               f"{rule.high}], the values our design spaces give it")

    def outputs(self, where: str, kind: str, attrs: list, outputs: list) -> None:
        for name in outputs:
            if not isinstance(name, str) or not _RV_NAME.fullmatch(name):
                raise _Refusal(f"{where} output {_show(name)} is not a random variable name "
                               "(b<n>, l<n> or v<n>)")
            if name in self.defined:
                raise _Refusal(f"{where} defines {_show(name)} again")
            self.defined[name] = [kind, attrs]

    def index_map(self, where: str, text: str) -> None:
        policy = self.policy
        if len(text) > policy.index_map_chars:
            raise _Refusal(f"{where} IndexMap JSON of {len(text)} characters is over the "
                           f"{policy.index_map_chars} allowed")
        try:
            graph = json.loads(text)
        except (ValueError, RecursionError):
            raise _Refusal(f"{where} IndexMap input is not JSON") from None
        if not (isinstance(graph, dict) and isinstance(graph.get("nodes"), list)
                and set(graph) <= policy.index_map_keys):
            raise _Refusal(f"{where} IndexMap JSON is not a TVM graph with keys "
                           f"{_listed(policy.index_map_keys)}")
        for node in graph["nodes"]:
            node_type = node.get("type") if isinstance(node, dict) else None
            if node_type not in policy.index_map_nodes:
                raise _Refusal(f"{where} IndexMap JSON holds a node of type {_show(node_type)}, "
                               "which our layouts never use "
                               f"(allowed: {_listed(policy.index_map_nodes)})")
        root = graph.get("root_index")
        nodes = graph["nodes"]
        if not (type(root) is int and 0 <= root < len(nodes)
                and nodes[root]["type"] == "tirx.IndexMap"):
            raise _Refusal(f"{where} IndexMap JSON's root is not a tirx.IndexMap node")

    # -- decisions

    def decisions(self, insts: list, decisions: list) -> None:
        decided: set[int] = set()
        for number, entry in enumerate(decisions):
            where = f"decision {number}"
            if not (isinstance(entry, list) and len(entry) == 2):
                raise _Refusal(f"{where} is not [instruction index, decision]")
            index, decision = entry
            if type(index) is not int or not 0 <= index < len(insts):
                raise _Refusal(f"{where} names instruction {_show(index)}, not one of the "
                               f"trace's {len(insts)}")
            if index in decided:
                raise _Refusal(f"{where} decides instruction {index} again")
            decided.add(index)
            kind, _, attrs, _ = insts[index]
            where = f"{where} (instruction {index} {kind})"
            allowed = self.policy.decision_shapes.get(kind)
            if allowed is None:
                raise _Refusal(f"{where}: only sampling instructions take decisions "
                               f"(ours: {_listed(self.policy.decision_shapes)})")
            if _shape(decision) not in allowed:
                raise _Refusal(f"{where} decision {_show(decision)} is not of a type our "
                               f"design spaces give it (allowed: {_listed(allowed)})")
            self.numbers(where, [decision])
            self.decision_range(where, kind, attrs, decision)

    def decision_range(self, where: str, kind: str, attrs: list, decision) -> None:
        """MetaSchedule's meaning of the two sampling kinds' decisions."""
        if not all(float(n).is_integer() for n in _numbers([decision])):
            raise _Refusal(f"{where} decision {_show(decision)} is not whole numbers")
        if kind == "SampleCategorical":
            candidates = attrs[0]
            if not 0 <= decision < len(candidates):
                raise _Refusal(f"{where} picks candidate {decision} of {len(candidates)}")
        elif kind == "SamplePerfectTile":
            if len(decision) != attrs[0] or any(factor < 1 for factor in decision):
                raise _Refusal(f"{where} tile {_show(decision)} is not {attrs[0]} positive "
                               "factors")

    # -- numbers

    def numbers(self, where: str, values) -> None:
        for value in _numbers(values):
            self.number(where, value)

    def number(self, where: str, value) -> None:
        low, high = self.policy.int_range
        if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            raise _Refusal(f"{where} number {_show(value)} is outside [{low}, {high}]: no loop "
                           f"of {self.policy.label} is longer and our design spaces emit "
                           "nothing larger")


# ---- JSON shapes ------------------------------------------------------------------------------


def _input_type(value) -> str:
    """The type of one trace input as TVM reads it (``TranslateInputRVs``). Numbers are one
    type: TVM's own JSON writes ``true`` as ``1`` and ``1.0`` as ``1``, and reads either."""
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        if value == "None":
            return "none"
        if value[:1] == "{" and value[-1:] == "}" and len(value) >= 2:
            return "index_map"
        if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
            return "str"
        return "rv"
    if isinstance(value, list):
        return "list"
    return "null" if value is None else type(value).__name__


def _leaves(inputs: list, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(type, value) of every input, list elements included (each list also as "list")."""
    if depth > MAX_NESTING:
        raise _TooDeep(f"inputs nest over {MAX_NESTING} lists deep")
    for value in inputs:
        input_type = _input_type(value)
        yield input_type, value
        if input_type == "list":
            yield from _leaves(value, depth + 1)


def _shape(value, depth: int = 0) -> str:
    """The JSON type signature of an attribute or decision: ``number``, ``str``, ``null``,
    ``list[number]``..."""
    if depth > MAX_NESTING:
        raise _TooDeep(f"attributes or decisions nest over {MAX_NESTING} lists deep")
    if isinstance(value, list):
        return "list[" + ",".join(sorted({_shape(v, depth + 1) for v in value})) + "]"
    if isinstance(value, int | float):  # bools too (see _input_type)
        return "number"
    if isinstance(value, str):
        return "str"
    return "null" if value is None else type(value).__name__


def _numbers(values) -> list:
    """Every number in ``values`` (lists flattened; bools count as 0 and 1)."""
    out = []
    for value in values:
        if isinstance(value, list):
            out += _numbers(value)
        elif isinstance(value, int | float):
            out.append(value)
    return out


def _annotation_type(value, defined: dict) -> str:
    """``number``, ``list[number]``, ``str``, ``rv:<kind that defined it>``, or the JSON
    type."""
    input_type = _input_type(value)
    if input_type == "rv":
        definer = defined.get(value)
        return f"rv:{definer[0]}" if definer else "rv:undefined"
    if input_type == "list":
        return _shape(value)
    return input_type


def _annotation_numbers(value, defined: dict) -> list:
    """The numbers an annotation value can be: itself, its elements, or every candidate of the
    categorical sample that defines it."""
    if isinstance(value, str):
        definer = defined.get(value)
        if definer and definer[0] == "SampleCategorical":
            return _numbers(definer[1][:1])
        return []
    return _numbers([value])


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW_AT_MOST else text[:_SHOW_AT_MOST - 4] + "...'"


def _types(shape: tuple) -> str:
    return "(" + ", ".join(shape) + ")"


def _listed(values) -> str:
    values = sorted(str(v) for v in values)
    if not values:
        return "none"
    more = len(values) - _LIST_AT_MOST
    return ", ".join(values[:_LIST_AT_MOST]) + (f", ... ({more} more)" if more > 0 else "")
