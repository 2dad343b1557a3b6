"""Sinks: one write(batch) each on a batching base (ClickHouse, ...)."""
