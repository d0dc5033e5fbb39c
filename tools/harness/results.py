"""Result files: one JSON per run, with what it takes to read and redo it.

Every result carries the date (UTC), the device (CPU model or GPU name), the exact command,
the versions (qcompile, torch, the git commit of the tree), the job's parameters, and its rows
(medians and the ratios to the peers). ``tools/results/`` keeps the latest curated result per
(benchmark, device); tools/README.md lists them with the command that made each.
"""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def device_line(kind: str) -> str:
    """The device a result was measured on: the CPU model (with cores and caches) or the GPU."""
    if kind == "cuda":
        import torch

        props = torch.cuda.get_device_properties(0)
        return (f"{torch.cuda.get_device_name(0)}, {props.multi_processor_count} SMs, "
                f"L2 {props.L2_cache_size >> 20} MiB")
    import os

    from targets.host import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} logical CPUs"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    commit = out.stdout.strip() or None
    return f"{commit}+dirty" if commit and dirty.stdout.strip() else commit


def header(job: str, device_kind: str, params: dict) -> dict:
    """The first keys of a result: job, date, device, command, versions, parameters."""
    import torch

    import qcompile

    return {
        "job": job,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device_line(device_kind),
        "command": "python " + shlex.join(sys.argv),
        "versions": {"qcompile": qcompile.__version__, "torch": torch.__version__,
                     "cuda": torch.version.cuda if device_kind == "cuda" else None,
                     "git": git_commit()},
        "params": params,
    }


def write(path: str | Path, result: dict) -> Path:
    """Write ``result`` as indented JSON (directories made as needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path
