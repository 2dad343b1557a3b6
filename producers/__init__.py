"""Producers: one small file per source, looked up by name (``gpugap produce NAME``)."""

from __future__ import annotations

import importlib

from gpugap.errors import ConfigError

from .base import Producer, run_producer

#: name -> "module:Class"; imported only when asked for, so optional dependencies stay optional.
REGISTRY: dict[str, str] = {
    "kubernetes": "producers.kubernetes:KubernetesProducer",
}


def by_name(name: str) -> type[Producer]:
    try:
        target = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)) or "none in this build"
        raise ConfigError(f"unknown producer {name!r} (known: {known})") from None
    module, cls = target.split(":")
    producer: type[Producer] = getattr(importlib.import_module(module), cls)
    return producer


__all__ = ["REGISTRY", "Producer", "by_name", "run_producer"]
