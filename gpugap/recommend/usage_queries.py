"""The SQL of the usage-shaped recommenders: services' demand by clock hour (services.py,
placement.py), whole-GPU workloads' peaks (fit.py), and the boundary transfers beside a
placement. Read-only, bounded by the window, values bound as server-side parameters.

Measured time only: an hour (or a stand-in GPU) without telemetry says nothing of use.
At 100M GPU-minute rows: the hourly rollup only (the service class's hours; every whole
GPU's hourly peaks of activity and memory, migration 010).
"""

# ruff: noqa: S608  (the SQL is this module's constants; values are bound as parameters)
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from gpugap.recommend.base import HistoryWindow
from gpugap.recommend.fit import MAX_FIT_ACTIVITY, PEAK_QUANTILE, GpuUse
from gpugap.recommend.queries import class_of, params_of, target_of
from gpugap.recommend.services import ServiceDemand, ServiceHour
from gpugap.schemas.models import RecommendationTarget
from gpugap.schemas.types import Vendor, WorkloadClass, vendor_of
from gpugap.warehouse.client import run_query

_W = "{since:DateTime64(3, 'UTC')}"
_U = "{until:DateTime64(3, 'UTC')}"
#: the allocations' metadata (owner, team, name, ...) for a query's ``per_alloc``; shared with
#: capacity_queries
META_SQL = """
    SELECT cluster, allocation_id, owner, team, name, partition, owner_kind, owner_name
    FROM v_allocations WHERE allocation_id IN (SELECT allocation_id FROM per_alloc)
"""
META_COLUMNS = ("owner", "team", "name", "partition", "owner_kind", "owner_name")

SERVICE_HOURS = f"""
WITH per_alloc AS (
    SELECT cluster, allocation_id, hour, any(scheduler) AS sched,
        uniqExactIf(gpu_uuid, allocated_s > unmeasured_s) AS gpus,
        sum(allocated_s - unmeasured_s) / 3600 AS alloc_h,
        sum(consumed_gpu_s) / 3600 AS consumed_h
    FROM gpu_hours FINAL
    WHERE hour >= toStartOfHour({_W}) AND hour < {_U} AND allocation_id != ''
        AND workload_class = 'service'
    GROUP BY cluster, allocation_id, hour
    HAVING alloc_h > 0
),
meta AS ({META_SQL})
SELECT a.cluster, a.allocation_id, a.sched, a.hour, a.gpus, a.alloc_h, a.consumed_h,
    m.owner, m.team, m.name, m.partition, m.owner_kind, m.owner_name
FROM per_alloc AS a
LEFT JOIN meta AS m ON m.cluster = a.cluster AND m.allocation_id = a.allocation_id
ORDER BY a.cluster, a.allocation_id, a.hour
"""

FIT_USE = f"""
WITH per_alloc AS (
    SELECT cluster, allocation_id, any(scheduler) AS sched, any(workload_class) AS cls,
        uniqExactIf(gpu_uuid, allocated_s > unmeasured_s) AS gpus,
        sum(allocated_s - unmeasured_s) / 3600 AS gpu_h,
        toUInt64(sum(allocated_s - unmeasured_s) / 60) AS measured,
        sum(memory_minutes) AS with_memory,
        quantileExactIf({{q:Float64}})(activity_max, allocated_s > unmeasured_s) AS peak,
        max(memory_max_mib) AS memory, groupUniqArray(4)(substring(gpu_uuid, 1, 4)) AS prefixes
    FROM gpu_hours FINAL
    WHERE hour >= toStartOfHour({_W}) AND hour < {_U} AND allocation_id != ''
        AND NOT startsWith(gpu_uuid, 'MIG-') AND position(gpu_uuid, '/') = 0
    GROUP BY cluster, allocation_id
    HAVING peak <= {{max_fit:Float64}} AND memory > 0
),
meta AS ({META_SQL}),
models AS (
    SELECT cluster, argMax(gpu_model, priority) AS model FROM v_rate_card GROUP BY cluster
)
SELECT a.cluster, a.allocation_id, a.sched, a.cls, a.gpus, a.gpu_h, a.measured,
    a.with_memory, a.peak, a.memory, c.model,
    m.owner, m.team, m.name, m.partition, m.owner_kind, m.owner_name, a.prefixes
FROM per_alloc AS a
LEFT JOIN meta AS m ON m.cluster = a.cluster AND m.allocation_id = a.allocation_id
LEFT JOIN models AS c ON c.cluster = a.cluster
ORDER BY a.cluster, a.allocation_id
"""


def _meta(r: tuple[Any, ...], cluster: str, allocation_id: str, scheduler: str) -> Any:
    m = dict(zip(META_COLUMNS, (v or "" for v in r), strict=True))
    if not m["name"]:  # no allocation event: the allocation is its own workload
        m["name"] = allocation_id
    return target_of({"cluster": cluster, "scheduler": scheduler, **m})


def service_demand(client: Any, w: HistoryWindow) -> list[ServiceDemand]:
    """Every service workload's clock hours (its allocations summed per hour)."""
    hours: dict[RecommendationTarget, dict[Any, list[float]]] = defaultdict(dict)
    per_replica: dict[RecommendationTarget, int] = defaultdict(int)
    allocs: dict[RecommendationTarget, set[str]] = defaultdict(set)
    targets: dict[tuple[str, str], RecommendationTarget] = {}  # an allocation's, once
    for r in run_query(client, SERVICE_HOURS, params_of(w)).result_rows:
        cluster, alloc, sched, hour, gpus = r[0], r[1], r[2], r[3], int(r[4])
        t = targets.get((cluster, alloc))
        if t is None:
            t = targets[cluster, alloc] = _meta(r[7:13], cluster, alloc, sched)
        hour = hour.replace(tzinfo=UTC) if hour.tzinfo is None else hour
        slot = hours[t].setdefault(hour, [0.0, 0.0])
        slot[0] += float(r[5])
        slot[1] += float(r[6])
        per_replica[t] = 1 if sched == "slurm" else max(per_replica[t], gpus)
        allocs[t].add(alloc)
    return [
        ServiceDemand(
            target=t, workload_class=WorkloadClass.SERVICE, gpus_per_replica=per_replica[t],
            allocations=len(allocs[t]),
            hours=tuple(ServiceHour(h, a, c) for h, (a, c) in sorted(hs.items())),
        )
        for t, hs in hours.items()
    ]  # fmt: skip


@dataclass
class _Use:
    cls: str = ""
    gpus: int = 0
    allocations: int = 0
    gpu_hours: float = 0.0
    measured: int = 0
    with_memory: int = 0
    memory: float = 0.0
    model: str | None = None
    peaks: tuple[float, ...] = ()
    vendors: set[Vendor] = field(default_factory=set)


def gpu_uses(client: Any, w: HistoryWindow) -> list[GpuUse]:
    """Whole-GPU workloads whose hourly peaks could fit a MIG profile, with their minutes'
    peaks (per allocation), memory and vendor (None: their GPUs name several)."""
    params = params_of(w, q=PEAK_QUANTILE, max_fit=MAX_FIT_ACTIVITY)
    uses: dict[RecommendationTarget, _Use] = defaultdict(_Use)
    for r in run_query(client, FIT_USE, params).result_rows:
        u = uses[_meta(r[11:17], r[0], r[1], r[2])]
        u.cls = u.cls or r[3]
        u.gpus = max(u.gpus, int(r[4]))
        u.allocations += 1
        u.gpu_hours += float(r[5])
        u.measured += int(r[6])
        u.with_memory += int(r[7])
        u.peaks += (float(r[8]),)
        u.memory = max(u.memory, float(r[9]))
        u.model = u.model or (r[10] or None)
        u.vendors |= {vendor_of(p) for p in r[17]}
    return [
        GpuUse(
            target=t, workload_class=class_of(u.cls, WorkloadClass.BATCH), gpus=u.gpus,
            allocations=u.allocations, gpu_hours=u.gpu_hours, measured_minutes=u.measured,
            memory_minutes=u.with_memory, allocation_peaks=u.peaks, peak_memory_mib=u.memory,
            gpu_model=u.model,
            vendor=next(iter(u.vendors)) if len(u.vendors) == 1 else None,
        )
        for t, u in uses.items()
    ]  # fmt: skip
