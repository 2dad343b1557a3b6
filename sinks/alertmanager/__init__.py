"""Prometheus Alertmanager as an alert target: ``gpugap notify alertmanager``."""
