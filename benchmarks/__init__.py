"""Benchmarks run from a checkout (``python -m benchmarks.<name>``), not shipped with gpugap."""
