"""tools/results holds only what something refers to: every file there is cited in the README,
docs/ or tools/ by name, by a pattern (``tune_8192x28672.*``, ``sweep_{1..4}.json``,
``mixed_cpu_int8{,_rounds11}.{json,log}``), or is another output of a cited run (the same
stem: the JSON beside a cited log)."""

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "results"


def _expand(token: str) -> list[str]:
    """Shell brace expansion: ``a{1..3}`` and ``a{,_b}.{json,log}``."""
    match = re.search(r"\{([^{}]*)\}", token)
    if not match:
        return [token]
    body = match.group(1)
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    options = ([str(i) for i in range(int(numbers.group(1)), int(numbers.group(2)) + 1)]
               if numbers else body.split(","))
    return [e for o in options
            for e in _expand(token[:match.start()] + o + token[match.end():])]


def _cited() -> set[str]:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tools").rglob("*.md"),
             *(ROOT / "tools").rglob("*.py")]
    text = "\n".join(page.read_text() for page in pages if RESULTS not in page.parents)
    tokens = re.findall(r"[\w./{},*-]*[\w}*]\.[\w{},*]+", text)
    return {name.rsplit("/", 1)[-1] for token in tokens for name in _expand(token)}


def test_every_result_file_is_referenced():
    cited = _cited()
    stems = {name.split(".", 1)[0] for name in cited if "*" not in name.split(".", 1)[0]}
    orphans = [path.relative_to(RESULTS).as_posix()
               for path in sorted(p for p in RESULTS.rglob("*") if p.is_file())
               if not any(fnmatch.fnmatch(path.name, name) for name in cited)
               and path.name.split(".", 1)[0] not in stems]
    assert not orphans, f"referenced nowhere: {orphans}"
