"""Benchmarks, studies and checks of qcompile (tools/README.md). Not part of the package."""
