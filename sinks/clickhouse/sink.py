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

from gpugap.groundfloor.ratecard import RateCard, configured_card, write_rate_card
from gpugap.groundfloor.settings import ClickHouseSettings, Settings
from gpugap.schemas import (
    Alert,
    AlertDelivery,
    DeadLetter,
    GpuMinute,
    K8sPodEvent,
    Record,
    SlurmJobEvent,
)
from gpugap.schemas.errors import RetriableError
from gpugap.schemas.models import (
    NodeCapacity,
    QueueQuota,
    Recommendation,
    SchedulerGpuCount,
    Transfer,
)
from gpugap.schemas.topics import (
    ALERTS,
    DEAD_LETTER,
    DELIVERIES,
    K8S_PODS,
    MINUTES,
    NODE_CAPACITY,
    QUEUE_QUOTAS,
    RECOMMENDATIONS,
    SCHEDULER_GPU_COUNTS,
    SLURM_JOBS,
    TRANSFERS,
)
from gpugap.sinks.base import BatchingSink, Rejected
from gpugap.warehouse.client import as_gpugap_error, connect
from gpugap.warehouse.rows import (
    ALERT_COLUMNS,
    ALLOCATION_COLUMNS,
    DAILY,
    DEAD_LETTER_COLUMNS,
    DELIVERY_COLUMNS,
    MINUTE_COLUMNS,
    NODE_CAPACITY_COLUMNS,
    QUEUE_QUOTA_COLUMNS,
    RECOMMENDATION_COLUMNS,
    ROLLUP,
    SCHEDULER_GPU_COUNT_COLUMNS,
    STALE_DAYS,
    STALE_HOURS,
    TEAM_DAILY,
    TRANSFER_COLUMNS,
    alert_row,
    dead_letter_row,
    delivery_row,
    minute_row,
    node_capacity_row,
    pod_row,
    queue_quota_row,
    recommendation_row,
    scheduler_gpu_count_row,
    slurm_row,
    transfer_row,
)

log = logging.getLogger(__name__)

# ClickHouse codes meaning "this data is wrong", as opposed to "try again later"
_DATA_ERROR_CODES = {6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 321, 386, 457}


class ClickHouseSink(BatchingSink):
    name = "clickhouse"
    topics = (
        *(MINUTES, SLURM_JOBS, K8S_PODS, ALERTS, DELIVERIES, DEAD_LETTER, RECOMMENDATIONS),
        TRANSFERS,  # boundary transfers (docs/cost.md)
        NODE_CAPACITY,  # stranded GPUs (docs/architecture.md#stranded-gpus)
        QUEUE_QUOTAS,  # quota held but unused
        SCHEDULER_GPU_COUNTS,  # the scheduler's own count: gpugap checks itself
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
            elif isinstance(r, NodeCapacity):
                rows["node_capacity"].append(node_capacity_row(r, now))
            elif isinstance(r, QueueQuota):
                rows["queue_quotas"].append(queue_quota_row(r, now))
            elif isinstance(r, SchedulerGpuCount):
                rows["scheduler_gpu_counts"].append(scheduler_gpu_count_row(r, now))
        columns = {
            "gpu_minutes": MINUTE_COLUMNS,
            "allocations": ALLOCATION_COLUMNS,
            "alerts": ALERT_COLUMNS,
            "alert_deliveries": DELIVERY_COLUMNS,
            "dead_letters": DEAD_LETTER_COLUMNS,
            "recommendations": RECOMMENDATION_COLUMNS,
            "transfers": TRANSFER_COLUMNS,
            "node_capacity": NODE_CAPACITY_COLUMNS,
            "queue_quotas": QUEUE_QUOTA_COLUMNS,
            "scheduler_gpu_counts": SCHEDULER_GPU_COUNT_COLUMNS,
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
                self._client.command(TEAM_DAILY, parameters={"start": start, "end": end})
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
