"""Device telemetry helpers shared by the NVML agent and the dcgm-exporter scraper."""
