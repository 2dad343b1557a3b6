"""``gpugap backfill``: history (sacct; dcgm-exporter and kube-state-metrics in Prometheus)
turned into the records the live producers emit, with their event times (docs/backfill.md)."""
