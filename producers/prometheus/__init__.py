"""Prometheus's HTTP API, read-only: the one client the history readers share (``gpugap
backfill``'s dcgm-exporter and kube-state-metrics series, ``transfers-prometheus``'s
node_exporter counters)."""
