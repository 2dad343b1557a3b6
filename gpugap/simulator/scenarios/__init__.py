"""Shipped scenarios (package data): ``gpugap simulate --scenario small|demo|scale``."""
