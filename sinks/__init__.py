"""Sinks: one ``write(batch)`` each on the batching base (``base.py``), one folder per
technology declaring a ``Plugin`` (``<tech>/plugin.py``); ``gpugap sink NAME`` is built from
this registry. Adding a sink: a folder and a line."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpugap.plugin import Plugin

#: name -> "module:PLUGIN"
REGISTRY: dict[str, str] = {
    "clickhouse": "sinks.clickhouse.plugin:PLUGIN",
}


def plugin(name: str) -> Plugin:
    """The declaration of sink NAME (ConfigError naming the known ones if none)."""
    from gpugap.plugin import lookup

    return lookup(REGISTRY, name, "sink")


__all__ = ["REGISTRY", "plugin"]
