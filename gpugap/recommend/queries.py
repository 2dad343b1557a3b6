"""The SQL the recommenders read, and the rows it turns into (the recommenders' dataclasses).

Every query is read-only and bounded by the window; values are server-side parameters.
What each reads at 100M GPU-minute rows: the allocations table (Slurm families), the hourly
rollup (GPU counts, notebook candidates), the minutes of the notebook candidates only, and
the partial-gang alerts.
"""

# ruff: noqa: S608  (the SQL is this module's constants; values are bound as parameters)
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.recommend.base import HistoryWindow, k8s_target, slurm_target
from gpugap.recommend.batch import GPU_IDLE_LIFE, GpuFamily, SlurmFamily, vendor_in
from gpugap.recommend.interactive import NOTEBOOK_IDLE_SHARE, NotebookIdle
from gpugap.recommend.placement import PartialGang
from gpugap.schemas.types import WorkloadClass
from gpugap.warehouse.client import run_query
from gpugap.warehouse.rows import WHOLE_MINUTE_HELD

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_W = "{since:DateTime64(3, 'UTC')}"
_U = "{until:DateTime64(3, 'UTC')}"

# the latest data: the newest minute (narrowed like v_data_extent), job end, alert
LATEST = """
SELECT
    (SELECT latest_minute FROM v_data_extent) AS minute,
    (SELECT max(end_time) FROM allocations) AS job_end,
    (SELECT max(time) FROM alerts) AS alert
"""
# the first data in the window: a measured GPU-hour (an allocation bound before telemetry
# began holds unmeasured hours, which are no history of use), a job's end, an alert
FIRST = f"""
SELECT
    (SELECT min(hour) FROM gpu_hours WHERE hour >= toStartOfHour({_W})
        AND (allocated_s > unmeasured_s OR unallocated_s > 0)) AS hour,
    (SELECT min(end_time) FROM allocations WHERE end_time >= {_W}) AS job_end,
    (SELECT min(time) FROM alerts WHERE time >= {_W}) AS alert
"""

SLURM_FAMILIES = f"""
SELECT cluster, owner, team, name, partition, any(qos),
    groupArrayIf(elapsed_s, final_state = 'COMPLETED'),
    groupArrayIf(time_limit_s, final_state = 'COMPLETED'),
    groupArrayIf(gpus_requested, final_state = 'COMPLETED'),
    countIf(final_state = 'TIMEOUT'), count()
FROM v_allocations
WHERE scheduler = 'slurm' AND end_time >= {_W} AND end_time < {_U} AND time_limit_s > 0
    AND elapsed_s IS NOT NULL AND gpus_requested > 0
GROUP BY cluster, owner, team, name, partition
HAVING countIf(final_state = 'COMPLETED') >= 3
"""

# the workload an allocation belongs to, as k8s_target names it: a pod with an owner is its
# owner's (a ReplicaSet's pod-template hash dropped: every ReplicaSet of one Deployment), a
# Slurm job or a bare pod its name
WORKLOAD_KEY = """if(m.owner_name != '', tuple(splitByChar('/', m.name)[1],
        if(m.owner_kind = 'ReplicaSet', replaceRegexpOne(m.owner_name, '-[^-]+$', ''),
            m.owner_name)), tuple(m.name, ''))"""

# per allocation and GPU from the hourly rollup, measured time only (a GPU or an hour
# without telemetry says nothing of use); an allocation with N GPUs is a family member
# asking for N; families where every allocation kept every GPU busy drop out here
GPU_FAMILIES = f"""
WITH per_gpu AS (
    SELECT cluster, allocation_id, gpu_uuid, any(scheduler) AS scheduler,
        any(workload_class) AS cls,
        sum(allocated_s - unmeasured_s) AS measured_s, sum(idle_s) AS idle_gpu_s,
        sum(consumed_gpu_s) AS consumed_s
    FROM gpu_hours FINAL
    WHERE hour >= toStartOfHour({_W}) AND hour < {_U} AND allocation_id != ''
    GROUP BY cluster, allocation_id, gpu_uuid
),
per_alloc AS (
    SELECT cluster, allocation_id, any(scheduler) AS sched, any(cls) AS wclass,
        countIf(measured_s > 0) AS gpus,
        countIf(measured_s > 0 AND idle_gpu_s < {{idle_life:Float64}} * measured_s) AS busy,
        max(measured_s) / 3600 AS hours, sum(measured_s) / 3600 AS gpu_h,
        sum(consumed_s) / 3600 AS consumed_h,
        groupUniqArray(4)(substring(gpu_uuid, 1, 4)) AS prefixes
    FROM per_gpu
    GROUP BY cluster, allocation_id
    HAVING gpus >= 2
),
meta AS (
    SELECT cluster, allocation_id, owner, team, name, partition, owner_kind, owner_name
    FROM v_allocations
    WHERE allocation_id IN (SELECT allocation_id FROM per_alloc)
)
SELECT a.cluster, a.sched, any(a.wclass), m.owner, m.team, any(m.name), m.partition,
    m.owner_kind, any(m.owner_name), a.gpus, count(), max(a.busy), avg(a.busy),
    stddevPop(a.busy), sum(a.hours), sum(a.gpu_h), sum(a.consumed_h),
    groupUniqArrayArray(4)(a.prefixes)
FROM per_alloc AS a
LEFT JOIN meta AS m ON m.cluster = a.cluster AND m.allocation_id = a.allocation_id
GROUP BY a.cluster, a.sched, m.owner, m.team, m.partition, m.owner_kind,
    {WORKLOAD_KEY}, a.gpus
HAVING max(a.busy) < a.gpus
"""

# notebooks idle most of their life (hourly rollup), then their idle episodes from the
# minutes: an allocation's minute is idle when every GPU it holds is below the threshold
# (the one stamped on the minute, else the class's in idle_policy). No FINAL on the minutes:
# grouping by minute already collapses a re-delivered row (the same values twice).
NOTEBOOK_CANDIDATES = f"""
SELECT cluster, allocation_id, any(scheduler), uniqExact(gpu_uuid) AS gpus
FROM gpu_hours FINAL
WHERE hour >= toStartOfHour({_W}) AND hour < {_U} AND allocation_id != ''
    AND workload_class = 'interactive'
GROUP BY cluster, allocation_id
HAVING sum(idle_s) >= {{share:Float64}} * sum(allocated_s - unmeasured_s)
"""
NOTEBOOK_EPISODES = f"""
WITH (SELECT threshold FROM idle_policy FINAL WHERE workload_class = 'interactive')
    AS class_threshold,
candidates AS ({NOTEBOOK_CANDIDATES})
SELECT cluster, allocation_id, measured, length(idle) AS idle_minutes,
    arrayPopFront(arrayDifference(arrayPushBack(
        arrayFilter((i, d) -> d != 1, arrayEnumerate(arrayDifference(idle)),
            arrayDifference(idle)),
        length(idle) + 1))) AS episodes
FROM (
    SELECT cluster, allocation_id, count() AS measured,
        arraySort(groupArrayIf(toUInt32(toUnixTimestamp(minute) / 60), all_idle)) AS idle
    FROM (
        SELECT cluster, allocation_id, minute,
            -- idle: below the threshold over its measured seconds, for a minute held whole
            -- (warehouse.rows.ROLLUP)
            min(consumed_ms < if(idle_threshold_bp > 0, idle_threshold_bp / 10000,
                class_threshold) * measured_ms AND {WHOLE_MINUTE_HELD}) AS all_idle
        FROM gpu_minutes
        WHERE toStartOfHour(minute) >= toStartOfHour({_W}) AND minute >= {_W}
            AND minute < {_U} AND allocation_id IN (SELECT allocation_id FROM candidates)
            AND measured_ms > 0
            AND allocated_ms > 0
        GROUP BY cluster, allocation_id, minute
    )
    GROUP BY cluster, allocation_id
)
"""
NOTEBOOK_META = f"""
WITH candidates AS ({NOTEBOOK_CANDIDATES})
SELECT cluster, allocation_id, scheduler, owner, team, name, partition, owner_kind, owner_name
FROM v_allocations WHERE allocation_id IN (SELECT allocation_id FROM candidates)
"""

PARTIAL_GANGS = f"""
WITH episodes AS (
    SELECT cluster, gang_id, alert_id, max(idle_gpu_hours) AS gpu_h,
        max(coalesce(running_pods, 0) + coalesce(pending_pods, 0)) AS pods,
        length(groupUniqArrayArray(nodes)) AS nodes
    FROM alerts
    WHERE kind = 'partial_gang' AND scheduler = 'kubernetes' AND time >= {_W} AND time < {_U}
        AND gang_id != ''
    GROUP BY cluster, gang_id, alert_id
),
gangs AS (
    SELECT cluster, gang_id, any(splitByChar('/', name)[1]) AS namespace,
        max(owner_kind) AS okind, max(owner_name) AS oname,
        any(splitByChar('/', name)[2]) AS pod, max(gpus_requested) AS per_pod,
        max(gang_size) AS size
    FROM v_allocations
    WHERE scheduler = 'kubernetes' AND gang_id IN (SELECT gang_id FROM episodes)
    GROUP BY cluster, gang_id
)
SELECT e.cluster, e.gang_id, e.alert_id, e.gpu_h, greatest(e.pods, g.size), e.nodes,
    g.namespace, g.okind, g.oname, g.pod, g.per_pod
FROM episodes AS e
LEFT JOIN gangs AS g ON g.cluster = e.cluster AND g.gang_id = e.gang_id
ORDER BY e.cluster, e.gang_id, e.alert_id
"""


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    t = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return t if t > _EPOCH else None


def window(client: Any, days: float, until: datetime | None = None) -> HistoryWindow:
    """[until - days, until): until is the latest data (a minute, a job's end, an alert)
    unless given; history_days counts the days of it that hold data."""
    if until is None:
        row = run_query(client, LATEST).result_rows[0]
        latest = [t for t in (_utc(v) for v in row) if t is not None]
        minute = _utc(row[0])
        if minute is not None:  # the latest minute's data runs to its end
            latest.append(minute + timedelta(minutes=1))
        until = max(latest) if latest else datetime.now(UTC)
    since = until - timedelta(days=days)
    row = run_query(client, FIRST, {"since": since}).result_rows[0]
    firsts = [t for t in (_utc(v) for v in row) if t is not None]
    first = max(since, min(firsts)) if firsts else until
    return HistoryWindow(since, until, max(0.0, (until - first).total_seconds() / 86400))


def params_of(w: HistoryWindow, **extra: Any) -> dict[str, Any]:
    return {"since": w.since, "until": w.until, **extra}


def slurm_families(client: Any, w: HistoryWindow) -> list[SlurmFamily]:
    rows = run_query(client, SLURM_FAMILIES, params_of(w)).result_rows
    return [
        SlurmFamily(
            cluster=r[0], user=r[1], account=r[2], job_name=r[3], partition=r[4], qos=r[5],
            elapsed_s=tuple(float(x) for x in r[6]), limit_s=tuple(int(x) for x in r[7]),
            gpus=tuple(int(x) for x in r[8]), timeouts=int(r[9]), jobs=int(r[10]),
        )
        for r in rows
    ]  # fmt: skip


def target_of(r: dict[str, Any]) -> Any:
    if r["scheduler"] == "slurm":
        return slurm_target(r["cluster"], r["owner"], r["team"], r["name"], r["partition"])
    ns, _, pod = (r["name"] or "").partition("/")
    return k8s_target(r["cluster"], ns, r["owner_kind"], r["owner_name"], pod or r["name"])


def class_of(value: str, default: WorkloadClass) -> WorkloadClass:
    try:
        return WorkloadClass(value)
    except ValueError:
        return default


def gpu_families(client: Any, w: HistoryWindow) -> list[GpuFamily]:
    rows = run_query(client, GPU_FAMILIES, params_of(w, idle_life=GPU_IDLE_LIFE)).result_rows
    out = []
    for r in rows:
        meta = dict(
            zip(
                ("cluster", "scheduler", "owner", "team", "name", "partition"),
                (r[0], r[1], r[3], r[4], r[5], r[6]),
                strict=True,
            )
        )
        meta.update(owner_kind=r[7] or "", owner_name=r[8] or "")
        meta = {k: v or "" for k, v in meta.items()}
        out.append(
            GpuFamily(
                target=target_of(meta),
                workload_class=class_of(r[2], WorkloadClass.BATCH),
                gpus=int(r[9]),
                allocations=int(r[10]),
                max_busy=int(r[11]),
                mean_busy=float(r[12]),
                sd_busy=float(r[13]),
                hours=float(r[14]),
                gpu_hours=float(r[15]),
                consumed_gpu_hours=float(r[16]),
                vendor=vendor_in(r[17]),
            )
        )
    return out


def notebooks(client: Any, w: HistoryWindow) -> list[NotebookIdle]:
    cands = run_query(
        client, NOTEBOOK_CANDIDATES, params_of(w, share=NOTEBOOK_IDLE_SHARE)
    ).result_rows
    if not cands:
        return []
    params = params_of(w, share=NOTEBOOK_IDLE_SHARE)
    gpus = {(r[0], r[1]): int(r[3]) for r in cands}
    meta = {
        (r[0], r[1]): dict(
            zip(
                ("cluster", "allocation_id", "scheduler", "owner", "team", "name", "partition",
                 "owner_kind", "owner_name"),
                [v or "" for v in r],
                strict=True,
            )
        )
        for r in run_query(client, NOTEBOOK_META, params).result_rows
    }  # fmt: skip
    scheduler = {(r[0], r[1]): r[2] for r in cands}
    out = []
    for r in run_query(client, NOTEBOOK_EPISODES, params).result_rows:
        key = (r[0], r[1])
        m = meta.get(key) or {
            "cluster": r[0], "allocation_id": r[1], "scheduler": scheduler[key], "owner": "",
            "team": "", "name": r[1], "partition": "", "owner_kind": "", "owner_name": "",
        }  # fmt: skip
        out.append(
            NotebookIdle(
                target=target_of(m),
                workload_class=WorkloadClass.INTERACTIVE,
                allocation_id=r[1],
                gpus=gpus.get(key, 1),
                measured_minutes=int(r[2]),
                idle_minutes=int(r[3]),
                episodes=tuple(int(e) for e in r[4]),
            )
        )
    return out


def partial_gangs(client: Any, w: HistoryWindow) -> list[PartialGang]:
    out = []
    for r in run_query(client, PARTIAL_GANGS, params_of(w)).result_rows:
        cluster, gang_id = r[0], r[1]
        ns, kind, name, pod = r[6] or "", r[7] or "", r[8] or "", r[9] or ""
        if not ns and "/" in gang_id:  # no pod metadata: the gang id is namespace/name
            ns, _, name = gang_id.partition("/")
            kind = "Gang"
        out.append(
            PartialGang(
                target=k8s_target(cluster, ns, kind, name, pod or gang_id),
                gang_id=gang_id,
                alert_id=r[2],
                idle_gpu_hours=float(r[3]),
                pods=int(r[4] or 0),
                nodes=int(r[5] or 0),
                gpus_per_pod=int(r[10] or 0),
            )
        )
    return out
