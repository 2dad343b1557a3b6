"""The AMD Device Metrics Exporter scraper: ``gpugap produce amd-exporter``."""
