"""A generic signed webhook as an alert target: ``gpugap notify webhook``."""
