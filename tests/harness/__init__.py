"""The test harness: launchers of the real services the tests start (Kafka, Slurm,
kube-apiserver, Prometheus, Alertmanager, the embedded ClickHouse endpoint, Chromium), the
test doubles where no machine here has the real thing (NVML, with their sources named), and
the in-memory publisher. Tests and benchmarks import it; it imports neither."""
