"""The trace policy (qcompile.trust.traces) refuses every kind of trace our design spaces never
emit, each with one line naming the record's digest, the instruction and the rule.

Each case starts from a real trace of a design space (as MetaSchedule stores it) and changes
one thing, as a hostile writer of a shared database or a records file would. Scheduling only:
nothing is compiled.
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from qcompile import _tvm
from qcompile.errors import RecordRefused
from qcompile.kernels import BcqSpec, UniformSpec
from qcompile.trust.traces import (
    check_record_trace,
    check_trace,
    policy_for,
    target_kind_of,
)
from schedules import get_design_space
from schedules.variants import compute_for
from targets.hardware import CpuHardware
from tuning_db.database import _plain_json

DIGEST = "8db7eebffc00" + "5" * 52
CPU = CpuHardware(l1d_bytes=48 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20,
                  vector_registers=16, vector_bits=256, cores=2)

#: The CPU int8 space: TransformLayout, Tensorize, SetScope, SampleCategorical.
INT8_CPU = (UniformSpec(k=256, n=128, int8_activations=True), "cpu")
#: The CUDA float space: Annotate (a sampled unroll step, an int), Bind, SampleCategorical.
FLOAT_CUDA = (UniformSpec(k=256, n=128, m=2), "cuda")
#: The BCQ CPU space: SamplePerfectTile.
BCQ_CPU = (BcqSpec(k=256, n=128), "cpu")

#: LLVM IR that runs a function when the library holding it is loaded: what a hostile record
#: hands to ``pragma_import_llvm`` (here the function does nothing; the policy refuses the key).
ATTACK_IR = """@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] \
[{ i32, ptr, ptr } { i32 65535, ptr @qcompile_attack, ptr null }]

define internal void @qcompile_attack() {
entry:
  ret void
}
"""


def _hw(target_kind: str):
    if target_kind == "cpu":
        return CPU
    import targets

    return targets.get("cuda").hardware()


def _schedule(spec, target_kind, seed=1):
    mod = _tvm.normalize_mod(compute_for(spec, target_kind))
    return get_design_space(spec, target_kind)(_tvm.Schedule(mod, seed=seed), spec,
                                               _hw(target_kind))[0]


def _stored(sch) -> list:
    """The trace as MetaSchedule measures and we store it."""
    sch.enter_postproc()
    return _plain_json(sch.trace.as_json())


_TRACES: dict = {}


def _trace(variant) -> list:
    """A fresh copy of the first sketch's stored trace of ``variant``."""
    if variant not in _TRACES:
        _TRACES[variant] = _stored(_schedule(*variant))
    return copy.deepcopy(_TRACES[variant])


def _policy(variant):
    return policy_for(*variant)


def _index(trace, kind, start=0) -> int:
    return next(i for i, inst in enumerate(trace[0]) if inst[0] == kind and i >= start)


def _refusal(trace, variant) -> str:
    with pytest.raises(RecordRefused) as error:
        check_trace(trace, _policy(variant), digest=DIGEST)
    message = str(error.value)
    assert "\n" not in message and message.startswith("record 8db7eebffc00: "), message
    return message


def _loop(trace) -> str:
    """A loop variable the trace defines."""
    return next(out for inst in trace[0] for out in inst[3] if out.startswith("l"))


def _annotate(trace, key, value) -> int:
    """Insert ``Annotate(loop, value, key)`` before EnterPostproc; returns its index."""
    at = len(trace[0]) - 1
    trace[0].insert(at, ["Annotate", [_loop(trace), value], [key], []])
    return at


# ---- what passes ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [INT8_CPU, FLOAT_CUDA, BCQ_CPU], ids=str)
def test_our_traces_pass_as_json_and_as_stored_text(variant):
    trace = _trace(variant)
    check_trace(trace, _policy(variant), digest=DIGEST)
    spec, target_kind = variant
    text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
    check_record_trace(text, spec.to_dict(), {"kind": "llvm" if target_kind == "cpu" else
                                                      target_kind}, digest=DIGEST)


def test_policy_is_derived_once_per_spec_and_target_kind():
    assert policy_for(*INT8_CPU) is policy_for(*INT8_CPU)
    assert policy_for(INT8_CPU[0], "llvm") is policy_for(*INT8_CPU)
    assert policy_for(INT8_CPU[0], "cuda") is not policy_for(*INT8_CPU)


def test_policy_holds_what_the_spaces_emit():
    cpu, cuda = _policy(INT8_CPU), _policy(FLOAT_CUDA)
    assert {"Tensorize", "TransformLayout", "EnterPostproc"} <= cpu.kinds
    assert "Annotate" not in cpu.kinds and "Bind" not in cpu.kinds
    assert cpu.attr_strings[("Tensorize", 0)] == {"qcompile_avx2_dot_8x4_u8s8_i16",
                                                 "qcompile_avx2_widen_8x2_i16_i32"}
    assert set(cuda.annotations) == {"pragma_auto_unroll_max_step", "pragma_unroll_explicit"}
    unroll = cuda.annotations["pragma_auto_unroll_max_step"]
    assert unroll.value_types == {"rv:SampleCategorical"} and unroll.high == 512
    assert cpu.index_map_nodes >= {"tirx.IndexMap", "ir.Var"}
    assert "tirx.Call" not in cpu.index_map_nodes
    # no loop of a 256 x 128 kernel is longer than K * N (+ the scratch of the int8 space)
    assert cpu.int_range[0] == -1 and 256 * 128 <= cpu.int_range[1] <= 256 * 128 * 4


def test_target_kinds():
    assert target_kind_of("llvm") == target_kind_of({"kind": "llvm", "mcpu": "x"}) == "cpu"
    assert target_kind_of(_tvm.Target({"kind": "llvm"})) == "cpu"
    with pytest.raises(ValueError, match="no design spaces for target kind 'rocm'"):
        target_kind_of("rocm")


# ---- unknown instruction kinds ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["StorageAlign", "Blockize", "RunShellCommand"])
def test_unknown_instruction_kind(kind):
    trace = _trace(INT8_CPU)
    trace[0].insert(3, [kind, ["b1"], [0, 0, 16, 0], []])
    message = _refusal(trace, INT8_CPU)
    assert re.match(rf"record 8db7eebffc00: instruction 3 kind '{kind}' is not one our design "
                    r"spaces emit for uniform_b4_g128_k256_n128_m1_f32_xi8 on cpu \(allowed: "
                    r".*Tensorize", message), message


# ---- annotations: the native-code attack, keys, value types, values ----------------------------


def test_import_llvm_annotation_is_refused_with_its_key():
    from tvm.s_tir.schedule import LoopRV

    sch = _schedule(*FLOAT_CUDA)
    loops = [out for inst in sch.trace.insts for out in inst.outputs if isinstance(out, LoopRV)]
    sch.annotate(loops[-1], "pragma_import_llvm", ATTACK_IR)  # on one of its own loops
    trace = _stored(sch)
    index = len(trace[0]) - 2
    assert trace[0][index][2] == ["pragma_import_llvm"] and "global_ctors" in trace[0][index][1][1]
    message = _refusal(trace, FLOAT_CUDA)
    assert message.startswith(
        f"record 8db7eebffc00: instruction {index} Annotate key 'pragma_import_llvm' is not one "
        "our design spaces emit for uniform_b4_g128_k256_n128_m2_f32 on cuda (allowed: "
        "pragma_auto_unroll_max_step, pragma_unroll_explicit)"), message
    assert "global_ctors" not in message  # the payload is never echoed


def test_annotate_is_refused_where_no_space_annotates():
    trace = _trace(INT8_CPU)
    index = _annotate(trace, "pragma_import_llvm", json.dumps(ATTACK_IR))
    assert _refusal(trace, INT8_CPU) == (
        f"record 8db7eebffc00: instruction {index} Annotate key 'pragma_import_llvm' is not one "
        "our design spaces emit for uniform_b4_g128_k256_n128_m1_f32_xi8 on cpu (allowed: none)")


@pytest.mark.parametrize("key,value,rule", [
    ("pragma_auto_unroll_max_step", '"512"',
     r"value '\"512\"' \(str\) is not of a type our design spaces give it \(allowed: "
     r"rv:SampleCategorical\)"),
    ("pragma_auto_unroll_max_step", 512,
     r"value 512 \(number\) is not of a type our design spaces give it"),
    ("pragma_auto_unroll_max_step", "b6",
     r"value 'b6' \(rv:GetSBlock\) is not of a type our design spaces give it"),
    ("pragma_unroll_explicit", [1, 1],
     r"value \[1, 1\] \(list\[number\]\) is not of a type our design spaces give it"),
    ("pragma_unroll_explicit", 1 << 20,
     r"value 1048576 is outside \[0, 1\], the values our design spaces give it"),
    ("pragma_unroll_explicit", "v999", r"uses 'v999', which no earlier instruction defines"),
])
def test_allowed_key_with_a_wrong_value(key, value, rule):
    trace = _trace(FLOAT_CUDA)
    index = _annotate(trace, key, value)
    message = _refusal(trace, FLOAT_CUDA)
    assert re.match(rf"record 8db7eebffc00: instruction {index} Annotate key '{key}' {rule}",
                    message), message


def test_sampled_unroll_step_beyond_what_our_spaces_sample():
    trace = _trace(FLOAT_CUDA)
    unroll = next(inst for inst in trace[0] if inst[2] == ["pragma_auto_unroll_max_step"])
    sampler = next(i for i, inst in enumerate(trace[0]) if inst[3] == [unroll[1][1]])
    # within the loop bound (so the sample itself passes), 8x the largest step we sample
    trace[0][sampler][2][0][-1] = 4096
    index = trace[0].index(unroll)
    message = _refusal(trace, FLOAT_CUDA)
    assert re.match(rf"record 8db7eebffc00: instruction {index} Annotate key "
                    r"'pragma_auto_unroll_max_step' value 4096 is outside \[0, 512\], the values "
                    "our design spaces give it", message), message


# ---- string attributes ------------------------------------------------------------------------


@pytest.mark.parametrize("variant,kind,position,value", [
    (INT8_CPU, "GetSBlock", 0, "hostile_block"),
    (INT8_CPU, "GetSBlock", 1, "other_function"),
    (INT8_CPU, "SetScope", 1, "global.texture"),
    (INT8_CPU, "Tensorize", 0, "dot_16x4_vnni"),  # TVM's intrinsic, not one of ours
    (FLOAT_CUDA, "Bind", 0, "vthread.x"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_string_attribute_not_in_the_set(variant, kind, position, value):
    trace = _trace(variant)
    index = _index(trace, kind)
    trace[0][index][2][position] = value
    message = _refusal(trace, variant)
    assert re.match(rf"record 8db7eebffc00: instruction {index} {kind} attribute {position} "
                    rf"'{re.escape(value)}' is not one our design spaces emit for .* \(allowed: ",
                    message), message


def test_attributes_of_another_shape():
    trace = _trace(INT8_CPU)
    index = _index(trace, "Tensorize")
    trace[0][index][2].append("extra")
    assert re.match(rf"record 8db7eebffc00: instruction {index} Tensorize attributes of types "
                    r"\(str, number, str\) are not what our design spaces emit \(allowed: "
                    r"\(str, number\)\)", _refusal(trace, INT8_CPU))


def test_string_input_no_space_gives():
    trace = _trace(INT8_CPU)
    index = _index(trace, "Split")
    trace[0][index][1].append('"text"')
    assert re.match(rf"record 8db7eebffc00: instruction {index} Split input '\"text\"' \(str\) "
                    "is of a type our design spaces never give it", _refusal(trace, INT8_CPU))


# ---- random variables -------------------------------------------------------------------------


def test_undefined_random_variable():
    trace = _trace(INT8_CPU)
    index = _index(trace, "Split")
    trace[0][index][1][0] = "l999"
    assert re.match(rf"record 8db7eebffc00: instruction {index} Split uses 'l999', which no "
                    "earlier instruction defines", _refusal(trace, INT8_CPU))


def test_random_variable_used_before_its_definition():
    trace = _trace(INT8_CPU)
    index = _index(trace, "GetLoops")
    trace[0].insert(0, trace[0].pop(index))  # GetLoops before the GetSBlock it reads
    assert re.match(r"record 8db7eebffc00: instruction 0 GetLoops uses 'b\d+', which no "
                    "earlier instruction defines", _refusal(trace, INT8_CPU))


@pytest.mark.parametrize("name,rule", [
    ("None", r"output 'None' is not a random variable name"),
    ('"x"', r"output '\"x\"' is not a random variable name"),
    ("b0", r"defines 'b0' again"),
])
def test_bad_output_names(name, rule):
    trace = _trace(INT8_CPU)
    index = _index(trace, "GetLoops")
    trace[0][index][3][0] = name
    assert re.match(rf"record 8db7eebffc00: instruction {index} GetLoops {rule}",
                    _refusal(trace, INT8_CPU))


# ---- malformed structure ----------------------------------------------------------------------


@pytest.mark.parametrize("change,rule", [
    (lambda t: t[0].__setitem__(2, t[0][2][:3]),
     r"instruction 2 is not \[kind, inputs, attrs, outputs\] \(a list of 4\)"),
    (lambda t: t[0].__setitem__(2, "GetSBlock"),
     r"instruction 2 is not \[kind, inputs, attrs, outputs\]"),
    (lambda t: t[0][2].__setitem__(0, 7), r"instruction 2 kind 7 is not one our design spaces"),
    (lambda t: t[0][2].__setitem__(1, "b0"),
     r"instruction 2 \w+: inputs, attrs and outputs must be lists"),
    (lambda t: t[0][_index(t, "CacheWrite")][1].append([[[[[[[[[["b0"]]]]]]]]]]),
     r"instruction \d+ CacheWrite inputs nest over 8 lists deep"),
    (lambda t: t.append([]), r"trace is not \[instructions, decisions\] \(two lists\)"),
    (lambda t: t.__setitem__(1, {"0": 1}), r"trace is not \[instructions, decisions\]"),
    (lambda t: t[1].append([3]), r"decision \d+ is not \[instruction index, decision\]"),
    (lambda t: t[0].extend(t[0][:1] * 500), r"trace has \d+ instructions, over the \d+ allowed"),
])
def test_malformed_trace(change, rule):
    trace = _trace(INT8_CPU)
    change(trace)
    message = _refusal(trace, INT8_CPU)
    assert re.match(rf"record 8db7eebffc00: {rule}", message), message


def test_trace_text_that_is_not_json():
    spec, target_kind = INT8_CPU
    for text in ("[[", "NaN]", "[" * 100000):
        with pytest.raises(RecordRefused, match=r"^record 8db7eebffc00: trace is not JSON"):
            check_record_trace(text, spec, target_kind, digest=DIGEST)


def test_spec_without_a_design_space_refuses_every_trace():
    # one group of 4096 rows at mu=8 needs 512 KiB of tables: no GPU space takes it
    spec = BcqSpec(k=4096, n=4096, mu=8, group_size=-1)
    with pytest.raises(RecordRefused, match=r"^record 8db7eebffc00: no trace can be checked: "
                                            r"no design space of ours takes bcq_q3_gcol_mu8"):
        check_record_trace("[[], []]", spec, "cuda", digest=DIGEST)


# ---- IndexMap JSON ----------------------------------------------------------------------------


def _index_map(trace) -> tuple[int, dict]:
    index = _index(trace, "TransformLayout")
    return index, json.loads(trace[0][index][1][1])


@pytest.mark.parametrize("change,rule", [
    (lambda g: g["nodes"].append({"type": "tirx.Call", "data": {}}),
     r"IndexMap JSON holds a node of type 'tirx.Call', which our layouts never use \(allowed: "),
    (lambda g: g["nodes"].append({"type": "runtime.Tensor", "data": "AAAA"}),
     r"IndexMap JSON holds a node of type 'runtime.Tensor'"),
    (lambda g: g["nodes"].append("ffi.String"), r"IndexMap JSON holds a node of type None"),
    (lambda g: g.__setitem__("b64ndarrays", ["AAAA"]),
     r"IndexMap JSON is not a TVM graph with keys metadata, nodes, root_index"),
    (lambda g: g.__setitem__("root_index", 1),
     r"IndexMap JSON's root is not a tirx.IndexMap node"),
])
def test_index_map_with_a_disallowed_node(change, rule):
    trace = _trace(INT8_CPU)
    index, graph = _index_map(trace)
    change(graph)
    trace[0][index][1][1] = json.dumps(graph)
    message = _refusal(trace, INT8_CPU)
    assert re.match(rf"record 8db7eebffc00: instruction {index} TransformLayout {rule}",
                    message), message


def test_index_map_that_is_not_json_or_too_long():
    trace = _trace(INT8_CPU)
    index, graph = _index_map(trace)
    trace[0][index][1][1] = "{not json}"
    assert re.match(rf"record 8db7eebffc00: instruction {index} TransformLayout IndexMap input "
                    "is not JSON", _refusal(trace, INT8_CPU))
    graph["nodes"] += [{"type": "None"}] * 10000
    trace[0][index][1][1] = json.dumps(graph)
    assert re.match(rf"record 8db7eebffc00: instruction {index} TransformLayout IndexMap JSON of "
                    r"\d+ characters is over the \d+ allowed", _refusal(trace, INT8_CPU))


# ---- numbers: split and tile factors, probabilities --------------------------------------------


@pytest.mark.parametrize("number", [1 << 40, -5, 10 ** 30])
def test_absurd_split_factor(number):
    trace = _trace(INT8_CPU)
    index = _index(trace, "Split")
    trace[0][index][1][-1] = number
    message = _refusal(trace, INT8_CPU)
    assert re.match(rf"record 8db7eebffc00: instruction {index} Split number {number} is outside "
                    r"\[-1, \d+\]: no loop of uniform_b4_g128_k256_n128_m1_f32_xi8 on cpu is "
                    "longer and our design spaces emit nothing larger", message), message


@pytest.mark.parametrize("candidates,probs,rule", [
    ([2, 1 << 40], [0.5, 0.5], r"number 1099511627776 is outside"),
    ([2, 4], [0.5, float("nan")], r"number nan is outside"),
    ([2, 4], [0.5, float("inf")], r"number inf is outside"),
])
def test_absurd_sampling_attributes(candidates, probs, rule):
    trace = _trace(INT8_CPU)
    index = _index(trace, "SampleCategorical")
    trace[0][index][2] = [candidates, probs]
    assert re.match(rf"record 8db7eebffc00: instruction {index} SampleCategorical {rule}",
                    _refusal(trace, INT8_CPU))


def test_absurd_tile_decision():
    trace = _trace(BCQ_CPU)
    position, (index, _) = next((p, d) for p, d in enumerate(trace[1])
                                if trace[0][d[0]][0] == "SamplePerfectTile")
    trace[1][position][1] = [1, 1, 1 << 40]
    assert re.match(rf"record 8db7eebffc00: decision {position} \(instruction {index} "
                    r"SamplePerfectTile\) number 1099511627776 is outside \[-1, \d+\]",
                    _refusal(trace, BCQ_CPU))


# ---- decisions --------------------------------------------------------------------------------


@pytest.mark.parametrize("change,rule", [
    (lambda t: t[1][0].__setitem__(0, 10 ** 6), r"decision 0 names instruction 1000000, not one "
                                                r"of the trace's \d+"),
    (lambda t: t[1][0].__setitem__(0, -1), r"decision 0 names instruction -1"),
    (lambda t: t[1][0].__setitem__(0, True), r"decision 0 names instruction True"),
    (lambda t: t[1].append(list(t[1][0])), r"decision \d+ decides instruction \d+ again"),
    (lambda t: t[1][0].__setitem__(1, 7),
     r"decision 0 \(instruction \d+ SampleCategorical\) picks candidate 7 of 2"),
    (lambda t: t[1][0].__setitem__(1, [0]),
     r"decision 0 \(instruction \d+ SampleCategorical\) decision \[0\] is not of a type"),
])
def test_bad_decisions(change, rule):
    trace = _trace(INT8_CPU)
    change(trace)
    message = _refusal(trace, INT8_CPU)
    assert re.match(rf"record 8db7eebffc00: {rule}", message), message


def test_decision_for_an_instruction_that_samples_nothing():
    trace = _trace(INT8_CPU)
    index = _index(trace, "GetSBlock")
    trace[1].append([index, 0])
    assert re.match(rf"record 8db7eebffc00: decision \d+ \(instruction {index} GetSBlock\): only "
                    r"sampling instructions take decisions \(ours: SampleCategorical\)",
                    _refusal(trace, INT8_CPU))


def test_tile_decision_of_the_wrong_length():
    trace = _trace(BCQ_CPU)
    position = next(p for p, d in enumerate(trace[1]) if trace[0][d[0]][0] == "SamplePerfectTile")
    trace[1][position][1] = [2, 2]
    assert re.search(r"SamplePerfectTile\) tile \[2, 2\] is not 3 positive factors",
                     _refusal(trace, BCQ_CPU))


def test_a_cuda_trace_is_not_a_cpu_record():
    # the policies differ per target kind: a CUDA trace is refused as a CPU record of its spec
    with pytest.raises(RecordRefused, match=r"^record 8db7eebffc00: .* for "
                                            r"uniform_b4_g128_k256_n128_m2_f32 on cpu"):
        check_record_trace(_trace(FLOAT_CUDA), FLOAT_CUDA[0], "cpu", digest=DIGEST)
