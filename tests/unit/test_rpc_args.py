"""``--rpc-tracker``, ``--rpc-key`` and ``qcompile rpc-server``'s arguments are checked before
TVM loads: a bad HOST:PORT, or one of the two tune flags without the other, is one line on
stderr and exit status 2 (issue 28)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qcompile.cli_args import port_number, tracker_address

REPO = Path(__file__).resolve().parents[2]
#: Runs the CLI, then says whether TVM was imported (printed at exit, after argparse's exit).
PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print('TVM-LOADED' if 'tvm' in sys.modules else 'NO-TVM'))\n"
         "from qcompile.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


def qcompile(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH",
                                                                                   "")])}
    return subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:9190", "127.0.0.1", 9190),
    ("tracker.lan:1", "tracker.lan", 1),
    ("[::1]:65535", "::1", 65535),
])
def test_tracker_address_accepts(text, host, port):
    assert tracker_address(text) == (host, port)


@pytest.mark.parametrize("text, fragment", [
    ("127.0.0.1", "expected HOST:PORT"),
    (":9190", "expected HOST:PORT"),
    ("host:", "expected HOST:PORT"),
    ("host:abc", "must be an integer in 1..65535; got 'abc'"),
    ("host:0", "must be in 1..65535; got 0"),
    ("host:65536", "must be in 1..65535; got 65536"),
])
def test_tracker_address_refuses(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        tracker_address(text)
    assert fragment in str(caught.value)


def test_port_number():
    assert port_number("9090") == 9090
    with pytest.raises(argparse.ArgumentTypeError):
        port_number("70000")


@pytest.mark.parametrize("args, fragment", [
    (["tune", "--target", "avx2", "--shape", "256x256", "--rpc-tracker", "localhost:99999",
      "--rpc-key", "k"], "argument --rpc-tracker: the port of HOST:PORT must be in 1..65535"),
    (["tune", "--target", "avx2", "--rpc-tracker", "localhost", "--rpc-key", "k"],
     "expected HOST:PORT"),
    (["tune", "--target", "avx2", "--rpc-tracker", "127.0.0.1:9190"],
     "--rpc-tracker HOST:PORT and --rpc-key KEY go together"),
    (["tune", "--target", "avx2", "--rpc-key", "k"],
     "--rpc-tracker HOST:PORT and --rpc-key KEY go together"),
    (["rpc-server", "--tracker", "127.0.0.1:x", "--key", "k"], "argument --tracker"),
    (["rpc-server", "--tracker", "127.0.0.1:9190", "--key", "k", "--port", "0"],
     "argument --port"),
])
def test_bad_rpc_arguments_are_one_line_before_tvm(args, fragment):
    result = qcompile(*args)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip().endswith("NO-TVM"), result.stdout
