"""slurmctld's own OpenMetrics (Slurm 25.11+; GPU gauges 26.05+) -> SchedulerGpuCount records.

Read from src/plugins/metrics/openmetrics/openmetrics.c and src/slurmctld/statistics.c of Slurm
26.05.3: each gauge counts the ``gres/gpu`` TRES of the jobs that are running or suspended (so
they read 0 where ``AccountingStorageTRES`` lacks ``gres/gpu``, which needs slurmdbd), except
``slurm_node_gpus_alloc``, the node's GRES count. Pages: ``/metrics/jobs``
(``slurm_jobs_gpus_alloc``), ``/metrics/partitions`` (``slurm_partition_jobs_gpus_alloc``,
``slurm_partition_gpus``), ``/metrics/jobs-users-accts`` (``slurm_account_jobs_gpus_alloc``,
``slurm_user_jobs_gpus_alloc``), ``/metrics/nodes`` (``slurm_node_gpus_alloc``,
``slurm_node_gpus``). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from gpugap.producers.slurm.parse import ParseError
from gpugap.schemas.models import SchedulerGpuCount
from gpugap.schemas.types import GpuCountScope

PAGES = ("jobs", "partitions", "jobs-users-accts", "nodes")
#: gauge -> (scope, the label naming it, whether it is the total rather than the allocated)
GAUGES: dict[str, tuple[GpuCountScope, str | None, bool]] = {
    "slurm_jobs_gpus_alloc": (GpuCountScope.CLUSTER, None, False),
    "slurm_partition_jobs_gpus_alloc": (GpuCountScope.PARTITION, "partition", False),
    "slurm_partition_gpus": (GpuCountScope.PARTITION, "partition", True),
    "slurm_account_jobs_gpus_alloc": (GpuCountScope.ACCOUNT, "account", False),
    "slurm_user_jobs_gpus_alloc": (GpuCountScope.USER, "username", False),
    "slurm_node_gpus_alloc": (GpuCountScope.NODE, "node", False),
    "slurm_node_gpus": (GpuCountScope.NODE, "node", True),
}


def gpu_counts(
    pages: Iterable[str], *, cluster: str, time: datetime, interval_s: float
) -> list[SchedulerGpuCount]:
    """The GPU gauges of slurmctld's pages as records, one per scope and name. Raises
    ParseError when a page is not the text format or a gauge lacks its label."""
    found: dict[tuple[GpuCountScope, str | None], dict[str, float]] = {}
    for text in pages:
        wanted = "".join(
            line for line in text.splitlines(keepends=True) if line.startswith(tuple(GAUGES))
        )
        try:
            samples = [s for f in text_string_to_metric_families(wanted) for s in f.samples]
        except ValueError as exc:
            raise ParseError(f"slurmctld metrics: not the text format ({exc})") from None
        for sample in samples:
            if sample.name not in GAUGES:
                continue
            scope, label, total = GAUGES[sample.name]
            name = sample.labels.get(label) if label else None
            if label and not name:
                raise ParseError(f"slurmctld metrics: {sample.name} without its {label} label")
            value = float(sample.value)
            if not value >= 0:
                raise ParseError(f"slurmctld metrics: {sample.name}{{{name}}} = {value}")
            found.setdefault((scope, name), {})["total" if total else "alloc"] = value
    out = []
    for (scope, name), values in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if "alloc" not in values:
            continue  # a total alone (a partition without the allocation gauge): nothing to check
        out.append(
            SchedulerGpuCount(
                cluster=cluster,
                time=time,
                interval_s=interval_s,
                scheduler="slurm",
                source="slurmctld_metrics",
                scope=scope,
                name=name,
                gpus_allocated=values["alloc"],
                gpus_total=values.get("total"),
            )
        )
    return out
