"""Benchmarks: `python -m benchmarks.run` (see the README). Not collected by pytest."""
