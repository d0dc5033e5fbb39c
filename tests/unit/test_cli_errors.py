"""Every user error of the command line is one line on stderr (the rule and the numbers), exit
status 2, no traceback; --debug or QCOMPILE_DEBUG=1 shows the traceback; a bug says it is one
(exit 1); Ctrl-C exits 130. Arguments are refused before TVM or torch is imported.

Each case runs ``python -m qcompile.cli`` in a fresh process (a fraction of a second: none of
them imports TVM), so the exit status and stderr are what a user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GPTQ = REPO / "tests" / "data" / "gptq" / "gptqmodel_b4_g128_sym_v2"
TUNE = ["tune", "--target", "avx2"]


@pytest.fixture
def env(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("QCOMPILE_DB", "QCOMPILE_DEBUG")}
    return {**environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")])}


def qcompile(args, env, **extra):
    return subprocess.run([sys.executable, "-m", "qcompile.cli", *args], env={**env, **extra},
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def assert_one_line(result, *fragments, status=2):
    """Exit ``status``, exactly one line on stderr holding every fragment, no traceback."""
    lines = result.stderr.splitlines()
    assert result.returncode == status, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def checkpoint(tmp_path):
    """A copy of a small GPTQ checkpoint whose files a test may break."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    for name in ("quantize_config.json", "config.json", "model.safetensors"):
        (directory / name).write_bytes((GPTQ / name).read_bytes())
    return directory


def _set_dynamic(checkpoint: Path, dynamic) -> None:
    path = checkpoint / "quantize_config.json"
    config = json.loads(path.read_text())
    config["dynamic"] = dynamic
    path.write_text(json.dumps(config))


# ---- the cases of issue 22 and the hostile-user sweep ------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--trials", "0"], ["argument --trials", "positive integer", "got 0"]),
    (["--trials", "-1"], ["argument --trials", "got -1"]),
    (["--trials", "many"], ["argument --trials", "'many'"]),
    (["--shape", "4096x4095"], ["N=4095 must be divisible by 8", "qzeros"]),
    (["--shape", "4096x4100", "--bits", "3"], ["N=4100 must be divisible by 32"]),
    (["--shape", "4096"], ["argument --shape", "KxN", "'4096'"]),
    (["--shape", "0x4096"], ["K must be a positive integer; got 0"]),
    (["--shape", "65536x65536"], ["W [K, N] = 65536 x 65536 = 4294967296 elements",
                                  "2147483647 (2**31 - 1)"]),
    (["--batch", "1000000"], ["x [M, K] = 1000000 x 4096", "2147483647"]),
    (["--bits", "5"], ["bits=5 is not supported", "(2, 3, 4, 8)"]),
    (["--group-size", "0"], ["K=4096 must be divisible by group_size=0"]),
    (["--group-size", "100"], ["K=4096 must be divisible by group_size=100"]),
    (["--batch", "0"], ["argument --batch", "got 0"]),
    (["--dtype", "int4"], ["dtype='int4' is not supported", "float32"]),
    (["--family", "nope"], ["argument --family", "'nope'", "uniform"]),
    (["--family", "bcq", "--dtype", "float16"], ["dtype='float16'", "bcq"]),
    (["--family", "mixed", "--shape", "131072x4096"], ["K=131072 exceeds 65536"]),
    (["--seed", "x"], ["argument --seed", "'x'"]),
    (["--db", "notaurl"], ["--db 'notaurl' is not a database URL", "postgresql://"]),
    (["--db", "foo://host/db"], ["database kind 'foo' is not supported", "mariadb"]),
])
def test_tune_argument_errors(args, fragments, env):
    assert_one_line(qcompile([*TUNE, *args], env), *fragments)


def test_unknown_command_and_target(env):
    assert_one_line(qcompile(["nope"], env), "invalid choice: 'nope'", "see qcompile --help")
    assert_one_line(qcompile(["tune", "--target", "nope"], env), "argument --target",
                    "'nope'")
    assert_one_line(qcompile(["db", "nope"], env), "invalid choice: 'nope'")


def test_build_shapes_errors(tmp_path, env):
    build = ["build", "--target", "avx2", "--out", str(tmp_path / "out")]
    assert_one_line(qcompile([*build, "--shapes", "4096x4096,4096by11008"], env),
                    "argument --shapes", "shape must look like KxN", "4096by11008")
    assert_one_line(qcompile([*build, "--shapes", ","], env), "argument --shapes",
                    "shapes must look like KxN,KxN")
    # every spec's rules before anything is built: the second shape's N is named
    assert_one_line(qcompile([*build, "--shapes", "4096x4096,4096x100"], env), "N=100")


def test_missing_sqlite_directory_is_an_error_naming_it(tmp_path, env):
    missing = tmp_path / "no" / "such" / "dir"
    url = f"sqlite:///{missing / 'x.sqlite'}"
    assert_one_line(qcompile(["db", "ls", "--db", url], env),
                    f"directory {missing} does not exist")
    assert_one_line(qcompile([*TUNE, "--shape", "256x256", "--db", url], env),
                    f"directory {missing} does not exist")
    assert not (tmp_path / "no").exists()
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert_one_line(qcompile(["db", "ls", "--db", f"sqlite:///{a_file / 'x.sqlite'}"], env),
                    f"directory {a_file} is not a directory")
    # $QCOMPILE_DB is not the default cache either.
    assert_one_line(qcompile(["db", "ls"], env, QCOMPILE_DB=url), "does not exist")
    # The default cache database creates its own directory.
    assert qcompile(["db", "ls"], env).returncode == 0
    assert (tmp_path / "cache" / "qcompile" / "tuning.sqlite").is_file()


def test_a_driver_that_is_not_installed(env):
    line = assert_one_line(qcompile(["db", "ls", "--db",
                                     "postgresql+psycopg://u:secret@127.0.0.1:1/x"], env),
                           "driver is not installed", "postgresql://")
    assert "secret" not in line


@pytest.mark.parametrize("out, fragments", [
    ("/proc/qcompile-out", ["--out /proc/qcompile-out", "cannot create files in /proc"]),
    ("{file}", ["is a file, not a directory"]),
    ("{file}/below", ["is a file, not a directory"]),
])
def test_build_refuses_an_unwritable_out_before_building(out, fragments, tmp_path, env):
    a_file = tmp_path / "file"
    a_file.write_text("")
    out = out.format(file=a_file)
    # No record exists: refusing the output directory first proves it is checked first.
    assert_one_line(qcompile(["build", "--target", "avx2", "--shape", "256x256", "--out", out],
                             env), *fragments)


def test_quantize_inputs_and_output(tmp_path, env):
    weight = tmp_path / "w.npy"
    np.save(weight, np.zeros((256, 256), np.float32))
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    base = ["quantize", "--family", "mixed", "--shape", "256x256"]
    cases = [
        (["--weight", str(tmp_path / "none.npy"), "--calibration", str(weight), "--out", "o"],
         ["argument --weight", "does not exist"]),
        (["--weight", str(tmp_path), "--calibration", str(weight), "--out", "o"],
         ["argument --weight", "is not a file"]),
        (["--weight", "/etc/hostname", "--calibration", str(weight), "--out", "o"],
         ["--weight /etc/hostname is not a .npy array"]),
        (["--weight", str(tmp_path / "s.npy"), "--calibration", str(weight), "--out", "o"],
         ["must hold a numeric array"]),
        (["--weight", str(weight), "--out", "o"], ["--calibration NPY", "--hessian NPY"]),
        (["--weight", str(weight), "--calibration", str(weight), "--out",
          str(tmp_path / "no" / "w.npz")], ["does not exist"]),
        (["--weight", str(weight), "--calibration", str(weight), "--out", str(tmp_path)],
         ["is a directory"]),
    ]
    if not Path("/etc/hostname").is_file():
        cases = [c for c in cases if "/etc/hostname" not in c[0]]
    for args, fragments in cases:
        assert_one_line(qcompile([*base, *args], env), *fragments)


def test_db_counts_and_export_path(tmp_path, env):
    assert_one_line(qcompile(["db", "prune", "--keep", "0"], env), "argument --keep", "got 0")
    assert_one_line(qcompile(["db", "prune", "--keep", "-1"], env), "got -1")
    assert_one_line(qcompile(["db", "best", "--top", "0"], env), "argument --top")
    assert_one_line(qcompile(["db", "export", "--out", "/proc/x.jsonl"], env),
                    "--out /proc/x.jsonl", "not writable")


def test_targets_hw_garbage(env):
    assert_one_line(qcompile(["targets", "--hw", "garbage"], env), "'garbage'",
                    "key=value")
    assert_one_line(qcompile(["targets", "--hw", "l1d=-3"], env), "l1d='-3'")


@pytest.mark.parametrize("breakage, fragments", [
    ("missing", ["no checkpoint at"]),
    ("a file", ["is a file, not a checkpoint directory"]),
    ("bad regex", ["dynamic pattern 'model\\\\.layers\\\\.(0'", "not a valid regular expression",
                   "position 15"]),
    ("override not a mapping", ["dynamic '.*' must map settings to values; got list"]),
    ("override bits not an int", ["bits must be an integer; got 'x'"]),
    ("config not JSON", ["quantize_config.json is not readable JSON"]),
    ("config binary", ["quantize_config.json is not readable JSON"]),
    ("shard garbage", ["model.safetensors is not a readable safetensors file"]),
    ("shard truncated", ["model.safetensors is not a readable safetensors file"]),
    ("no config", ["has neither quantize_config.json nor config.json"]),
])
def test_from_gptq_errors(breakage, fragments, checkpoint, tmp_path, env):
    path = checkpoint
    config = checkpoint / "quantize_config.json"
    shard = checkpoint / "model.safetensors"
    if breakage == "missing":
        path = tmp_path / "nowhere"
    elif breakage == "a file":
        path = config
    elif breakage == "bad regex":
        _set_dynamic(checkpoint, {r"model\.layers\.(0": {"bits": 8}})
    elif breakage == "override not a mapping":
        _set_dynamic(checkpoint, {".*": [1]})
    elif breakage == "override bits not an int":
        _set_dynamic(checkpoint, {".*": {"bits": "x"}})
    elif breakage == "config not JSON":
        config.write_text("{bits: 4")
    elif breakage == "config binary":
        config.write_bytes(b"\xff\xfe\x00")
    elif breakage == "shard garbage":
        shard.write_text("garbage")
    elif breakage == "shard truncated":
        shard.write_bytes(shard.read_bytes()[:-1000])
    elif breakage == "no config":
        config.unlink()
        (checkpoint / "config.json").unlink()
    assert_one_line(qcompile([*TUNE, "--from-gptq", str(path)], env), *fragments)


# ---- --debug, bugs, Ctrl-C ----------------------------------------------------------------------

def test_debug_shows_the_traceback_then_the_line(env):
    for result in (qcompile(["--debug", *TUNE, "--db", "notaurl"], env),
                   qcompile([*TUNE, "--db", "notaurl", "--debug"], env),
                   qcompile([*TUNE, "--db", "notaurl"], env, QCOMPILE_DEBUG="1")):
        assert result.returncode == 2
        assert "Traceback" in result.stderr and "DatabaseError" in result.stderr
        assert result.stderr.splitlines()[-1].startswith("qcompile: error: --db 'notaurl'")
    assert_one_line(qcompile([*TUNE, "--db", "notaurl"], env, QCOMPILE_DEBUG="0"), "notaurl")


def _main_with_targets_raising(error: str, env, *args):
    script = textwrap.dedent(f"""
        import sys
        import qcompile.cli as cli

        def broken(args):
            raise {error}

        cli.cmd_targets = broken
        sys.exit(cli.main(["targets", *{list(args)!r}]))
    """)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_a_bug_is_one_line_that_says_so(env):
    result = _main_with_targets_raising("TypeError('unsupported operand\\nsecond line')", env)
    line = assert_one_line(result, "internal error", "a bug in qcompile",
                           "TypeError: unsupported operand; second line", "--debug", status=1)
    assert "QCOMPILE_DEBUG=1" in line
    debug = _main_with_targets_raising("TypeError('boom')", env, "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "internal error" in debug.stderr.splitlines()[-1]


def test_ctrl_c_exits_130(env):
    result = _main_with_targets_raising("KeyboardInterrupt()", env)
    assert result.returncode == 130
    assert result.stderr.strip() == "qcompile: interrupted"


# ---- refused before TVM or torch is imported -----------------------------------------------------

@pytest.mark.parametrize("args", [
    [*TUNE, "--shape", "4096x4095"],
    [*TUNE, "--shape", "65536x65536"],
    [*TUNE, "--bits", "5"],
    [*TUNE, "--family", "bcq", "--batch", "4096", "--shape", "32768x4096"],
    [*TUNE, "--db", "notaurl"],
    [*TUNE, "--db", "sqlite:////no/such/dir/x.sqlite"],
    ["build", "--target", "avx2", "--shape", "4096x4095", "--out", "kernels"],
    ["build", "--target", "avx2", "--out", "/proc/x"],
    ["build", "--target", "avx2", "--db", "notaurl", "--out", "kernels"],
])
def test_refused_before_tvm_or_torch_is_imported(args, env):
    script = textwrap.dedent(f"""
        import sys
        from qcompile.cli import main

        code = main({args!r})
        heavy = sorted(m for m in ("tvm", "tvm_ffi", "torch") if m in sys.modules)
        print(code, ",".join(heavy) or "none")
    """)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.stdout.split() == ["2", "none"], (result.stdout, result.stderr)
    assert len(result.stderr.splitlines()) == 1


# ---- qcompile generate: bad checkpoints and prompts, one line each ------------------------------

def _set_json(path: Path, key: str, value) -> None:
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case, args, fragments", [
    ("missing", ["--prompt-tokens", "1"], ["--from-gptq", "no checkpoint directory there"]),
    ("gpt2", ["--prompt-tokens", "1"], ["model_type='gpt2' is not a Llama-family model",
                                        "llama, mistral, qwen2, qwen3"]),
    ("bits5", ["--prompt-tokens", "1"], ["bits=5 is not supported", "(2, 3, 4, 8)"]),
    ("ok", ["--prompt-tokens", "1,64"], ["token 64 is outside the vocabulary", "(ids 0..63)"]),
    ("ok", ["--prompt", "hello"], ["--prompt needs a tokenizer", "--prompt-tokens 1,2,3"]),
    ("ok", ["--prompt-tokens", "1,x"], ["argument --prompt-tokens", "'x'"]),
    ("ok", ["--prompt-tokens", "1", "--prompt", "a"], ["not allowed with argument"]),
    ("ok", ["--prompt-tokens", "1", "--max-new-tokens", "0"], ["--max-new-tokens", "got 0"]),
])
def test_generate_errors(case, args, fragments, checkpoint, env):
    """Refused before any kernel is built: a missing directory, a model that is not
    Llama-family, bits the kernels lack, a prompt that does not fit the model."""
    if case == "gpt2":
        _set_json(checkpoint / "config.json", "model_type", "gpt2")
    if case == "bits5":
        _set_json(checkpoint / "quantize_config.json", "bits", 5)
    directory = checkpoint / "missing" if case == "missing" else checkpoint
    result = qcompile(["generate", "--target", "avx2", "--from-gptq", str(directory), *args],
                      env)
    assert_one_line(result, *fragments)
