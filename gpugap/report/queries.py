"""The report's SQL, over the views only. Values are server-side parameters ({name:Type});
the only names in the text are view and column names from this module.

The window: whole days come from the daily views, the hours at either edge from the hourly
ones, so "-24h" reads a day of hourly rows however long the history is; a branch the window
does not need is left out of the query. Bounds are widened to whole hours (the views' grain).
"""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

BY_COLUMN = {
    "class": "workload_class",
    "scheduler": "scheduler",
    "team": "team",
    "cluster": "cluster",
    "allocation": "allocation_id",
}
PAST = datetime(1970, 1, 1, tzinfo=UTC)
_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)  # DateTime ends in 2106
_T = "DateTime('UTC')"
METRICS: tuple[str, ...] = ("allocated_gpu_h", "measured_gpu_h", "consumed_gpu_h", "gap_gpu_h")
METRICS += ("unmeasured_gpu_h", "idle_gpu_h")
SUMS = ", ".join(f"sum({m}) AS {m}" for m in METRICS)
_GAP_COLS = "cluster, allocation_id, scheduler, workload_class, owner, team, " + ", ".join(METRICS)
_FREE_COLS = "cluster, node, unallocated_gpu_h, unattributed_gpu_h"


def _hour_floor(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _hour_ceil(t: datetime) -> datetime:
    floor = _hour_floor(t)
    return floor if floor == t else floor + timedelta(hours=1)


def window_parameters(since: datetime | None, until: datetime | None) -> dict[str, Any]:
    """Hour-aligned bounds [since, until), the whole days inside them [d0, d1), and where
    the edge hours end and start again (h0, h1)."""
    h_from = _hour_floor(since) if since else PAST
    h_to = _hour_ceil(until) if until else _FUTURE
    d0 = (h_from + timedelta(days=1) - timedelta(microseconds=1)).date()  # first whole day
    d1 = h_to.date()  # the whole days end at the last midnight inside the window
    if d0 < d1:
        h0 = datetime(d0.year, d0.month, d0.day, tzinfo=UTC)
        h1 = datetime(d1.year, d1.month, d1.day, tzinfo=UTC)
    else:  # not one whole day: all of it from the hourly views
        d0, h0, h1 = d1, h_to, h_to
    return {"since": h_from, "until": h_to, "d0": d0, "d1": d1, "h0": h0, "h1": h1}


def windowed(daily: str, hourly: str, cols: str, p: dict[str, Any]) -> str:
    """``cols`` of the window ``p`` (window_parameters): whole days from ``daily``, the edge
    hours from ``hourly``."""
    parts = []
    if p["d0"] < p["d1"]:
        parts.append(f"SELECT {cols} FROM {daily} WHERE day >= {{d0:Date}} AND day < {{d1:Date}}")
    edges = []
    if p["since"] < p["h0"]:
        edges.append(f"(hour >= {{since:{_T}}} AND hour < {{h0:{_T}}})")
    if p["h1"] < p["until"]:
        edges.append(f"(hour >= {{h1:{_T}}} AND hour < {{until:{_T}}})")
    if edges:
        parts.append(f"SELECT {cols} FROM {hourly} WHERE {' OR '.join(edges)}")
    return " UNION ALL ".join(parts)


class Queries:
    """Every query of one report, for one window. Totals ride along with the ranked rows as
    window functions (one round trip instead of two): the rows are LIMITed, the totals not."""

    def __init__(self, params: dict[str, Any]) -> None:
        gap = windowed("v_capacity_gap_daily", "v_capacity_gap", _GAP_COLS, params)
        free = windowed("v_unallocated", "v_unallocated_hourly", _FREE_COLS, params)
        self.top_allocations = (
            "SELECT cluster, allocation_id, max(scheduler) AS scheduler, max(workload_class) "
            f"AS workload_class, max(owner) AS owner, max(team) AS team, {SUMS} FROM ({gap}) "
            "GROUP BY cluster, allocation_id "
            "ORDER BY gap_gpu_h DESC, cluster, allocation_id LIMIT {top:UInt32}"
        )
        self.top_owners = (
            "SELECT owner, arraySort(arrayFilter(t -> t != '', groupUniqArray(team))) AS teams, "
            f"uniqExact(cluster, allocation_id) AS allocations, {SUMS} FROM ({gap}) "
            "GROUP BY owner ORDER BY gap_gpu_h DESC, owner LIMIT {top:UInt32}"
        )
        # nodes by unattributed use, with the totals of every node (zero rows dropped later)
        self.unallocated = (
            "SELECT cluster, node, unallocated_gpu_h, unattributed_gpu_h, "
            "sum(unallocated_gpu_h) OVER () AS all_unallocated, "
            "sum(unattributed_gpu_h) OVER () AS all_unattributed FROM ("
            "SELECT cluster, node, sum(unallocated_gpu_h) AS unallocated_gpu_h, "
            f"sum(unattributed_gpu_h) AS unattributed_gpu_h FROM ({free}) GROUP BY cluster, node"
            ") ORDER BY unattributed_gpu_h DESC, cluster, node LIMIT {top:UInt32}"
        )
        self._gap = gap

    def by(self, dimension: str) -> str:
        """The gap per value of one dimension (a column name from BY_COLUMN, never input),
        with the number of values (the rest become one 'other' row), the totals over all of
        them, and the data's extent."""
        key = BY_COLUMN[dimension]
        totals = ", ".join(f"sum({m}) OVER () AS all_{m}" for m in METRICS)
        return (
            f"SELECT g.*, count() OVER () AS n, {totals}, e.first_day, e.latest_minute FROM ("
            f"SELECT {key} AS key, {SUMS} FROM ({self._gap}) GROUP BY key"
            ") AS g CROSS JOIN v_data_extent AS e "
            "ORDER BY gap_gpu_h DESC, key LIMIT {top:UInt32}"
        )

    extent = "SELECT first_day, latest_minute FROM v_data_extent"
    metadata = (
        "SELECT cluster, allocation_id, name, gpus_requested, final_state FROM v_allocations "
        "WHERE allocation_id IN {ids:Array(String)}"
    )
    # per user and account, and one row (total = 1) over every job: the median needs them all
    _padded = f"FROM v_slurm_padding WHERE end_time >= {{since:{_T}}} AND end_time < {{until:{_T}}}"
    _padding = (
        "count() AS jobs, quantileExactInclusive(0.5)(limit_ratio) AS median_limit_ratio, "
        f"sum(padding_gpu_h) AS padding_gpu_h {_padded}"
    )
    padding = (
        f"(SELECT 0 AS total, user, account, {_padding} GROUP BY user, account "
        "ORDER BY padding_gpu_h DESC, user, account LIMIT {top:UInt32}) "
        f"UNION ALL (SELECT 1 AS total, '' AS user, '' AS account, {_padding})"
    )
    idle_now = (
        "SELECT cluster, allocation_id, scheduler, workload_class, owner, team, gpus, activity, "
        "last_minute, idle_minutes, idle_threshold, count() OVER () AS n, "
        "sum(gpus) OVER () AS all_gpus FROM v_idle_now "
        "ORDER BY gpus DESC, allocated_gpu_h DESC, cluster, allocation_id LIMIT {top:UInt32}"
    )
    partial_gangs_now = (
        "SELECT cluster, gang_id, owner, team, workload_class, running_pods, pending_pods, "
        "length(nodes) AS node_count, opened_at, idle_gpu_hours, count() OVER () AS n, "
        "sum(idle_gpu_hours) OVER () AS held FROM v_partial_gangs_now "
        "ORDER BY idle_gpu_hours DESC, cluster, gang_id LIMIT {top:UInt32}"
    )
