"""Sinks: one ``write(batch)`` each on the batching base, looked up by name."""

from __future__ import annotations

import importlib

from schemas.errors import ConfigError
from sinks.base import BatchingSink, Rejected

#: name -> "module:Class"
REGISTRY: dict[str, str] = {"clickhouse": "sinks.clickhouse.sink:ClickHouseSink"}


def by_name(name: str) -> type[BatchingSink]:
    try:
        module, cls = REGISTRY[name].split(":")
    except KeyError:
        raise ConfigError(f"unknown sink {name!r} (known: {', '.join(sorted(REGISTRY))})") from None
    sink: type[BatchingSink] = getattr(importlib.import_module(module), cls)
    return sink


__all__ = ["REGISTRY", "BatchingSink", "Rejected", "by_name"]
