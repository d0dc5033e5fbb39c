"""The benchmark jobs behind ``tools/bench.py``: one module per job."""
