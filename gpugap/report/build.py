"""Build the report from the warehouse views only (the SQL a BI tool would run; queries.py).

The "now" sections (idle allocations, partial gangs) are the latest state of the data,
whatever the window: they answer "what should someone look at right now".
"""

from __future__ import annotations

import time
from datetime import UTC, date, datetime
from typing import Any

from gpugap.report import beyond, drift, lost
from gpugap.report.models import (
    DIMENSIONS,
    AllocationWaste,
    Capacity,
    Gap,
    IdleAllocation,
    IdleNow,
    NodeUse,
    OwnerWaste,
    Padding,
    PaddingRow,
    PartialGang,
    PartialGangsNow,
    Report,
    Window,
)
from gpugap.report.queries import BY_COLUMN, METRICS, PAST, Queries, window_parameters
from gpugap.schemas.errors import ConfigError
from gpugap.warehouse.client import run_query


def _utc(t: datetime | date | None) -> datetime | None:
    """ClickHouse answers naive UTC times; the epoch is its 'no data' (max of nothing)."""
    if t is None:
        return None
    if not isinstance(t, datetime):
        t = datetime(t.year, t.month, t.day)
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return None if t <= PAST else t


def _aware(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _h(value: Any) -> float:
    """GPU-hours to 4 decimals (0.36 s): float sums stop showing their noise."""
    return round(float(value or 0.0), 4)


def _gap(key: str, row: dict[str, Any]) -> Gap:
    v = {m: _h(row[m]) for m in METRICS}
    measured = v["measured_gpu_h"]
    pct = round(100 * v["gap_gpu_h"] / measured, 2) if measured > 0 else None
    return Gap(key=key, gap_pct=pct, **v)


def _other(totals: Gap, rows: list[Gap], count: int) -> Gap:
    rest = {m: getattr(totals, m) - sum(getattr(r, m) for r in rows) for m in METRICS}
    return _gap(f"other ({count})", rest)


class _Runner:
    """Runs the queries with the window's parameters and keeps each one's time (bench)."""

    def __init__(self, client: Any, params: dict[str, Any], timings: dict[str, float] | None):
        self.client, self.params, self.timings = client, params, timings

    def rows(self, name: str, sql: str, **extra: Any) -> list[dict[str, Any]]:
        start = time.perf_counter()
        result = run_query(self.client, sql, {**self.params, **extra})
        if self.timings is not None:
            self.timings[name] = (time.perf_counter() - start) * 1000
        return list(result.named_results())


def build_report(
    client: Any,
    since: datetime | None = None,
    until: datetime | None = None,
    by: str = "class",
    top: int = 10,
    *,
    timings: dict[str, float] | None = None,
) -> Report:
    """The report for [since, until) (None: unbounded; a naive time is UTC) from a
    clickhouse-connect client. ``timings``, if given, receives each query's milliseconds."""
    since, until = _aware(since), _aware(until)
    if by not in BY_COLUMN:
        raise ConfigError(f"unknown --by {by!r}: choose one of {', '.join(DIMENSIONS)}")
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    if since is not None and until is not None and since >= until:
        raise ConfigError(f"empty or reversed time range: {since} is not before {until}")
    params = window_parameters(since, until)
    sql = Queries(params)
    q = _Runner(client, {**params, "top": top}, timings)

    groups = q.rows(f"gap by {by}, totals, extent", sql.by(by))
    # no data in the window: no row to carry the totals and the extent
    first = groups[0] if groups else {**q.rows("data extent", sql.extent)[0], "n": 0}
    totals = _gap("all", {m: first.get(f"all_{m}", 0.0) for m in METRICS})
    breakdown = [_gap(str(g["key"]), g) for g in groups]
    if first["n"] > len(groups):
        breakdown.append(_other(totals, breakdown, first["n"] - len(groups)))
    allocs = q.rows("top allocations", sql.top_allocations)
    owners = q.rows("top owners", sql.top_owners)
    idle = q.rows("idle now", sql.idle_now)
    ids = sorted({r["allocation_id"] for r in allocs + idle})
    found = q.rows("metadata", sql.metadata, ids=ids) if ids else []
    meta = {(m["cluster"], m["allocation_id"]): m for m in found}
    nodes = q.rows("unallocated, nodes", sql.unallocated)
    free = nodes[0] if nodes else {"all_unallocated": 0.0, "all_unattributed": 0.0}
    padded = q.rows("padding", sql.padding)
    padding = next(r for r in padded if r["total"])
    padding_rows = sorted(
        (r for r in padded if not r["total"]),
        key=lambda r: (-r["padding_gpu_h"], r["user"], r["account"]),
    )
    gangs = q.rows("partial gangs now", sql.partial_gangs_now)
    lost_rows = q.rows("lost work", lost.QUERY)

    def about(r: dict[str, Any]) -> dict[str, Any]:
        return meta.get((r["cluster"], r["allocation_id"]), {})

    unallocated = _h(free["all_unallocated"])
    capacity = _h(totals.allocated_gpu_h + unallocated)
    return Report(
        window=Window(
            since=since,
            until=until,
            hour_from=params["since"] if since else None,
            hour_to=params["until"] if until else None,
            data_from=_utc(first["first_day"]),
            latest_minute=_utc(first["latest_minute"]),
        ),
        by=by,  # one of BY_COLUMN, checked above
        top=top,
        totals=totals,
        breakdown=breakdown,
        top_allocations=[
            AllocationWaste(
                rank=i,
                cluster=r["cluster"],
                allocation_id=r["allocation_id"],
                name=about(r).get("name") or "",
                scheduler=r["scheduler"],
                workload_class=r["workload_class"],
                owner=r["owner"],
                team=r["team"],
                gpus_requested=about(r).get("gpus_requested"),
                final_state=about(r).get("final_state"),
                gap=_gap(r["allocation_id"], r),
            )
            for i, r in enumerate(allocs, 1)
        ],
        top_owners=[
            OwnerWaste(
                rank=i,
                owner=r["owner"],
                teams=list(r["teams"]),
                allocations=r["allocations"],
                gap=_gap(r["owner"], r),
            )
            for i, r in enumerate(owners, 1)
        ],
        capacity=Capacity(
            capacity_gpu_h=capacity,
            allocated_gpu_h=totals.allocated_gpu_h,
            unallocated_gpu_h=unallocated,
            unallocated_pct=round(100 * unallocated / capacity, 2) if capacity > 0 else None,
            unattributed_gpu_h=_h(free["all_unattributed"]),
        ),
        unattributed_nodes=[
            NodeUse(
                cluster=r["cluster"],
                node=r["node"],
                unallocated_gpu_h=_h(r["unallocated_gpu_h"]),
                unattributed_gpu_h=_h(r["unattributed_gpu_h"]),
            )
            for r in nodes
            if r["unattributed_gpu_h"] > 0
        ],
        slurm_padding=Padding(
            jobs=padding["jobs"],
            median_limit_ratio=_ratio(padding["median_limit_ratio"]) if padding["jobs"] else None,
            padding_gpu_h=_h(padding["padding_gpu_h"]),
            rows=[
                PaddingRow(
                    user=r["user"],
                    account=r["account"],
                    jobs=r["jobs"],
                    median_limit_ratio=_ratio(r["median_limit_ratio"]),
                    padding_gpu_h=_h(r["padding_gpu_h"]),
                )
                for r in padding_rows
            ],
        ),
        idle_now=IdleNow(
            allocations=idle[0]["n"] if idle else 0,
            gpus=idle[0]["all_gpus"] if idle else 0,
            rows=[
                IdleAllocation(
                    cluster=r["cluster"],
                    allocation_id=r["allocation_id"],
                    name=about(r).get("name") or "",
                    scheduler=r["scheduler"],
                    workload_class=r["workload_class"],
                    owner=r["owner"],
                    team=r["team"],
                    gpus=r["gpus"],
                    activity=round(float(r["activity"]), 4),
                    last_minute=_utc(r["last_minute"]) or PAST,
                    idle_minutes=r["idle_minutes"],
                    idle_threshold=round(float(r["idle_threshold"]), 4),
                )
                for r in idle
            ],
        ),
        partial_gangs_now=PartialGangsNow(
            gangs=gangs[0]["n"] if gangs else 0,
            held_gpu_h=_h(gangs[0]["held"]) if gangs else 0.0,
            rows=[
                PartialGang(
                    cluster=r["cluster"],
                    gang_id=r["gang_id"],
                    owner=r["owner"],
                    team=r["team"],
                    workload_class=r["workload_class"],
                    running_pods=r["running_pods"],
                    pending_pods=r["pending_pods"],
                    nodes=r["node_count"],
                    opened_at=_utc(r["opened_at"]) or PAST,
                    held_gpu_h=_h(r["idle_gpu_hours"]),
                )
                for r in gangs
            ],
        ),
        lost_work=lost.lost_work(lost_rows),
        beyond_idle=beyond.beyond_idle(q),
        scheduler_drift=drift.scheduler_drift(q),
    )


def _ratio(value: Any) -> float:
    return round(float(value or 0.0), 3)
