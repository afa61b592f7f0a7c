"""Benchmarks: each module runs as a script (`python benchmarks/NAME.py`) and imports as `benchmarks.NAME` (tests)."""
