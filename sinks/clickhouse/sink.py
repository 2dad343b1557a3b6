"""The ClickHouse sink: GPU-minutes, allocation metadata, alerts and dead letters, inserted in
columnar form; offsets are committed only after ClickHouse acknowledged every table's insert.

Every table it writes is idempotent under re-delivery (Replacing/Aggregating engines keyed so
that a repeated row collapses), so "at least once" from Kafka stores each fact once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from groundfloor.ratecard import RateCard, configured_card, write_rate_card
from groundfloor.settings import ClickHouseSettings, Settings
from schemas import (
    Alert,
    AlertDelivery,
    DeadLetter,
    GpuMinute,
    K8sPodEvent,
    Record,
    SlurmJobEvent,
)
from schemas.errors import RetriableError
from schemas.models import Recommendation, Transfer
from schemas.topics import (
    ALERTS,
    DEAD_LETTER,
    DELIVERIES,
    K8S_PODS,
    MINUTES,
    RECOMMENDATIONS,
    SLURM_JOBS,
    TRANSFERS,
)
from schemas.types import LifecycleKind, PodEventKind, WorkloadClass
from sinks.base import BatchingSink, Rejected
from sinks.clickhouse.warehouse import as_gpugap_error, connect

log = logging.getLogger(__name__)

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
    "idle_threshold_bp",
    "idle_after_minutes",
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
# ClickHouse codes meaning "this data is wrong", as opposed to "try again later"
_DATA_ERROR_CODES = {6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 321, 386, 457}

# idle minutes by the threshold the stream stamped on the minute (its policy), else, for rows
# from before, by the class's in idle_policy (the stream's, from GPUGAP_IDLE_*)
ROLLUP = """
INSERT INTO gpu_hours (hour, cluster, node, gpu_uuid, allocation_id, scheduler,
    workload_class, owner, team, gang_id, allocated_s, unmeasured_s, unallocated_s,
    consumed_gpu_s, minutes, idle_minutes, idle_s, activity_max, memory_max_mib,
    memory_minutes, device_s, physical_uuid, version)
SELECT toStartOfHour(m.minute) AS hour, m.cluster, m.node, m.gpu_uuid, m.allocation_id,
    any(m.scheduler), any(m.workload_class), any(m.owner), any(m.team), any(m.gang_id),
    sum(m.allocated_ms) / 1000, sumIf(m.allocated_ms, m.no_samples = 1) / 1000,
    sum(m.unallocated_ms) / 1000, sum(m.consumed_ms) / 1000, count(),
    countIf(m.allocated_ms > 0 AND m.no_samples = 0
        AND m.consumed_ms < if(m.idle_after_minutes > 0, m.idle_threshold_bp / 10000,
            p.threshold) * m.allocated_ms) AS idle,
    -- an idle minute counts the share of a GPU its row held (rows before shares: whole)
    sumIf(60 * if(m.gpu_share > 0, m.gpu_share, 1), m.allocated_ms > 0 AND m.no_samples = 0
        AND m.consumed_ms < if(m.idle_after_minutes > 0, m.idle_threshold_bp / 10000,
            p.threshold) * m.allocated_ms),
    max(m.activity_max_bp) / 10000, max(m.memory_used_mib),
    countIf(m.no_samples = 0 AND m.memory_used_mib > 0), sum(m.device_ms) / 1000,
    any(m.physical_uuid), now64(3)
FROM (
    SELECT * FROM gpu_minutes FINAL WHERE minute >= {start:DateTime} AND minute < {end:DateTime}
) AS m
LEFT JOIN (SELECT workload_class, threshold FROM idle_policy FINAL) AS p
    ON p.workload_class = m.workload_class
GROUP BY hour, m.cluster, m.node, m.gpu_uuid, m.allocation_id
"""


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


def _ms(seconds: float) -> int:
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
        _ms(m.allocated_s),
        _ms(m.unallocated_s),
        _ms(m.consumed_gpu_s),
        # a record from a worker before shares says neither: it is a legacy row (gpu_share 0)
        _ms(m.device_s if m.device_s is not None else m.allocated_s + m.unallocated_s),
        m.gpu_share if m.device_s is not None else 0.0,
        m.physical_uuid or m.gpu_uuid,
        round((m.activity_max or 0.0) * 10_000),
        m.activity_metric or "",
        round(m.memory_used_mib_avg or 0.0),
        min(round((m.power_w_avg or 0.0) * 10), 65_535),
        min(m.sample_count, 255),
        int(m.no_samples),
        round(m.idle_threshold * 10_000) if m.idle_threshold is not None else 0,
        min(m.idle_after_minutes or 0, 65_535),
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


class ClickHouseSink(BatchingSink):
    name = "clickhouse"
    topics = (
        *(MINUTES, SLURM_JOBS, K8S_PODS, ALERTS, DELIVERIES, DEAD_LETTER, RECOMMENDATIONS),
        TRANSFERS,  # boundary transfers (docs/cost.md)
    )

    def __init__(
        self,
        settings: ClickHouseSettings,
        *,
        rollup_interval_s: float = 5.0,
        idle_policy: Mapping[str, tuple[float, int]] | None = None,
        rate_card: tuple[RateCard, str] | None = None,
        **batching: Any,
    ) -> None:
        super().__init__(**batching)
        self.settings = settings
        self.rollup_interval_s = rollup_interval_s
        #: (threshold, minutes) per class ('' = none), written to idle_policy at start
        self.idle_policy = idle_policy
        #: (card, where it came from), written to rate_card at start (GPUGAP_COST_*)
        self.rate_card = rate_card
        self._client: Any = None
        self._dirty_hours: set[datetime] = set()
        self._last_rollup = 0.0

    @classmethod
    def from_settings(cls, settings: Settings, config: Any, **batching: Any) -> ClickHouseSink:
        card, source = configured_card()
        return cls(
            settings.clickhouse,
            idle_policy=settings.idle.policy(),
            rate_card=(card, source) if card is not None else None,
            **batching,
        )

    async def start(self) -> None:
        self._client = await asyncio.to_thread(connect, self.settings)
        if self.idle_policy:
            now = datetime.now(UTC)
            rows = [[c, t, m, now] for c, (t, m) in sorted(self.idle_policy.items())]
            await asyncio.to_thread(
                self._client.insert,
                "idle_policy",
                rows,
                column_names=["workload_class", "threshold", "minutes", "updated_at"],
            )
        if self.rate_card is not None:
            await asyncio.to_thread(write_rate_card, self._client, *self.rate_card)
        # minutes stored before a crash whose hour was never rolled up: find and redo them
        self._dirty_hours |= await asyncio.to_thread(self._stale_hours)

    async def close(self) -> None:
        if self._client is not None:
            if self._dirty_hours:
                await asyncio.to_thread(self._rollup)
            self._client.close()
            self._client = None

    async def write(self, batch: Sequence[Record]) -> None:
        await asyncio.to_thread(self._write_sync, batch)

    async def idle(self) -> None:
        # the last hours a burst touched are rolled up without waiting for more records
        if self._dirty_hours and time.monotonic() - self._last_rollup >= self.rollup_interval_s:
            try:
                await asyncio.to_thread(self._rollup)
            except RetriableError as exc:
                log.warning("%s: rollup deferred: %s", self.name, exc)

    def _write_sync(self, batch: Sequence[Record]) -> None:
        now = datetime.now(UTC)
        rows: dict[str, list[list[Any]]] = defaultdict(list)
        for r in batch:
            if isinstance(r, GpuMinute):
                rows["gpu_minutes"].append(minute_row(r, now))
            elif isinstance(r, SlurmJobEvent):
                rows["allocations"].append(slurm_row(r))
            elif isinstance(r, K8sPodEvent):
                rows["allocations"].append(pod_row(r))
            elif isinstance(r, Alert):
                rows["alerts"].append(alert_row(r))
            elif isinstance(r, AlertDelivery):
                rows["alert_deliveries"].append(delivery_row(r))
            elif isinstance(r, DeadLetter):
                rows["dead_letters"].append(dead_letter_row(r))
            elif isinstance(r, Recommendation):
                rows["recommendations"].append(recommendation_row(r))
            elif isinstance(r, Transfer):
                rows["transfers"].append(transfer_row(r, now))
        columns = {
            "gpu_minutes": MINUTE_COLUMNS,
            "allocations": ALLOCATION_COLUMNS,
            "alerts": ALERT_COLUMNS,
            "alert_deliveries": DELIVERY_COLUMNS,
            "dead_letters": DEAD_LETTER_COLUMNS,
            "recommendations": RECOMMENDATION_COLUMNS,
            "transfers": TRANSFER_COLUMNS,
        }
        for table, table_rows in rows.items():
            self._insert(table, table_rows, columns[table])
        self._dirty_hours |= {r.minute.replace(minute=0) for r in batch if isinstance(r, GpuMinute)}
        if self._dirty_hours and time.monotonic() - self._last_rollup >= self.rollup_interval_s:
            self._rollup()

    def _insert(self, table: str, rows: list[list[Any]], columns: list[str]) -> None:
        from clickhouse_connect.driver.exceptions import DataError

        try:
            self._client.insert(table, rows, column_names=columns)
        except DataError as exc:  # a value the column cannot hold, found while serializing
            raise Rejected(f"{table}: {str(exc).splitlines()[0][:500]}") from exc
        except Exception as exc:
            code = getattr(exc, "code", None)
            if code is not None and int(code) in _DATA_ERROR_CODES:
                raise Rejected(f"{table}: {str(exc).splitlines()[0][:500]}") from exc
            raise as_gpugap_error(exc, self.settings.url) from exc

    def _rollup(self) -> None:
        """Recompute the hourly rollup for every hour touched since the last time."""
        hours, self._dirty_hours = sorted(self._dirty_hours), set()
        try:
            for start, end in _ranges(hours):
                self._client.command(ROLLUP, parameters={"start": start, "end": end})
            days = sorted({h.replace(hour=0) for h in hours})
            for start, end in _ranges(days, step=timedelta(days=1)):
                self._client.command(DAILY, parameters={"start": start, "end": end})
        except Exception as exc:
            self._dirty_hours.update(hours)
            raise as_gpugap_error(exc, self.settings.url) from exc
        self._last_rollup = time.monotonic()

    def _stale_hours(self) -> set[datetime]:
        """Hours (and days) whose rollup is older than the rows under it: work a crash cut
        short after offsets were committed."""
        hours = self._client.query(STALE_HOURS).result_rows
        days = self._client.query(STALE_DAYS).result_rows
        return {row[0].replace(tzinfo=UTC) for row in hours + days}


def _ranges(
    starts: list[datetime], step: timedelta = timedelta(hours=1)
) -> list[tuple[datetime, datetime]]:
    """Consecutive periods merged into [start, end) ranges, so a backlog is one statement."""
    out: list[tuple[datetime, datetime]] = []
    for h in starts:
        if out and out[-1][1] == h:
            out[-1] = (out[-1][0], h + step)
        else:
            out.append((h, h + step))
    return out
