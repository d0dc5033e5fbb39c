"""Every variant's design space (golden: sketches and seeded decisions) and heuristic point
(scheduled TensorIR and generated code) for a fixed set of specs, as committed.

A change that alters one changes what stored records mean or what kernels do. If it is
deliberate, regenerate with ``QCOMPILE_UPDATE_GOLDEN=1`` (and bump the family's
compute_version when old records no longer replay); ``tools/replay_check.py`` shows the texts.
"""

import json
import os
from pathlib import Path

import pytest

from qcompile.testing import replay

HERE = Path(__file__).parent
BASELINE = HERE / "replay_baseline.json"
GOLDEN = HERE / "golden"
CASES = replay.cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_design_space_is_golden(case):
    text = replay.design_space_text(case)
    path = GOLDEN / f"{case.name}.txt"
    if os.environ.get("QCOMPILE_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_heuristic_points_generate_the_committed_code():
    baseline = json.loads(BASELINE.read_text())
    current = replay.snapshot()
    if os.environ.get("QCOMPILE_UPDATE_GOLDEN"):
        BASELINE.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        baseline = current
    changed = [f"{name}: {what}" for name, digests in current.items()
               for what, digest in digests.items() if baseline.get(name, {}).get(what) != digest]
    assert changed == [], "generated code changed: " + ", ".join(changed)
