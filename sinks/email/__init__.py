"""Email (SMTP) as an alert target: ``gpugap notify email``."""
