"""``db import`` and ``db merge`` validate everything a file or another database holds, then
store it in one transaction: a single bad line refuses the whole import, with a report."""

import copy
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import targets
from qcompile import _tvm
from qcompile.errors import DatabaseError
from qcompile.kernels import UniformSpec
from qcompile.testing.records import commit_records, uniform_trace
from qcompile.trust import records
from qcompile.trust.records import ImportRefused
from qcompile.trust.workloads import workload_database
from tuning_db import Provenance, Storage, transfer

ROOT = Path(__file__).resolve().parents[2]
SPEC = UniformSpec(k=256, n=128, bits=4, group_size=64)


def _target():
    preset = targets.get("avx2")
    return _tvm.Target(preset.tvm_target(preset.hardware(cores=2)))


@pytest.fixture(scope="module")
def export_lines(tmp_path_factory):
    """A real export: one workload, three ok records and one failure, as parsed lines."""
    directory = tmp_path_factory.mktemp("export")
    source = Storage(f"sqlite:///{directory / 'source.sqlite'}")
    provenance = Provenance(host="alice-box", device_model="EPYC", tvm_version=_tvm.TVM_VERSION,
                            tvm_ffi_version=_tvm.TVM_FFI_VERSION, qcompile_version="0.1.0",
                            user="alice")
    commit_records(workload_database(source, SPEC, _target(), provenance=provenance),
                   SPEC, {0: [3e-5], 1: [1e-5], 2: [2e-5], 3: None})
    path = directory / "records.jsonl"
    transfer.export_jsonl(source, path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(tmp_path, lines, name="in.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _with(lines, index, **changes):
    out = [dict(line) for line in lines]
    out[index].update(changes)
    return out


def _refused(tmp_path, lines, match):
    storage = Storage("sqlite://")
    with pytest.raises(ImportRefused, match=match) as caught:
        records.import_file(storage, _write(tmp_path, lines))
    assert storage.count_records() == 0 and storage.count_workloads() == 0, \
        "a refused import stored something"
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_clean_export_imports_with_claimed_provenance(tmp_path, export_lines):
    storage = Storage("sqlite://")
    count = records.import_file(storage, _write(tmp_path, export_lines))
    assert (count.workloads, count.records) == (1, 4)
    stored = storage.records()
    assert {r.claimed for r in stored} == {True}
    assert {r.user for r in stored} == {"alice"}, "provenance is kept"
    assert {r.origin for r in stored} == {"import in.jsonl"}


@pytest.mark.parametrize("bad", [-1e-5, 0.0, math.nan, math.inf, "fast", True, None, [], 1e9])
def test_run_secs_must_be_finite_positive_seconds(tmp_path, export_lines, bad):
    value = [bad] if bad is not None and bad != [] else bad
    lines = _with(export_lines, 2, run_secs=value)
    text = json.dumps(lines[2])  # json writes NaN/Infinity, as a hostile file would
    assert "run_secs" in text
    _refused(tmp_path, lines, "run_secs|run times")


@pytest.mark.parametrize("digest", ["../../../tmp/x", "A" * 64, "0" * 63, 12])
def test_digests_are_recomputed_and_only_hex(tmp_path, export_lines, digest):
    _refused(tmp_path, _with(export_lines, 2, digest=digest), "digest")


def test_a_digest_that_disagrees_with_its_content_is_refused(tmp_path, export_lines):
    _refused(tmp_path, _with(export_lines, 2, digest="0" * 64),
             r"digest 000000000000 does not match its content")


@pytest.mark.parametrize("field, value, match", [
    ("spec_json", "not json", "spec_json is not valid JSON"),
    ("spec_json", json.dumps({"family": "uniform", "k": 4000, "n": 128}), "invalid kernel spec"),
    ("spec_json", json.dumps({"family": "nope"}), "invalid kernel spec"),
    ("spec_json", json.dumps([1, 2]), "must be a JSON object"),
    ("target_json", json.dumps({"kind": "llvm", "mcpu": "znver9", "num-cores": 2}),
     "not one qcompile's presets give"),
    ("target_json", json.dumps({"kind": "llvm", "mcpu": "core-avx2", "num-cores": -2}),
     "num-cores"),
    ("mod_hash", "123", "other TensorIR"),
])
def test_workload_lines_are_parsed_like_the_cli(tmp_path, export_lines, field, value, match):
    _refused(tmp_path, _with(export_lines, 1, **{field: value}), match)


def _avx512_target() -> str:
    preset = targets.get("avx512")
    return json.dumps(_tvm.target_dict(_tvm.Target(preset.tvm_target(preset.hardware(cores=2)))))


@pytest.mark.parametrize("field, value, match", [
    ("trace_json", "[[[", "trace_json is not valid JSON"),
    ("trace_json", json.dumps([[["NoSuchInstruction", [], [], []]], []]), "NoSuchInstruction"),
    ("args_info_json", json.dumps([["TENSOR", "float32", [1, 1]]]), "args_info"),
    ("target_json", _avx512_target, "not its workload's target"),
    ("status", "great", "status must be one of"),
    ("user", "mallory\x1b[2J", "control or format character U\\+001B"),
    ("host", "x" * 300, "host holds 300 characters"),
    ("created_at", "yesterday", "ISO 8601"),
    ("seal", "trust me", "seal must be"),
    ("other_load", -3, "other_load"),
])
def test_record_lines_are_checked(tmp_path, export_lines, field, value, match):
    lines = _with(export_lines, 2, **{field: value() if callable(value) else value})
    if field == "trace_json":  # a new trace has a new digest: leave it to be computed
        del lines[2]["digest"]
    _refused(tmp_path, lines, match)


def test_the_malicious_annotation_is_refused(tmp_path, export_lines):
    trace = json.loads(export_lines[2]["trace_json"])
    loop = next(inst[3][0] for inst in trace[0] if inst[0] == "GetLoops")
    ctor = ('@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] '
            '[{ i32, ptr, ptr } { i32 0, ptr @pwn, ptr null }]')
    trace[0].insert(len(trace[0]) - 1, ["Annotate", [loop, json.dumps(ctor)],
                                         ["pragma_import_llvm"], []])
    lines = _with(export_lines, 2, trace_json=json.dumps(trace))
    del lines[2]["digest"]
    error = _refused(tmp_path, lines, "pragma_import_llvm")
    assert "record " in str(error)


def test_one_bad_line_refuses_the_whole_import_with_a_report(tmp_path, export_lines, db_url):
    lines = _with(export_lines, 3, run_secs=[-1.0])
    lines.append({"type": "mystery"})
    lines.insert(2, "not an object")
    storage = Storage(db_url)
    with pytest.raises(ImportRefused) as caught:
        records.import_file(storage, _write(tmp_path, lines))
    assert storage.count_records() == 0 and storage.count_workloads() == 0
    problems = caught.value.problems
    assert len(problems) == 3
    assert problems[0].startswith("in.jsonl:3: line: not a JSON object")
    assert "in.jsonl:5" in problems[1] and "run times" in problems[1]
    assert "unknown line type 'mystery'" in problems[2]
    # the report survives a process pool's pickling (a parallel build reads packs)
    rebuilt = pickle.loads(pickle.dumps(caught.value))
    assert str(rebuilt) == str(caught.value) and rebuilt.problems == problems
    # and the clean file goes in whole
    assert records.import_file(storage, _write(tmp_path, export_lines)).records == 4


def test_structure_errors_name_the_line(tmp_path, export_lines):
    _refused(tmp_path, [export_lines[0], export_lines[2]], "which no earlier line")
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(export_lines[0]) + "\n{not json\n")
    with pytest.raises(ImportRefused, match="broken.jsonl:2: line: not a JSON object"):
        records.import_file(Storage("sqlite://"), path)


def test_merge_validates_like_an_import(tmp_path):
    """A hostile writer put a record straight into their database: merge refuses it all."""
    other = Storage(f"sqlite:///{tmp_path / 'other.sqlite'}")
    mod = commit_records(workload_database(other, SPEC, _target()), SPEC,
                         {0: [3e-5], 1: [1e-5]})
    workload = other.workloads()[0]
    sch = uniform_trace(SPEC, 2, mod)
    from tuning_db.database import record_json

    record = _tvm.TuningRecord(sch.trace, _tvm.Workload(mod), [1e-5], _target(),
                               _tvm.ms.arg_info.ArgInfo.from_entry_func(sch.mod))
    trace, _, target, args = record_json(record)
    other.add_record(workload_id=workload.id, digest="e" * 64, status="ok", run_secs=[1e-9],
                     trace_json=json.dumps(trace), args_info_json=json.dumps(args),
                     target_json=workload.target_json)
    dest = Storage("sqlite://")
    with pytest.raises(ImportRefused, match="digest eeeeeeeeeeee does not match its content"):
        records.merge(other, dest)
    assert dest.count_records() == 0


def test_cli_import_prints_every_problem_then_one_error_line(tmp_path, export_lines):
    path = _write(tmp_path, _with(export_lines, 2, run_secs=[float("nan")]))
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    result = subprocess.run([sys.executable, "-m", "qcompile.cli", "db", "import", str(path),
                             "--db", db], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("qcompile: error")]
    assert len(errors) == 1 and "nothing was stored" in errors[0]
    assert "  refused: in.jsonl:3: record: run times must be finite" in result.stderr
    assert Storage(db).count_records() == 0


# ---- fuzz: no records file makes import do anything but succeed or refuse in one line ---------

_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)


@st.composite
def _mutated_file(draw, lines):
    """The bytes of a records file: a real export with keys dropped, values swapped for random
    JSON, lines duplicated, dropped or reordered, random lines, random bytes or flipped bytes."""
    how = draw(st.sampled_from(["drop", "swap", "swap", "lines", "random", "bytes", "flip"]))
    if how == "bytes":
        return draw(st.binary(max_size=400))
    lines = copy.deepcopy(lines)
    if how == "random":
        lines[draw(st.integers(1, len(lines) - 1))] = draw(_json_value)
    elif how == "lines":
        index = draw(st.integers(1, len(lines) - 1))
        lines.insert(draw(st.integers(1, len(lines))), lines.pop(index))
        if draw(st.booleans()):
            lines.append(lines[draw(st.integers(1, len(lines) - 1))])
    elif how in ("drop", "swap"):
        for _ in range(draw(st.integers(1, 3))):
            line = lines[draw(st.integers(0, len(lines) - 1))]
            if not line:
                continue
            key = draw(st.sampled_from(sorted(line)))
            if how == "drop":
                del line[key]
            else:
                line[key] = draw(_json_value)
    text = bytearray("".join(json.dumps(line) + "\n" for line in lines).encode())
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            text[draw(st.integers(0, len(text) - 1))] = draw(st.integers(0, 255))
    return bytes(text)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_records_file_imports_or_refuses_in_one_line(data, export_lines, tmp_path):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data.draw(_mutated_file(export_lines)))
    storage = Storage("sqlite://")
    try:
        records.import_file(storage, path)
    except DatabaseError as error:  # RecordRefused and ImportRefused are DatabaseErrors
        assert str(error) and "\n" not in str(error), str(error)
        for problem in getattr(error, "problems", []):
            assert problem and "\n" not in problem, problem
        assert storage.count_records() == 0 and storage.count_workloads() == 0
    else:
        for record in storage.records():
            assert record.claimed and record.digest in {
                line.get("digest") for line in export_lines if isinstance(line, dict)}
