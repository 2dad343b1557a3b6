"""Sinks: one ``write(batch)`` each on the batching base (``base.py``), one folder per
technology declaring a ``Plugin`` (``<tech>/plugin.py``); ``gpugap sink NAME`` is built from
this registry. Adding a sink: a folder and a line."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpugap.groundfloor.plugin import Plugin

#: name -> "module:PLUGIN"
REGISTRY: dict[str, str] = {
    "clickhouse": "gpugap.sinks.clickhouse.plugin:PLUGIN",
    # alert targets (``gpugap notify NAME...``): sinks of alerts.v1 on sinks/alerting.py
    "alertmanager": "gpugap.sinks.alertmanager.plugin:PLUGIN",
    "slack": "gpugap.sinks.slack.plugin:PLUGIN",
    "webhook": "gpugap.sinks.webhook.plugin:PLUGIN",
    "email": "gpugap.sinks.email.plugin:PLUGIN",
    "console": "gpugap.sinks.console.plugin:PLUGIN",
}


def plugin(name: str) -> Plugin:
    """The declaration of sink NAME (ConfigError naming the known ones if none)."""
    from gpugap.groundfloor.plugin import lookup

    return lookup(REGISTRY, name, "sink")


__all__ = ["REGISTRY", "plugin"]
