"""Prometheus, read-only: the one client of its HTTP API the history readers share
(``http.py``: ``gpugap backfill``'s dcgm-exporter and kube-state-metrics series,
``transfers-prometheus``'s node_exporter counters), and the scrape loop, settings and text
parsing the exporter scrapers share (``scrape.py``, ``settings.py``, ``text.py``: dcgm,
amd-exporter)."""
