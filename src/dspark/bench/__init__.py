"""Benchmarks: ``dspark bench`` and the scheduler, engine and server benchmarks."""
