"""The warehouse's row shapes: the columns of each table the sink writes, the mappers from
records to rows, and the rollup SQL (gpu_minutes -> gpu_hours -> gpu_days). The sink and the
readers that write (recommendations, benchmarks) share them from here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpugap.schemas import Alert, AlertDelivery, DeadLetter, GpuMinute, K8sPodEvent, SlurmJobEvent
from gpugap.schemas.models import (
    NodeCapacity,
    QueueQuota,
    Recommendation,
    SchedulerGpuCount,
    Transfer,
)
from gpugap.schemas.types import LifecycleKind, PodEventKind, WorkloadClass, vendor_of

MINUTE_COLUMNS = [
    "cluster",
    "node",
    "gpu_uuid",
    "minute",
    "allocation_id",
    "scheduler",
    "workload_class",
    "owner",
    "team",
    "gang_id",
    "allocated_ms",
    "unallocated_ms",
    "consumed_ms",
    "device_ms",
    "gpu_share",
    "physical_uuid",
    "activity_max_bp",
    "activity_metric",
    "memory_used_mib",
    "power_dw",
    "sample_count",
    "no_samples",
    "measured_ms",
    "coverage_grain",
    "idle_threshold_bp",
    "idle_after_minutes",
    "vendor",
    "share_source",
    "ingested_at",
]
ALLOCATION_COLUMNS = [
    "cluster",
    "allocation_id",
    "scheduler",
    "name",
    "owner",
    "team",
    "workload_class",
    "partition",
    "qos",
    "gang_id",
    "gang_size",
    "gpus_requested",
    "nodes",
    "time_limit_s",
    "submit_time",
    "start_time",
    "end_time",
    "final_state",
    "exit_code",
    "interactive",
    "owner_kind",
    "owner_name",
    "eligible_time",
    "namespace",
    "queue",
]
ALERT_COLUMNS = [
    "alert_id",
    "kind",
    "state",
    "time",
    "opened_at",
    "resolved_at",
    "cluster",
    "scheduler",
    "allocation_id",
    "gang_id",
    "owner",
    "team",
    "workload_class",
    "nodes",
    "gpus",
    "idle_minutes",
    "idle_gpu_hours",
    "pending_pods",
    "running_pods",
    "message",
]
DELIVERY_COLUMNS = [
    "alert_id",
    "state",
    "target",
    "time",
    "outcome",
    "code",
    "detail",
    "attempts",
    "reminder_minutes",
    "kind",
    "cluster",
    "allocation_id",
    "owner",
    "team",
]
DEAD_LETTER_COLUMNS = [
    "time",
    "source_topic",
    "partition",
    "offset",
    "key_b64",
    "value_b64",
    "kind",
    "reason",
    "consumer",
]

# idle minutes by the threshold the stream stamped on the minute (its policy), else, for rows
# from before, by the class's in idle_policy (the stream's, from GPUGAP_IDLE_*), on the seconds
# some sample covered (consumed < threshold x measured); and only a minute the allocation held
# whole, as the stream's alerts count them: a pod bound at 01:11:03 has no idle minute 01:11
# (its 57 s are allocated, measured and consumed as they were). Unmeasured seconds are the
# allocated ones no sample covered (a lost scrape), by the second (migration 014)
#: (columns unqualified: read on gpu_minutes alone, or joined to idle_policy, which has none of
#: them; the recommenders' idle episodes use it too)
WHOLE_MINUTE_HELD = "allocated_ms >= 60000 * if(gpu_share > 0, gpu_share, 1) - 1"
ROLLUP = """
INSERT INTO gpu_hours (hour, cluster, node, gpu_uuid, allocation_id, scheduler,
    workload_class, owner, team, gang_id, allocated_s, unmeasured_s, unallocated_s,
    consumed_gpu_s, minutes, idle_minutes, idle_s, activity_max, memory_max_mib,
    memory_minutes, device_s, physical_uuid, version)
SELECT toStartOfHour(m.minute) AS hour, m.cluster, m.node, m.gpu_uuid, m.allocation_id,
    any(m.scheduler), any(m.workload_class), any(m.owner), any(m.team), any(m.gang_id),
    sum(m.allocated_ms) / 1000,
    sum(m.allocated_ms - least(m.measured_ms, m.allocated_ms)) / 1000,
    sum(m.unallocated_ms) / 1000, sum(m.consumed_ms) / 1000, count(),
    countIf(WHOLE_MINUTE_HELD AND m.measured_ms > 0
        AND m.consumed_ms < if(m.idle_after_minutes > 0, m.idle_threshold_bp / 10000,
            p.threshold) * m.measured_ms) AS idle,
    -- an idle minute counts the share of a GPU its row held (rows before shares: whole)
    sumIf(60 * if(m.gpu_share > 0, m.gpu_share, 1), WHOLE_MINUTE_HELD AND m.measured_ms > 0
        AND m.consumed_ms < if(m.idle_after_minutes > 0, m.idle_threshold_bp / 10000,
            p.threshold) * m.measured_ms),
    max(m.activity_max_bp) / 10000, max(m.memory_used_mib),
    countIf(m.no_samples = 0 AND m.memory_used_mib > 0), sum(m.device_ms) / 1000,
    any(m.physical_uuid), now64(3)
FROM (
    SELECT * FROM gpu_minutes FINAL WHERE minute >= {start:DateTime} AND minute < {end:DateTime}
) AS m
LEFT JOIN (SELECT workload_class, threshold FROM idle_policy FINAL) AS p
    ON p.workload_class = m.workload_class
GROUP BY hour, m.cluster, m.node, m.gpu_uuid, m.allocation_id
""".replace("WHOLE_MINUTE_HELD", WHOLE_MINUTE_HELD)


DAILY = """
INSERT INTO gpu_days (day, cluster, node, allocation_id, scheduler, workload_class, owner,
    team, gang_id, gpus, allocated_s, unmeasured_s, unallocated_s, consumed_gpu_s, idle_minutes,
    idle_s, version)
SELECT toDate(hour) AS day, cluster, node, allocation_id, any(scheduler), any(workload_class),
    any(owner), any(team), any(gang_id), uniqExact(gpu_uuid), sum(allocated_s),
    sum(unmeasured_s), sum(unallocated_s), sum(consumed_gpu_s), sum(idle_minutes), sum(idle_s),
    now64(3)
FROM gpu_hours FINAL
WHERE hour >= {start:DateTime} AND hour < {end:DateTime}
GROUP BY day, cluster, node, allocation_id
"""

# each team's totals per day (migration 022), recomputed after the days they come from: what a
# reader scoped to one person may see of their team (the row policies hide its allocations)
TEAM_DAILY = """
INSERT INTO team_days (day, cluster, team, scheduler, workload_class, allocations, owners,
    allocated_s, unmeasured_s, consumed_gpu_s, idle_s, version)
SELECT day, cluster, team, scheduler, workload_class, uniqExact(allocation_id),
    uniqExact(owner), sum(allocated_s), sum(unmeasured_s), sum(consumed_gpu_s), sum(idle_s),
    now64(3)
FROM gpu_days FINAL
WHERE day >= toDate({start:DateTime}) AND day < toDate({end:DateTime}) AND allocation_id != ''
GROUP BY day, cluster, team, scheduler, workload_class
"""


# hours (days) whose rollup is older than the rows under them
STALE_HOURS = (
    "SELECT m.hour FROM (SELECT toStartOfHour(minute) AS hour, max(ingested_at) AS t "
    "FROM gpu_minutes GROUP BY hour) AS m LEFT JOIN (SELECT hour, max(version) AS v "
    "FROM gpu_hours GROUP BY hour) AS h USING (hour) WHERE h.v < m.t OR h.v IS NULL "
    "SETTINGS join_use_nulls = 1"
)
STALE_DAYS = (
    "SELECT toDateTime(h.day) FROM (SELECT toDate(hour) AS day, max(version) AS t "
    "FROM gpu_hours GROUP BY day) AS h LEFT JOIN (SELECT day, max(version) AS v "
    "FROM gpu_days GROUP BY day) AS d USING (day) WHERE d.v < h.t OR d.v IS NULL "
    "SETTINGS join_use_nulls = 1"
)


def minute_ms(seconds: float) -> int:
    """Seconds of one minute as the integer milliseconds stored (at most the minute)."""
    return min(round(seconds * 1000), 60_000)


def minute_row(m: GpuMinute, now: datetime) -> list[Any]:
    return [
        m.cluster,
        m.node,
        m.gpu_uuid,
        m.minute,
        m.allocation_id or "",
        m.scheduler or "",
        m.workload_class or "",
        m.owner or "",
        m.team or "",
        m.gang_id or "",
        minute_ms(m.allocated_s),
        minute_ms(m.unallocated_s),
        minute_ms(m.consumed_gpu_s),
        # a record from a worker before shares says neither: it is a legacy row (gpu_share 0)
        minute_ms(m.device_s if m.device_s is not None else m.allocated_s + m.unallocated_s),
        m.gpu_share if m.device_s is not None else 0.0,
        m.physical_uuid or m.gpu_uuid,
        round((m.activity_max or 0.0) * 10_000),
        m.activity_metric or "",
        round(m.memory_used_mib_avg or 0.0),
        min(round((m.power_w_avg or 0.0) * 10), 65_535),
        min(m.sample_count, 255),
        int(m.no_samples),
        # a record from a worker before coverage by the second: measured by the minute
        minute_ms(m.measured),
        "second" if m.measured_s is not None else "minute",
        round(m.idle_threshold * 10_000) if m.idle_threshold is not None else 0,
        min(m.idle_after_minutes or 0, 65_535),
        m.vendor or vendor_of(m.gpu_uuid),
        m.share_source or "",
        now,
    ]


def slurm_row(e: SlurmJobEvent) -> list[Any]:
    end = e.kind is LifecycleKind.END
    cls = e.workload_class or (WorkloadClass.INTERACTIVE if e.interactive else WorkloadClass.BATCH)
    return [
        e.cluster,
        e.allocation_id,
        "slurm",
        e.job_name or "",
        e.user or "",
        e.account or "",
        cls.value,
        e.partition or "",
        e.qos or "",
        "",
        0,
        e.gpus_total,
        [n.node for n in e.nodes],
        e.time_limit_s or 0,
        e.submit_time,
        e.start_time,
        e.end_time if end else None,
        e.state.value if end else None,
        e.exit_code if end else None,
        int(e.interactive),
        "",
        "",
        e.eligible_time,
        "",
        "",
    ]


def pod_row(e: K8sPodEvent) -> list[Any]:
    ended = e.kind in (PodEventKind.TERMINATED, PodEventKind.DELETED)
    started = e.kind in (PodEventKind.BOUND, PodEventKind.RUNNING)
    reason = (e.reason.value if e.reason else e.kind.value) if ended else None
    return [
        e.cluster,
        e.allocation_id,
        "kubernetes",
        f"{e.namespace}/{e.name}",
        e.owner or "",
        e.team or "",
        e.workload_class.value if e.workload_class else "",
        "",
        "",
        e.gang_id or "",
        e.gang_size or 0,
        e.gpus,
        [e.node] if e.node else [],
        0,
        e.created_time,
        e.time if started else None,
        e.time if ended else None,
        reason,
        None,
        0,
        e.owner_kind or "",
        e.owner_name or "",
        None,
        e.namespace,
        e.queue or "",
    ]


def alert_row(a: Alert) -> list[Any]:
    return [
        a.alert_id,
        a.kind.value,
        a.state.value,
        a.time,
        a.opened_at,
        a.resolved_at,
        a.cluster,
        a.scheduler.value,
        a.allocation_id or "",
        a.gang_id or "",
        a.owner or "",
        a.team or "",
        a.workload_class.value if a.workload_class else "",
        list(a.nodes),
        list(a.gpus),
        a.idle_minutes,
        a.idle_gpu_hours,
        a.pending_pods,
        a.running_pods,
        a.message,
    ]


def delivery_row(d: AlertDelivery) -> list[Any]:
    a = d.alert
    return [
        d.alert_id,
        d.state.value,
        d.target,
        d.time,
        d.outcome.value,
        d.code,
        d.detail,
        d.attempts,
        d.reminder_minutes,
        a.kind.value,
        a.cluster,
        a.allocation_id or a.gang_id or "",
        a.owner or "",
        a.team or "",
    ]


def dead_letter_row(d: DeadLetter) -> list[Any]:
    return [
        d.time,
        d.source_topic,
        -1 if d.partition is None else d.partition,
        -1 if d.offset is None else d.offset,
        d.key_b64 or "",
        d.value_b64,
        d.kind.value,
        d.reason,
        d.consumer or "",
    ]


RECOMMENDATION_COLUMNS = [
    "id", "kind", "scheduler", "cluster", "target_kind", "target", "user", "account", "job_name",
    "partition", "namespace", "owner_kind", "owner_name", "workload_class", "parameter",
    "from_value", "to_value", "saved_gpu_h_per_week", "confidence", "history_days", "allocations",
    "samples", "sample_hours", "sample_gpu_h", "spread", "since", "until", "evidence_query",
    "rationale", "apply", "record", "computed_at",
]  # fmt: skip


def recommendation_target(r: Recommendation) -> str:
    """The target as people read it: 'hpc: alice/vision train-resnet (gpu)', 'k8s: ml
    PyTorchJob/trainer'."""
    t = r.target
    if t.kind == "k8s_workload":
        return f"{t.cluster}: {t.namespace or '-'} {t.owner_kind or '-'}/{t.owner_name or '-'}"
    who = "/".join(v for v in (t.user, t.account) if v)
    name = f" {t.job_name}" if t.job_name else ""
    part = f" ({t.partition})" if t.partition else ""
    return f"{t.cluster}: {who or '-'}{name}{part}"


def recommendation_row(r: Recommendation) -> list[Any]:
    t, e = r.target, r.evidence
    return [
        r.id, r.kind, t.scheduler.value, t.cluster, t.kind, recommendation_target(r),
        t.user or "", t.account or "", t.job_name or "", t.partition or "", t.namespace or "",
        t.owner_kind or "", t.owner_name or "", r.workload_class.value, r.change.parameter,
        r.change.from_value, r.change.to_value, r.saved_gpu_hours_per_week, r.confidence,
        e.history_days, e.allocations, e.samples, e.hours, e.gpu_hours, e.spread, e.since,
        e.until, e.query, r.rationale, r.apply, r.model_dump_json(), r.computed_at,
    ]  # fmt: skip


TRANSFER_COLUMNS = [
    "event_id", "time", "interval_s", "cluster", "from_env", "to_env", "bytes", "source", "node",
    "interface", "team", "owner", "allocation_id", "description", "billed_cost",
    "billed_currency", "ingested_at",
]  # fmt: skip


def transfer_row(t: Transfer, now: datetime) -> list[Any]:
    return [
        t.event_id, t.time, t.interval_s, t.cluster, t.from_env, t.to_env, t.bytes, t.source,
        t.node or "", t.interface or "", t.team or "", t.owner or "", t.allocation_id or "",
        t.description or "", t.billed_cost, t.billed_currency or "", now,
    ]  # fmt: skip


NODE_CAPACITY_COLUMNS = [
    "cluster", "node", "time", "interval_s", "scheduler", "source", "pool", "gpu_model",
    "gpu_memory_mib", "gpus", "cpus", "memory_mib", "schedulable", "allocation_ids",
    "allocation_gpus", "allocation_cpus", "allocation_memory_mib", "ingested_at",
]  # fmt: skip


def node_capacity_row(c: NodeCapacity, now: datetime) -> list[Any]:
    held = c.allocations
    return [
        c.cluster, c.node, c.time, c.interval_s, c.scheduler.value, c.source, c.pool or "",
        c.gpu_model or "", c.gpu_memory_mib, c.gpus, c.cpus, c.memory_mib, int(c.schedulable),
        [a.allocation_id for a in held], [a.gpus for a in held], [a.cpus for a in held],
        [a.memory_mib for a in held], now,
    ]  # fmt: skip


QUEUE_QUOTA_COLUMNS = [
    "cluster", "time", "interval_s", "kind", "queue", "namespace", "parent", "flavor",
    "resource", "entitled_gpus", "limit_gpus", "held_gpus", "borrowed_gpus",
    "pending_workloads", "admitted_workloads", "ingested_at",
]  # fmt: skip


def queue_quota_row(q: QueueQuota, now: datetime) -> list[Any]:
    return [
        q.cluster, q.time, q.interval_s, q.kind.value, q.queue, q.namespace or "",
        q.parent or "", q.flavor or "", q.resource, q.entitled_gpus, q.limit_gpus,
        q.held_gpus, q.borrowed_gpus, q.pending_workloads, q.admitted_workloads, now,
    ]  # fmt: skip


SCHEDULER_GPU_COUNT_COLUMNS = [
    "cluster", "time", "interval_s", "scheduler", "source", "scope", "name", "gpus_allocated",
    "gpus_total", "ingested_at",
]  # fmt: skip


def scheduler_gpu_count_row(c: SchedulerGpuCount, now: datetime) -> list[Any]:
    return [
        c.cluster, c.time, c.interval_s, c.scheduler.value, c.source, c.scope.value,
        c.name or "", c.gpus_allocated, c.gpus_total, now,
    ]  # fmt: skip
