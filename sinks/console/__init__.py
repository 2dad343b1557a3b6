"""The console as an alert target: ``gpugap notify console`` (the demo's ``--notify console``)."""
