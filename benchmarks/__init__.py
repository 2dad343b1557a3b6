"""Benchmarks: ``python -m benchmarks SUBJECT`` from a source checkout (``make bench``).
Never installed with gpugap, and nothing in the installed package imports them."""
