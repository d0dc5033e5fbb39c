"""The README's Python snippets and docs/examples/first_kernel.py run as written, from a
directory laid out as after `make demo` (the default kernel built into kernels/)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from qcompile.build import build_untuned
from qcompile.kernels import UniformSpec

ROOT = Path(__file__).resolve().parents[2]
#: The programs among the README's Python blocks: those that start with their imports (the
#: others are excerpts, such as the variant registry's entry).
SNIPPETS = [block for block in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(),
                                          re.DOTALL) if block.startswith(("import ", "from "))]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """A working directory with kernels/ as `make demo` leaves it (untuned here: the snippets
    check numbers, not speed) and the repository's test checkpoints at tests/data."""
    where = tmp_path_factory.mktemp("demo")
    build_untuned(UniformSpec(k=4096, n=4096), targets.get("avx2"), where / "kernels")
    (where / "tests").mkdir()
    (where / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    return where


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs_as_written(index, demo_dir):
    result = _run(SNIPPETS[index], demo_dir)
    assert result.returncode == 0, result.stderr


def test_first_kernel_example_runs(demo_dir):
    result = _run((ROOT / "docs" / "examples" / "first_kernel.py").read_text(), demo_dir)
    assert result.returncode == 0, result.stderr
    assert "max relative error" in result.stdout
