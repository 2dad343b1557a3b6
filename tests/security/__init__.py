"""Attacks on the embedded ClickHouse endpoint, each one a test (see test_endpoint_attacks)."""
