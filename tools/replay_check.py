"""Check that a change leaves every variant's generated code as it was.

    python tools/replay_check.py --write tests/codegen/replay_baseline.json   # before
    python tools/replay_check.py --check tests/codegen/replay_baseline.json   # after
    python tools/replay_check.py --show uniform_cuda_int8_mma > before.txt    # the texts

For a fixed set of specs reaching every kernel variant (qcompile/testing/replay.py), it records
the sha256 of the design space (sketches and seeded decisions), of the heuristic point's scheduled
TensorIR and of its generated code, and compares them with a file written before. Exit status 1
when anything differs, naming the case and what.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="JSON", help="write the snapshot here")
    action.add_argument("--check", metavar="JSON", help="compare with this snapshot")
    action.add_argument("--show", metavar="CASE", help="print one case's texts")
    parser.add_argument("--only", metavar="SUBSTRING", help="cases whose name contains this")
    args = parser.parse_args(argv)

    from qcompile.testing import replay

    selected = [c for c in replay.cases() if not args.only or args.only in c.name]
    if args.show:
        (case,) = [c for c in replay.cases() if c.name == args.show]
        tir, code = replay.heuristic_texts(case)
        print(replay.design_space_text(case), tir, code, sep="\n# ----\n")
        return 0
    current = replay.snapshot(selected)
    if args.write:
        Path(args.write).write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(current)} cases to {args.write}")
        return 0
    baseline = json.loads(Path(args.check).read_text())
    differ = [f"{name}: {what} changed" for name, digests in current.items()
              for what, digest in digests.items()
              if name in baseline and baseline[name][what] != digest]
    missing = sorted(set(baseline) - set(current)) if not args.only else []
    for line in differ + [f"{name}: no longer a case" for name in missing]:
        print(line)
    print(f"{len(current)} cases: {len(differ)} differences, {len(missing)} missing")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
