"""The model benchmark's verdicts (tools/jobs/model_gpu.py ``summary``): a target is judged
against each peer's best mode, and not judged when a mode asked of that peer did not run (its
best would be a lesser mode's, and the target would pass on a missing measurement)."""

from tools.jobs.model_gpu import summary


def decode_row(engine: str, mode: str, batch: int, tokens_per_s: float) -> dict:
    return {"engine": engine, "mode": mode, "batch": batch, "tokens_per_s": tokens_per_s}


def run_with(compile_entries: dict) -> dict:
    dense = "transformers_float16"
    return {"bits": 4, "prefill": [], "compile": compile_entries, "decode": [
        decode_row("qcompile", "graph", 1, 250.0), decode_row("qcompile", "compiled", 1, 470.0),
        decode_row(dense, "graph", 1, 150.0), decode_row(dense, "compiled", 1, 210.0),
        decode_row("qcompile", "compiled", 16, 4100.0), decode_row(dense, "graph", 16, 2000.0),
    ]}


def test_targets_use_each_engines_best_mode():
    targets = summary(run_with({"transformers_float16 B=1": {"seconds": 30.0},
                                "transformers_float16 B=16": {"seconds": 50.0}})
                      )["targets (issue 25)"]
    assert targets["B=1 >= 2.5x transformers_float16"] is False  # 470 / 210 = 2.24
    assert targets["B=16 >= 2x transformers_float16"] is True    # 4100 / 2000


def test_a_peer_mode_that_did_not_run_leaves_its_target_unjudged():
    out = summary(run_with({"transformers_float16 B=1": {"seconds": 30.0},
                            "transformers_float16 B=16": {"skipped": "over --budget-s"}}))
    targets = out["targets (issue 25)"]
    assert targets["B=16 >= 2x transformers_float16"] == (
        "not judged: transformers_float16 B=16 compiled did not run")
    assert targets["B=1 >= 2.5x transformers_float16"] is False
    assert "B=1 >= humming" not in targets  # humming did not run at all: no verdict
