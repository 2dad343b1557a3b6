"""Producers: one small file per source, looked up by name (``gpugap produce NAME``)."""

from __future__ import annotations

import importlib

from schemas.errors import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __getattr__)
if TYPE_CHECKING:
    from typing import Any

    from producers.base import Producer, run_producer


def __getattr__(name: str) -> Any:
    # Producer and run_producer import the publisher (aiokafka, pydantic): only on first use,
    # so that light modules of this package (the Slurm hook, run per job) start fast.
    if name in ("Producer", "run_producer"):
        from producers import base

        return getattr(base, name)
    raise AttributeError(f"module 'producers' has no attribute {name!r}")


#: name -> "module:Class"; imported only when asked for, so optional dependencies stay optional.
REGISTRY: dict[str, str] = {
    "kubernetes": "producers.kubernetes.producer:KubernetesProducer",
    "nvml": "producers.nvml.producer:NvmlProducer",
    "dcgm": "producers.dcgm.producer:DcgmProducer",
    "slurm": "producers.slurm.producer:SlurmProducer",
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
