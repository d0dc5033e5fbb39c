"""The README stays a newcomer's page: short, its links resolve, and its test command is the
one CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_300_lines():
    assert len(README.splitlines()) <= 300, "the rest belongs in docs/"


def test_every_relative_link_resolves():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}"


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make test" in README and re.search(r"^make test$", ci, re.MULTILINE)
    assert "python -m pytest" in makefile and "lint-imports" in makefile


def _floors_block() -> list[str]:
    start = README.index("```\ntesting ")
    return README[start + 4:README.index("```", start + 4)].splitlines()


def test_readme_floors_are_the_import_contracts():
    """The README's floors, top to bottom, name the modules of .importlinter's layers."""
    config = (ROOT / ".importlinter").read_text()
    layers = config.split("layers =\n", 1)[1].split("ignore_imports", 1)[0].split("\n[", 1)[0]
    contract = [line.strip() for line in layers.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    drawn = [line.split("   ")[0].strip() for line in _floors_block() if not line.startswith(" ")]
    short = [" ".join(word.removeprefix("qcompile.") for word in layer.split())
             for layer in contract]
    assert drawn == short


def test_readme_variant_example_is_a_registry_entry():
    start = README.index("# schedules/variants.py:")
    entry = README[README.index("\n", start) + 1:README.index("```", start)].strip()
    registry = (ROOT / "schedules" / "variants.py").read_text()
    assert " ".join(entry.split()) in " ".join(registry.split())
