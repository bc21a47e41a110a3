"""Benchmarks of projector (see docs/benchmarks.md)."""
