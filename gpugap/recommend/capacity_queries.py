"""The SQL of the estate-shaped recommenders: the GPU models the estate has and the families
on a bigger one than they use (model.py), the allocations charged stranded GPUs
(stranding.py), the runs spread over more nodes than they need (packing.py). Read-only,
bounded by the window, values bound as server-side parameters.

node_capacity (migration 017) names each node's pool, GPU model and one GPU's memory; the
rate card's rate for a node is its first rule whose pattern matches the node (as the cost
views read it, migration 008).
"""

# ruff: noqa: S608  (the SQL is this module's constants; values are bound as parameters)
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpugap.recommend.base import HistoryWindow
from gpugap.recommend.model import PEAK_QUANTILE, GpuModel, ModelUse
from gpugap.recommend.packing import SpreadRun
from gpugap.recommend.queries import class_of, params_of, target_of
from gpugap.recommend.stranding import Stranding
from gpugap.recommend.usage_queries import META_COLUMNS, META_SQL
from gpugap.schemas.models import RecommendationTarget
from gpugap.schemas.types import Vendor, WorkloadClass, vendor_of
from gpugap.warehouse.client import run_query

_W = "{since:DateTime64(3, 'UTC')}"
_U = "{until:DateTime64(3, 'UTC')}"

# every GPU node polled before the window's end: its latest pool and model, one GPU's largest
# memory reported, whether it was polled in the window, the rate card's rate for it, and the
# identity prefix of its devices in the window (the vendor: schemas.types.vendor_of; '' where
# it sent no telemetry then)
NODES = f"""
nodes AS (
    SELECT n.cluster AS cluster, n.node AS node, n.pool AS pool, n.model AS model,
        n.memory AS memory, n.polled_in AS polled_in, v.prefix AS prefix,
        arrayFirstIndex(x -> match(n.node, x.2), r.rules) AS idx,
        if(idx > 0, toNullable(tupleElement(r.rules[idx], 3)), NULL) AS rate,
        if(idx > 0, tupleElement(r.rules[idx], 4), '') AS currency
    FROM (
        SELECT cluster, node, argMax(pool, time) AS pool, argMax(gpu_model, time) AS model,
            max(gpu_memory_mib) AS memory, max(time >= {_W}) AS polled_in
        FROM node_capacity FINAL
        WHERE time < {_U} AND gpu_model != '' AND gpus > 0
        GROUP BY cluster, node
    ) AS n
    LEFT JOIN (
        SELECT cluster, arraySort(x -> x.1, groupArray((priority, node_regex,
            gpu_hour_rate, toString(currency)))) AS rules
        FROM v_rate_card GROUP BY cluster
    ) AS r ON r.cluster = n.cluster
    LEFT JOIN (
        SELECT cluster, node, max(substring(gpu_uuid, 1, 4)) AS prefix
        FROM gpu_hours
        WHERE hour >= toStartOfHour({_W}) AND hour < {_U}
        GROUP BY cluster, node
    ) AS v ON v.cluster = n.cluster AND v.node = n.node
)"""

ESTATE = f"""
WITH {NODES}
SELECT cluster, toString(pool), toString(model), max(memory), max(rate), any(currency),
    max(prefix)
FROM nodes WHERE polled_in
GROUP BY cluster, pool, model
ORDER BY cluster, pool, model
"""

# per allocation and the model of the nodes it ran on (whole GPUs, measured time only: no MIG
# slice, AMD compute partition or Intel tile, whose identities end in /<id>), and the identity
# prefix of its GPUs (the vendor)
MODEL_USE = f"""
WITH {NODES},
per_alloc AS (
    SELECT g.cluster AS cluster, g.allocation_id AS allocation_id, toString(n.model) AS model,
        any(toString(n.pool)) AS pool, max(n.memory) AS model_memory, max(n.rate) AS rate,
        any(n.currency) AS currency, any(g.scheduler) AS sched, any(g.workload_class) AS cls,
        uniqExactIf(g.gpu_uuid, g.allocated_s > g.unmeasured_s) AS gpus,
        sum(g.allocated_s - g.unmeasured_s) / 3600 AS gpu_h,
        sum(g.consumed_gpu_s) / 3600 AS consumed_h,
        toUInt64(sum(g.allocated_s - g.unmeasured_s) / 60) AS measured,
        sum(g.memory_minutes) AS with_memory,
        quantileExactIf({{q:Float64}})(g.activity_max, g.allocated_s > g.unmeasured_s) AS peak,
        max(g.memory_max_mib) AS memory, groupUniqArray(4)(substring(g.gpu_uuid, 1, 4)) AS prefixes
    FROM (
        SELECT * FROM gpu_hours FINAL
        WHERE hour >= toStartOfHour({_W}) AND hour < {_U} AND allocation_id != ''
            AND NOT startsWith(gpu_uuid, 'MIG-') AND position(gpu_uuid, '/') = 0
    ) AS g
    INNER JOIN nodes AS n ON n.cluster = g.cluster AND n.node = g.node
    GROUP BY g.cluster, g.allocation_id, model
    HAVING gpu_h > 0
),
meta AS ({META_SQL})
SELECT a.cluster, a.allocation_id, a.sched, a.cls, a.model, a.pool, a.model_memory, a.rate,
    a.currency, a.gpus, a.gpu_h, a.consumed_h, a.measured, a.with_memory, a.peak, a.memory,
    m.owner, m.team, m.name, m.partition, m.owner_kind, m.owner_name, a.prefixes
FROM per_alloc AS a
LEFT JOIN meta AS m ON m.cluster = a.cluster AND m.allocation_id = a.allocation_id
ORDER BY a.cluster, a.allocation_id, a.model
"""

# per allocation, node and cause: the stranded GPU-hours charged to it, what it held per GPU,
# the node's own share per GPU (its CPUs or memory over its GPUs, the least in the window)
STRANDED = f"""
WITH per_alloc AS (
    SELECT cluster, allocation_id, node, cause, max(gpus) AS held_gpus,
        max(if(cause = 'cpu', cpus, memory_mib) / gpus) AS per_gpu,
        sum(stranded_gpu_h) AS stranded_h, sum(interval_s) / 3600 AS hours
    FROM v_stranded_by_allocation
    WHERE time >= {_W} AND time < {_U} AND gpus > 0
    GROUP BY cluster, allocation_id, node, cause
),
shares AS (
    SELECT cluster, node, min(cpus / gpus) AS cpu_share, min(memory_mib / gpus) AS mem_share
    FROM node_capacity FINAL
    WHERE time >= {_W} AND time < {_U} AND gpus > 0
    GROUP BY cluster, node
),
meta AS (
    SELECT cluster, allocation_id, any(scheduler) AS sched, any(workload_class) AS cls,
        any(owner) AS owner, any(team) AS team, any(name) AS name, any(partition) AS partition,
        any(owner_kind) AS owner_kind, any(owner_name) AS owner_name
    FROM v_allocations WHERE allocation_id IN (SELECT allocation_id FROM per_alloc)
    GROUP BY cluster, allocation_id
)
SELECT a.cluster, a.allocation_id, toString(a.node), a.cause, a.held_gpus, a.per_gpu,
    a.stranded_h, a.hours, if(a.cause = 'cpu', s.cpu_share, s.mem_share), m.sched, m.cls,
    m.owner, m.team, m.name, m.partition, m.owner_kind, m.owner_name
FROM per_alloc AS a
INNER JOIN shares AS s ON s.cluster = a.cluster AND s.node = a.node
LEFT JOIN meta AS m ON m.cluster = a.cluster AND m.allocation_id = a.allocation_id
ORDER BY a.cluster, a.allocation_id, a.node, a.cause
"""

# runs spread thin whose days meet the window, with their family (a gang's: any member's)
SPREAD = f"""
WITH spread AS (
    SELECT * FROM v_spread_work
    WHERE last_day >= toDate({_W}) AND first_day <= toDate({_U})
),
meta AS (
    SELECT cluster, if(gang_id = '', allocation_id, gang_id) AS unit,
        any(scheduler) AS sched, any(owner) AS owner, any(team) AS team, any(name) AS name,
        any(partition) AS partition, any(owner_kind) AS owner_kind,
        any(owner_name) AS owner_name
    FROM v_allocations
    WHERE allocation_id IN (SELECT allocation_id FROM spread)
        OR (gang_id != '' AND gang_id IN (SELECT allocation_id FROM spread))
    GROUP BY cluster, unit
)
SELECT s.cluster, s.allocation_id, s.scheduler, s.workload_class, s.nodes, s.gpus,
    s.largest_node_gpus, s.allocated_gpu_h, s.consumed_gpu_h, m.sched,
    m.owner, m.team, m.name, m.partition, m.owner_kind, m.owner_name
FROM spread AS s
LEFT JOIN meta AS m ON m.cluster = s.cluster AND m.unit = s.allocation_id
ORDER BY s.cluster, s.allocation_id
"""


def _target(r: tuple[Any, ...], cluster: str, unit: str, scheduler: str) -> Any:
    m = dict(zip(META_COLUMNS, (v or "" for v in r), strict=True))
    if not m["name"]:  # no allocation event: the allocation is its own workload
        m["name"] = unit
    return target_of({"cluster": cluster, "scheduler": scheduler, **m})


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def estate(client: Any, w: HistoryWindow) -> list[GpuModel]:
    """The GPU models each cluster's pools had in the window."""
    return [
        GpuModel(
            cluster=r[0],
            pool=r[1],
            gpu_model=r[2],
            memory_mib=_opt(r[3]),
            rate=_opt(r[4]),
            currency=r[5] or "",
            vendor=vendor_of(r[6] or ""),
        )
        for r in run_query(client, ESTATE, params_of(w)).result_rows
    ]


@dataclass
class _Use:
    cls: str = ""
    pool: str = ""
    model_memory: float | None = None
    rate: float | None = None
    currency: str = ""
    gpus: int = 0
    allocations: int = 0
    gpu_hours: float = 0.0
    consumed: float = 0.0
    measured: int = 0
    with_memory: int = 0
    memory: float = 0.0
    peaks: tuple[float, ...] = ()
    vendors: set[Vendor] = field(default_factory=set)


def model_uses(client: Any, w: HistoryWindow) -> list[ModelUse]:
    """Every family's whole-GPU use per GPU model it ran on (on one vendor's GPUs: a family
    whose allocations on one model name several vendors says nothing)."""
    uses: dict[tuple[RecommendationTarget, str, str], _Use] = defaultdict(_Use)
    for r in run_query(client, MODEL_USE, params_of(w, q=PEAK_QUANTILE)).result_rows:
        t = _target(r[16:22], r[0], r[1], r[2])
        u = uses[t, r[0], r[4]]
        u.cls = u.cls or r[3]
        u.pool = u.pool or r[5]
        u.model_memory = u.model_memory if r[6] is None else max(u.model_memory or 0, r[6])
        u.rate = u.rate if r[7] is None else max(u.rate or 0.0, float(r[7]))
        u.currency = u.currency or r[8] or ""
        u.gpus = max(u.gpus, int(r[9]))
        u.allocations += 1
        u.gpu_hours += float(r[10])
        u.consumed += float(r[11])
        u.measured += int(r[12])
        u.with_memory += int(r[13])
        u.peaks += (float(r[14]),)
        u.memory = max(u.memory, float(r[15]))
        u.vendors |= {vendor_of(p) for p in r[22]}
    out = []
    for (t, cluster, model), u in uses.items():
        if len(u.vendors) != 1:
            continue
        (vendor,) = u.vendors
        current = GpuModel(cluster, u.pool, model, _opt(u.model_memory), u.rate, u.currency, vendor)
        out.append(ModelUse(
            target=t, workload_class=class_of(u.cls, WorkloadClass.BATCH), current=current,
            gpus=u.gpus, allocations=u.allocations, gpu_hours=u.gpu_hours,
            consumed_gpu_hours=u.consumed, measured_minutes=u.measured,
            memory_minutes=u.with_memory, allocation_peaks=u.peaks, peak_memory_mib=u.memory,
        ))  # fmt: skip
    return out


@dataclass
class _Stranded:
    cls: str = ""
    gpus: int = 0
    per_alloc: dict[str, float] = field(default_factory=dict)
    share: float = float("inf")
    stranded: float = 0.0
    hours: float = 0.0
    nodes: set[str] = field(default_factory=set)


def strandings(client: Any, w: HistoryWindow) -> list[Stranding]:
    """Every family charged stranded GPU-hours, per cause."""
    fams: dict[tuple[RecommendationTarget, str], _Stranded] = defaultdict(_Stranded)
    for r in run_query(client, STRANDED, params_of(w)).result_rows:
        cluster, alloc, node, cause = r[0], r[1], r[2], r[3]
        sched = r[9] or alloc.split("/", 1)[0]
        f = fams[_target(r[11:17], cluster, alloc, sched), cause]
        f.cls = f.cls or r[10] or ""
        f.gpus = max(f.gpus, int(r[4]))
        f.per_alloc[alloc] = max(f.per_alloc.get(alloc, 0.0), float(r[5]))
        f.share = min(f.share, float(r[8]))
        f.stranded += float(r[6])
        f.hours += float(r[7])
        f.nodes.add(node)
    return [
        Stranding(
            target=t, workload_class=class_of(f.cls, WorkloadClass.BATCH), cause=cause,
            gpus=f.gpus, allocations=len(f.per_alloc),
            held_per_gpu=tuple(f.per_alloc[a] for a in sorted(f.per_alloc)),
            node_share=f.share, stranded_gpu_hours=f.stranded, hours=f.hours,
            nodes=tuple(sorted(f.nodes)),
        )
        for (t, cause), f in fams.items()
    ]  # fmt: skip


def spread_runs(client: Any, w: HistoryWindow) -> list[SpreadRun]:
    """Every run spread over more nodes than it needed, whose days meet the window."""
    out = []
    for r in run_query(client, SPREAD, params_of(w)).result_rows:
        cluster, unit = r[0], r[1]
        sched = r[9] or r[2]
        out.append(
            SpreadRun(
                target=_target(r[10:16], cluster, unit, sched),
                workload_class=class_of(r[3], WorkloadClass.BATCH),
                unit=unit,
                nodes=int(r[4]),
                gpus=float(r[5]),
                largest_node_gpus=float(r[6]),
                allocated_gpu_h=float(r[7]),
                consumed_gpu_h=float(r[8]),
            )
        )
    return out
