"""Producers: one folder per technology, each declaring a ``Plugin`` (``<tech>/plugin.py``);
``gpugap produce NAME`` is built from this registry. Adding a producer: a folder and a line.

Only the declarations are imported to build the CLI: a producer's code and its libraries are
imported when it runs (a node agent has neither Faust nor the Kubernetes client installed).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __getattr__)
if TYPE_CHECKING:
    from typing import Any

    from gpugap.groundfloor.plugin import Plugin

    from .base import Producer, run_producer

#: name -> "module:PLUGIN"
REGISTRY: dict[str, str] = {
    "nvml": "gpugap.producers.nvml.plugin:PLUGIN",
    "dcgm": "gpugap.producers.dcgm.plugin:PLUGIN",
    "amdsmi": "gpugap.producers.amdsmi.plugin:PLUGIN",
    "amd-exporter": "gpugap.producers.amd_exporter.plugin:PLUGIN",
    "xpum": "gpugap.producers.xpum.plugin:PLUGIN",
    "kubernetes": "gpugap.producers.kubernetes.plugin:PLUGIN",
    "kubernetes-capacity": "gpugap.producers.kubernetes.plugin_capacity:PLUGIN",
    "kubernetes-queues": "gpugap.producers.kubernetes.plugin_queues:PLUGIN",
    "slurm": "gpugap.producers.slurm.plugin:PLUGIN",
    "slurm-capacity": "gpugap.producers.slurm.plugin_capacity:PLUGIN",
    "slurm-jobcomp": "gpugap.producers.slurm.plugin_jobcomp:PLUGIN",
    "slurm-metrics": "gpugap.producers.slurm.plugin_metrics:PLUGIN",
    "slurm-quotas": "gpugap.producers.slurm.plugin_quotas:PLUGIN",
    "transfers-csv": "gpugap.producers.transfers.plugin:PLUGIN",
    "transfers-prometheus": "gpugap.producers.transfers.plugin_prometheus:PLUGIN",
}


def __getattr__(name: str) -> Any:
    # Producer and run_producer import the publisher (aiokafka, pydantic): only on first use,
    # so that light modules of this package (the Slurm hook, run per job) start fast.
    if name in ("Producer", "run_producer"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module 'gpugap.producers' has no attribute {name!r}")


def plugin(name: str) -> Plugin:
    """The declaration of producer NAME (ConfigError naming the known ones if none)."""
    from gpugap.groundfloor.plugin import lookup

    return lookup(REGISTRY, name, "producer")


__all__ = ["REGISTRY", "Producer", "plugin", "run_producer"]
