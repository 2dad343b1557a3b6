"""Boundary transfers (``transfers.v1``): bytes moved between environments, from cloud billing
egress lines (``gpugap produce transfers-csv``) and from node_exporter's interface counters in
Prometheus (``gpugap produce transfers-prometheus``). See docs/cost.md."""
