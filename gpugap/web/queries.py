"""The page's fixed, named queries over the warehouse views. The browser names one of them and
gives values (``gpugap.web.params``); the SQL text is this module's constants only, and every
value is a server-side parameter ({name:Type}). The queries are the Grafana dashboard's
(deploy/grafana/dashboards/gpugap.json) without its macros.

Totals over a window read whole days from the daily views and the edge hours from the hourly
ones (as the report does); the charts over time read per-minute rows (gpu_minutes) up to 6 hours,
hourly rows up to 14 days, daily beyond: every range draws a line (``buckets``).
"""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.cost import report as cost
from gpugap.job.queries import Query as JobQuery
from gpugap.report.queries import window_parameters, windowed
from gpugap.web.params import AllocationKey, Filters

_T = "DateTime('UTC')"
BY_COLUMN = {"class": "workload_class", "scheduler": "scheduler", "team": "team"}
MINUTES_UP_TO = timedelta(hours=6)  # shorter ranges chart per-minute rows (gpu_minutes)
HOURLY_UP_TO = timedelta(days=14)  # longer ranges chart daily rows
MAX_POINTS = 200  # buckets per chart at most
MAX_GROUPS = 8  # groups per stacked chart; the rest are one "other"
MAX_TIMELINE_ROWS = 20_000  # per-GPU hours of one allocation (64 GPUs for two weeks)
SUMS = (
    "sum(allocated_gpu_h) AS allocated_gpu_h, sum(measured_gpu_h) AS measured_gpu_h, "
    "sum(consumed_gpu_h) AS consumed_gpu_h, sum(gap_gpu_h) AS gap_gpu_h, "
    "sum(unmeasured_gpu_h) AS unmeasured_gpu_h, sum(idle_gpu_h) AS idle_gpu_h"
)
_GAP_COLS = (
    "cluster, allocation_id, scheduler, workload_class, owner, team, allocated_gpu_h, "
    "measured_gpu_h, consumed_gpu_h, gap_gpu_h, unmeasured_gpu_h, idle_gpu_h"
)
_ARR = "Array(String)"
# cluster/team/class filters: an empty list is "all"
CLUSTER = f"(empty({{clusters:{_ARR}}}) OR has({{clusters:{_ARR}}}, cluster))"
TEAM = f"(empty({{teams:{_ARR}}}) OR has({{teams:{_ARR}}}, team))"
CLASS = f"(empty({{classes:{_ARR}}}) OR has({{classes:{_ARR}}}, workload_class))"
FILTER = f"{CLUSTER} AND {TEAM} AND {CLASS}"


@dataclass(frozen=True)
class Query:
    sql: str
    params: dict[str, Any]


def bind(sql: str, values: dict[str, Any]) -> Query:
    """The query with the values its text names (and only those)."""
    names = set(re.findall(r"\{(\w+):", sql))
    return Query(sql, {k: v for k, v in values.items() if k in names})


def window(daily: str, hourly: str, cols: str, f: Filters) -> tuple[str, dict[str, Any]]:
    """Rows of [since, until) widened to whole hours: whole days from ``daily``, the edge hours
    from ``hourly``."""
    p = window_parameters(f.since, f.until)
    return windowed(daily, hourly, cols, p), {**f.bound(), **p}


@dataclass(frozen=True)
class Bucket:
    """A time chart's bucket: the grain it reads ("minute": gpu_minutes, "hour": the hourly
    views, "day": the daily views), its length in seconds, and where its first one starts."""

    grain: str
    step_s: int
    origin: int  # epoch seconds: the range's start, down to the grain's start

    @property
    def step_h(self) -> float:
        return self.step_s / 3600

    @property
    def label(self) -> str:
        """How the chart names it: "1-minute", "5-minute", "1-hour", "2-hour", "1-day"."""
        for unit, s in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if self.step_s % s == 0:
                return f"{self.step_s // s}-{unit}"
        return f"{self.step_s}-second"  # pragma: no cover (every step is whole minutes)

    def grid(self, until: datetime) -> list[int]:
        """Every bucket's start, from ``origin`` to before ``until`` (epoch seconds)."""
        end = int(until.timestamp())
        return list(range(self.origin, end, self.step_s))


def buckets(f: Filters) -> Bucket:
    """The time charts' bucket for the range: per minute up to MINUTES_UP_TO (1 minute, or 5
    beyond MAX_POINTS minutes), from gpu_minutes; per hour (or a few) up to HOURLY_UP_TO, from
    the hourly views; per day (or a few) beyond, from the daily views. At most MAX_POINTS."""
    span = f.until - f.since
    since = int(f.since.timestamp())
    if span <= MINUTES_UP_TO:
        step_min = 1 if span <= timedelta(minutes=MAX_POINTS) else 5
        return Bucket("minute", 60 * step_min, since - since % 60)
    span_h = max(1, int(span.total_seconds() // 3600))
    if span <= HOURLY_UP_TO:
        return Bucket("hour", 3600 * max(1, -(-span_h // MAX_POINTS)), since - since % 3600)
    step_d = max(1, -(-span_h // (24 * MAX_POINTS)))
    return Bucket("day", 86400 * step_d, since - since % 86400)


def _series_source(f: Filters) -> tuple[str, str, dict[str, Any]]:
    """(the bucket's start as a DateTime, the rows' range, its values) for the bucket's grain.
    Buckets count from the bound origin, so the page's grid (Bucket.grid) is the query's."""
    b = buckets(f)
    bucket = (
        "toDateTime({origin:UInt32} + intDiv(toUInt32(%s) - {origin:UInt32}, {step:UInt32}) "
        "* {step:UInt32}, 'UTC')"
    )
    extra = {"origin": b.origin, "step": b.step_s}
    if b.grain == "minute":
        # the hour leads gpu_minutes' key: these read the range's hours only (at most 7)
        where = (
            f"toStartOfHour(minute) >= toStartOfHour({{since:{_T}}}) "
            f"AND toStartOfHour(minute) < {{until:{_T}}} "
            f"AND minute >= toStartOfMinute({{since:{_T}}}) AND minute < {{until:{_T}}}"
        )
        return bucket % "minute", where, extra
    if b.grain == "hour":
        where = f"hour >= toStartOfHour({{since:{_T}}}) AND hour < {{until:{_T}}}"
        return bucket % "hour", where, extra
    where = f"day >= toDate({{since:{_T}}}) AND day <= toDate({{until:{_T}}} - 1)"
    return bucket % "toDateTime(day, 'UTC')", where, extra


# per minute, the quantities the hourly rollup sums (gpugap.warehouse.rows.ROLLUP) and the views
# divide by 3600: GPU-hours, so a range's minutes add up to its hours
_MINUTE_GAP = (
    "sum(allocated_ms) / 3.6e6 AS allocated, sum(consumed_ms) / 3.6e6 AS consumed, "
    "(sum(allocated_ms) - sum(allocated_ms - least(measured_ms, allocated_ms))) / 3.6e6 "
    "- sum(consumed_ms) / 3.6e6 AS gap, "
    "sum(allocated_ms - least(measured_ms, allocated_ms)) / 3.6e6 AS unmeasured"
)
_VIEW_GAP = (
    "sum(allocated_gpu_h) AS allocated, sum(consumed_gpu_h) AS consumed, sum(gap_gpu_h) AS gap, "
    "sum(unmeasured_gpu_h) AS unmeasured"
)


def timeseries(f: Filters) -> Query:
    """Allocated, consumed and gap per bucket and group (the ``by`` column)."""
    t, where, extra = _series_source(f)
    grain = buckets(f).grain
    key = BY_COLUMN[f.by]  # a fixed column name, chosen by a validated value
    if grain == "minute":
        source, sums = "gpu_minutes FINAL", _MINUTE_GAP
        where += " AND allocation_id != ''"
    else:
        source = "v_capacity_gap" if grain == "hour" else "v_capacity_gap_daily"
        sums = _VIEW_GAP
    sql = (
        f"SELECT {t} AS t, {key} AS g, {sums} FROM {source} WHERE {where} AND {FILTER} "
        "GROUP BY t, g ORDER BY t, g"
    )
    return bind(sql, {**f.bound(), **extra})


def unallocated(f: Filters) -> Query:
    """Capacity nobody held, and use on it, per bucket (the cluster filter only)."""
    t, where, extra = _series_source(f)
    grain = buckets(f).grain
    if grain == "minute":
        source = "gpu_minutes FINAL"
        sums = (
            "sum(unallocated_ms) / 3.6e6 AS unallocated, sum(consumed_ms) / 3.6e6 AS unattributed"
        )
        where += " AND allocation_id = ''"
    else:
        source = "v_unallocated_hourly" if grain == "hour" else "v_unallocated"
        sums = "sum(unallocated_gpu_h) AS unallocated, sum(unattributed_gpu_h) AS unattributed"
    sql = f"SELECT {t} AS t, {sums} FROM {source} WHERE {where} AND {CLUSTER} GROUP BY t ORDER BY t"
    return bind(sql, {**f.bound(), **extra})


def within_data(f: Filters, first: int | None, latest: int | None) -> Filters | None:
    """The range less what lies before the first stored day or after the latest stored minute
    (the time charts' x axis and bucket); None where the range holds no data at all."""
    if not first or not latest:
        return None
    since = max(f.since, datetime.fromtimestamp(first, UTC))
    until = min(f.until, datetime.fromtimestamp(latest + 60, UTC))
    return replace(f, since=since, until=until) if since < until else None


def summary(f: Filters) -> Query:
    gap, p = window("v_capacity_gap_daily", "v_capacity_gap", _GAP_COLS, f)
    free, _ = window(
        "v_unallocated", "v_unallocated_hourly",
        "cluster, unallocated_gpu_h, unattributed_gpu_h", f,
    )  # fmt: skip
    sql = (
        f"SELECT * FROM (SELECT {SUMS}, uniqExact(cluster, allocation_id) AS allocations "
        f"FROM ({gap}) WHERE {FILTER}) AS g CROSS JOIN (SELECT sum(unallocated_gpu_h) AS "
        "unallocated_gpu_h, sum(unattributed_gpu_h) AS unattributed_gpu_h "
        f"FROM ({free}) WHERE {CLUSTER}) AS u"
    )
    return bind(sql, p)


def split(f: Filters) -> Query:
    """Slurm vs Kubernetes by workload class."""
    gap, p = window("v_capacity_gap_daily", "v_capacity_gap", _GAP_COLS, f)
    sql = (
        f"SELECT workload_class, scheduler, {SUMS} FROM ({gap}) WHERE {FILTER} "
        "GROUP BY workload_class, scheduler ORDER BY workload_class, scheduler"
    )
    return bind(sql, p)


def top_waste(f: Filters) -> Query:
    gap, p = window("v_capacity_gap_daily", "v_capacity_gap", _GAP_COLS, f)
    sql = (
        "WITH top AS (SELECT cluster, allocation_id, any(scheduler) AS any_scheduler, "
        "any(workload_class) AS any_class, any(team) AS any_team, any(owner) AS any_owner, "
        f"{SUMS} FROM ({gap}) WHERE {FILTER} GROUP BY cluster, allocation_id "
        "ORDER BY gap_gpu_h DESC, cluster, allocation_id LIMIT {limit:UInt32}) "
        "SELECT t.cluster AS cluster, t.allocation_id AS allocation_id, a.name AS name, "
        "t.any_scheduler AS scheduler, t.any_class AS workload_class, t.any_team AS team, "
        "t.any_owner AS owner, a.gpus_requested AS gpus, t.allocated_gpu_h AS allocated_gpu_h, "
        "t.consumed_gpu_h AS consumed_gpu_h, t.gap_gpu_h AS gap_gpu_h, "
        "t.unmeasured_gpu_h AS unmeasured_gpu_h FROM top AS t LEFT JOIN (SELECT cluster, "
        "allocation_id, name, gpus_requested FROM v_allocations WHERE allocation_id IN "
        "(SELECT allocation_id FROM top)) AS a "
        "ON a.cluster = t.cluster AND a.allocation_id = t.allocation_id "
        "ORDER BY gap_gpu_h DESC, cluster, allocation_id"
    )
    return bind(sql, p)


def idle_now(f: Filters) -> Query:
    sql = (
        "SELECT cluster, allocation_id, scheduler, workload_class, team, owner, gpus, since, "
        f"last_minute, activity, allocated_gpu_h FROM v_idle_now WHERE {FILTER} "
        "ORDER BY gpus DESC, since, cluster, allocation_id LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def partial_gangs(f: Filters) -> Query:
    sql = (
        "SELECT cluster, gang_id, team, owner, workload_class, running_pods, pending_pods, "
        "gpus, opened_at, idle_gpu_hours, message FROM v_partial_gangs_now "
        f"WHERE {FILTER} ORDER BY idle_gpu_hours DESC, cluster, gang_id LIMIT {{limit:UInt32}}"
    )
    return bind(sql, f.bound())


def alerts(f: Filters) -> Query:
    sql = (
        "SELECT kind, state, cluster, scheduler, allocation_id, gang_id, team, owner, "
        "workload_class, gpus, opened_at, updated_at, idle_gpu_hours, message "
        f"FROM v_alerts_open WHERE {FILTER} "
        "ORDER BY opened_at DESC, alert_id LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def padding(f: Filters) -> Query:
    """Slurm jobs that ended in the range, most padded first (team filters the account)."""
    sql = (
        "SELECT cluster, allocation_id, name, user, account, partition, gpus_requested, "
        "time_limit_s / 3600 AS limit_h, elapsed_s / 3600 AS elapsed_h, limit_ratio, "
        "padding_gpu_h, final_state, end_time, count() OVER () AS jobs, "
        "sum(padding_gpu_h) OVER () AS all_padding_gpu_h FROM v_slurm_padding "
        f"WHERE end_time >= {{since:{_T}}} AND end_time < {{until:{_T}}} AND {CLUSTER} "
        f"AND (empty({{teams:{_ARR}}}) OR has({{teams:{_ARR}}}, account)) "
        "ORDER BY padding_gpu_h DESC, cluster, allocation_id LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def queue_wait(f: Filters) -> Query:
    """Work that started in the range, by queue (Slurm partition, Kubernetes namespace): how
    long it waited for GPUs (v_queue_wait; a gang waits as one)."""
    sql = (
        "SELECT cluster, queue, any(scheduler) AS scheduler, count() AS jobs, "
        "quantileExact(0.5)(wait_s) / 60 AS p50_wait_min, "
        "quantileExact(0.95)(wait_s) / 60 AS p95_wait_min, avg(wait_s) / 60 AS mean_wait_min, "
        "sum(gpu_h_waited) AS waited_gpu_h, sum(held_gpu_h) AS held_gpu_h "
        f"FROM v_queue_wait WHERE start_time >= {{since:{_T}}} AND start_time < {{until:{_T}}} "
        f"AND {FILTER} GROUP BY cluster, queue "
        "ORDER BY waited_gpu_h DESC, cluster, queue LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def lost_work(f: Filters) -> Query:
    """Work lost (v_lost_work: runs preempted, requeued, on a failed node, evicted or
    OOM-killed) that ended in the range, by cause and queue, most lost first."""
    sql = (
        "SELECT cause, cluster, queue, any(scheduler) AS scheduler, count() AS runs, "
        "sum(lost_gpu_h) AS lost_gpu_h, sum(consumed_gpu_h) AS consumed_gpu_h "
        f"FROM v_lost_work WHERE end_time >= {{since:{_T}}} AND end_time < {{until:{_T}}} "
        f"AND {FILTER} GROUP BY cause, cluster, queue "
        "ORDER BY lost_gpu_h DESC, cause, cluster, queue LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def stranded(f: Filters) -> Query:
    """Who stranded free GPUs in the range (v_stranded_by_allocation: CPUs or memory beyond
    their GPUs' share of a node), most first; a CPU-only job or pod has no GPU of its own."""
    sql = (
        "SELECT cluster, allocation_id, any(sched) AS scheduler, any(team_name) AS team, "
        "any(class) AS workload_class, uniqExact(node) AS nodes, "
        "sumIf(stranded_gpu_h, cause = 'cpu') AS by_cpu_gpu_h, "
        "sumIf(stranded_gpu_h, cause = 'memory') AS by_memory_gpu_h "
        "FROM (SELECT s.cluster AS cluster, s.allocation_id AS allocation_id, s.node AS node, "
        "s.cause AS cause, s.stranded_gpu_h AS stranded_gpu_h, a.scheduler AS sched, "
        "a.team AS team_name, a.workload_class AS class "
        "FROM v_stranded_by_allocation AS s LEFT JOIN v_allocations AS a "
        "ON a.cluster = s.cluster AND a.allocation_id = s.allocation_id "
        f"WHERE s.time >= {{since:{_T}}} AND s.time < {{until:{_T}}} AND {FILTER}) "
        "GROUP BY cluster, allocation_id "
        "ORDER BY by_cpu_gpu_h + by_memory_gpu_h DESC, cluster, allocation_id "
        "LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def spread_work(f: Filters) -> Query:
    """Runs and gangs that held GPUs on more nodes than they needed (v_spread_work) on a day
    of the range, most GPU-hours first."""
    sql = (
        "SELECT cluster, allocation_id, scheduler, team, workload_class, nodes, min_nodes, gpus, "
        "allocated_gpu_h, consumed_gpu_h FROM v_spread_work "
        "WHERE last_day >= toDate({since:DateTime('UTC')}) "
        "AND first_day <= toDate({until:DateTime('UTC')} - INTERVAL 1 SECOND) "
        f"AND {FILTER} ORDER BY allocated_gpu_h DESC, cluster, allocation_id "
        "LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


def queue_quotas(f: Filters) -> Query:
    """Each queue's entitlement in the range beside what its work held, consumed and waited
    (v_queue_quota_hourly), most unused first. Queues have no team or class: the cluster
    filter only."""
    sql = (
        "SELECT cluster, kind, namespace, queue, max(parent) AS parent, "
        "sum(entitled_gpu_h) AS entitled_gpu_h, sum(allocated_gpu_h) AS held_gpu_h, "
        "sum(consumed_gpu_h) AS consumed_gpu_h, sum(unused_gpu_h) AS unused_gpu_h, "
        "sum(borrowed_gpu_h) AS borrowed_gpu_h, sum(lent_gpu_h) AS lent_gpu_h, "
        "sum(pending_workload_h) AS pending_workload_h, "
        "sum(waited_gpu_h) AS waited_gpu_h FROM v_queue_quota_hourly "
        f"WHERE hour >= {{since:{_T}}} AND hour < {{until:{_T}}} AND {CLUSTER} "
        "GROUP BY cluster, kind, namespace, queue "
        "ORDER BY unused_gpu_h DESC, cluster, kind, namespace, queue LIMIT {limit:UInt32}"
    )
    return bind(sql, f.bound())


# --- cost: `gpugap report --cost`'s own queries (gpugap.cost.report) with the page's filters
# on the columns the cost views carry: v_cost_hourly has cluster, team and class (unallocated
# capacity has neither team nor class, so those filters leave it out); v_transfers has cluster
# and team, no workload class (the class filter does not narrow egress)
MAX_COST_ROWS = 1000  # clusters, or cluster x direction for transfers
COST_FILTERED = {"cost_rows": ("cluster", "team", "class"), "egress": ("cluster", "team")}
_ON = {"cluster": ("clusters", "cluster"), "team": ("teams", "team"),
       "class": ("classes", "workload_class")}  # fmt: skip


def _narrowing(alias: str, filters: tuple[str, ...]) -> str:
    """The page's filters on ``filters`` of the cost query's columns (alias ``alias``)."""
    return "".join(
        f" AND (empty({{{p}:{_ARR}}}) OR has({{{p}:{_ARR}}}, {alias}.{col}))"
        for p, col in (_ON[name] for name in filters)
    )


COST_CARD = Query(cost.CARD, {})
_LIMIT = f" LIMIT {MAX_COST_ROWS}"
_COST_CLUSTERS = cost.by_cluster_sql(_narrowing("c", COST_FILTERED["cost_rows"])) + _LIMIT
_COST_TRANSFERS = cost.transfers_sql(_narrowing("t", COST_FILTERED["egress"])) + _LIMIT


def _cost_window(f: Filters) -> dict[str, Any]:
    """The report's window for [since, until): whole hours (gpugap.cost.report.build_cost)."""
    p = window_parameters(f.since, f.until)
    return {**f.bound(), "since": p["since"], "until": p["until"]}


def cost_clusters(f: Filters) -> Query:
    """Per cluster: GPU-hours and their cost (``gpugap report --cost``'s BY_CLUSTER)."""
    return bind(_COST_CLUSTERS, _cost_window(f))


def cost_transfers(f: Filters) -> Query:
    """Per cluster and direction: GiB across the boundary and its cost (its TRANSFERS)."""
    return bind(_COST_TRANSFERS, _cost_window(f))


EXTENT = Query("SELECT first_day, latest_minute FROM v_data_extent", {})
OPTIONS = Query(
    "SELECT arraySort(groupUniqArray(200)(cluster)), "
    "arraySort(arrayFilter(x -> x != '', groupUniqArray(200)(team))), "
    "arraySort(arrayFilter(x -> x != '', groupUniqArray(200)(workload_class))) "
    "FROM v_capacity_gap_daily",
    {},
)


def allocation_timeline(key: AllocationKey) -> Query:
    """One allocation's GPUs hour by hour (its last 31 days at most) and its metadata."""
    match = "cluster = {cluster:String} AND allocation_id = {allocation:String}"
    sql = (
        f"WITH (SELECT (min(day), max(day)) FROM v_capacity_gap_daily WHERE {match}) AS span "
        "SELECT hour, gpu_uuid, node, allocated_gpu_h, measured_gpu_h, consumed_gpu_h, "
        "gap_gpu_h FROM v_capacity_gap "
        "WHERE hour >= toDateTime(greatest(span.1, span.2 - 30), 'UTC') "
        f"AND hour < toDateTime(span.2 + 1, 'UTC') AND {match} "
        f"ORDER BY gpu_uuid, hour LIMIT {MAX_TIMELINE_ROWS}"
    )
    return bind(sql, {"cluster": key.cluster, "allocation": key.allocation_id})


def allocation_meta(key: AllocationKey) -> Query:
    sql = (
        "SELECT cluster, allocation_id, scheduler, name, owner, team, workload_class, "
        "gpus_requested, time_limit_s, start_time, end_time, final_state FROM v_allocations "
        "WHERE cluster = {cluster:String} AND allocation_id = {allocation:String} LIMIT 1"
    )
    return bind(sql, {"cluster": key.cluster, "allocation": key.allocation_id})


def job_query(q: JobQuery) -> Query:
    """One of ``gpugap job``'s fixed queries (gpugap.job.queries: its text constant,
    its values bound), as the page runs it."""
    return Query(q.sql, q.params)


#: the API's names for the queries that take the page's filters
FILTERED: dict[str, Callable[[Filters], Query]] = {
    "summary": summary,
    "timeseries": timeseries,
    "split": split,
    "top_waste": top_waste,
    "idle_now": idle_now,
    "partial_gangs": partial_gangs,
    "alerts": alerts,
    "unallocated": unallocated,
    "padding": padding,
    "queue_wait": queue_wait,
    "lost_work": lost_work,
    "stranded": stranded,
    "spread_work": spread_work,
    "queue_quotas": queue_quotas,
}


def epoch(value: Any) -> Any:
    """JSON for one value: times as epoch seconds (UTC), floats rounded, the rest as is."""
    from datetime import date

    if isinstance(value, datetime):
        v = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(v.timestamp())
    if isinstance(value, date):
        return int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp())
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, (list, tuple)):
        return [epoch(v) for v in value]
    return value
