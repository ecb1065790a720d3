"""Benchmarks: the scheduler micro-benchmark (more to come with the engine)."""
