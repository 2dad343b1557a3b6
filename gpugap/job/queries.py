"""The SQL of ``gpugap job`` and the page's job report: fixed text, every value a server-side
parameter ({name:Type}); the only names in the text are views, tables and columns.

What one report reads, for one allocation: its row of ``v_allocations`` (found by the id as
a person gives it: ``id_match``), its days of ``v_capacity_gap_daily`` (the totals, as
``v_top_waste`` sums them), its hours of ``gpu_hours`` (per GPU: the rollup the views read,
with the hourly peaks of activity and memory ``gpugap recommend`` fits on), its minutes of
``gpu_minutes`` (utilisation and memory over time, idle stretches), its row of
``v_slurm_padding`` and of ``v_queue_wait``, its Slurm family's ended jobs (the ``--time``
rule's sample) and the open recommendations for its family. Every read is bounded by the
allocation's own days or hours, and every answer by a LIMIT.
"""

# ruff: noqa: S608  (the SQL is this module's constants only; values are bound)
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugap.recommend.capacity_queries import ESTATE, NODES
from gpugap.warehouse.rows import WHOLE_MINUTE_HELD

MAX_ID_LEN = 256
MAX_CANDIDATES = 20  # listed when an id is ambiguous
MAX_GPUS = 1024  # per-GPU rows of one allocation
MAX_POINTS = 720  # per GPU over time
MIN_POINTS = 24
MAX_SERIES_POINTS = 24_000  # every GPU's together
MAX_STRETCHES = 10  # the longest idle stretches listed
MIN_STRETCH_MIN = 10  # shorter idle stretches are counted, not listed
MAX_EPISODES = 100_000  # idle stretch lengths read for the culling rule
MAX_FAMILY_JOBS = 10_000
MAX_RECOMMENDATIONS = 10
_T = "DateTime('UTC')"
_PRINTABLE = re.compile(r"^[^\x00-\x20\x7f]+$")  # no spaces, no control characters
_ONE = "cluster = {cluster:String} AND allocation_id = {alloc:String}"


@dataclass(frozen=True)
class Query:
    sql: str
    params: dict[str, Any]


def id_form(ident: str) -> str:
    """How an id reads: 'allocation' (slurm/<cluster>/<job>[#run], k8s/<cluster>/<uid>),
    'pod' (namespace/pod-name) or 'bare' (a Slurm job id 12345, an array task 12345_7, a run
    12345#1, a pod UID, a pod's name in any namespace). ValueError for what is none of them."""
    if not 0 < len(ident) <= MAX_ID_LEN or not _PRINTABLE.match(ident):
        raise ValueError(f"an id is 1 to {MAX_ID_LEN} printable characters without spaces")
    if ident.startswith(("slurm/", "k8s/")):
        return "allocation"
    parts = ident.split("/")
    if len(parts) == 2 and all(parts):
        return "pod"
    if len(parts) > 1:
        raise ValueError(
            "an id is a job id (12345, 12345_7, 12345#1), namespace/pod, a pod UID or an "
            "allocation id (slurm/CLUSTER/12345, k8s/CLUSTER/UID)"
        )
    return "bare"


_SLURM = "concat('slurm/', cluster, '/', {id:String})"
_MATCH = {
    "allocation": "allocation_id = {id:String}",
    "pod": "scheduler = 'kubernetes' AND name = {id:String}",
    # the job itself, its later runs (#1, #2...), and for a plain job id its array tasks and
    # heterogeneous components; a pod by UID, or by name in any namespace
    "bare": (
        f"allocation_id = {_SLURM} OR startsWith(allocation_id, concat({_SLURM}, '#')) "
        f"OR ({{whole:UInt8}} AND (startsWith(allocation_id, concat({_SLURM}, '_')) "
        f"OR startsWith(allocation_id, concat({_SLURM}, '+')))) "
        "OR allocation_id = concat('k8s/', cluster, '/', {id:String}) "
        "OR (scheduler = 'kubernetes' AND endsWith(name, concat('/', {id:String})))"
    ),
}
META_COLUMNS = (
    "cluster, allocation_id, scheduler, name, owner, team, workload_class, partition, qos, "
    "gang_id, gang_size, gpus_requested, nodes, time_limit_s, submit_time, eligible_time, "
    "start_time, end_time, final_state, exit_code, interactive, elapsed_s, namespace, queue, "
    "owner_kind, owner_name"
)


def resolve(ident: str, cluster: str | None) -> Query:
    """Every allocation the id names (in ``cluster`` if given), newest first, with how many
    there are in all (``matches``)."""
    form = id_form(ident)
    sql = (
        f"SELECT {META_COLUMNS}, count() OVER () AS matches FROM v_allocations "
        f"WHERE (empty({{cluster:String}}) OR cluster = {{cluster:String}}) AND ({_MATCH[form]}) "
        "ORDER BY start_time DESC NULLS LAST, cluster, allocation_id LIMIT {limit:UInt32}"
    )
    params = {"id": ident, "cluster": cluster or "", "limit": MAX_CANDIDATES}
    if form == "bare":
        params["whole"] = int(ident.isdigit())
    return Query(sql, params)


def _one(cluster: str, alloc: str, **extra: Any) -> dict[str, Any]:
    return {"cluster": cluster, "alloc": alloc, **extra}


# the allocation's days (v_capacity_gap_daily): its hours lie in them
_DAYS = f"(SELECT (min(day), max(day)) FROM gpu_days FINAL WHERE {_ONE} AND allocation_id != '')"
_IN_DAYS = f"hour >= toDateTime(span.1, 'UTC') AND hour < toDateTime(span.2 + 1, 'UTC') AND {_ONE}"


def totals(cluster: str, alloc: str) -> Query:
    """The allocation's figures as the views give them (v_top_waste's sums)."""
    sql = (
        "SELECT sum(allocated_gpu_h) AS allocated_gpu_h, sum(measured_gpu_h) AS measured_gpu_h, "
        "sum(consumed_gpu_h) AS consumed_gpu_h, sum(gap_gpu_h) AS gap_gpu_h, "
        "sum(unmeasured_gpu_h) AS unmeasured_gpu_h, sum(idle_gpu_h) AS idle_gpu_h, "
        "min(day) AS first_day, max(day) AS last_day, count() AS days "
        f"FROM v_capacity_gap_daily WHERE {_ONE}"
    )
    return Query(sql, _one(cluster, alloc))


def per_gpu(cluster: str, alloc: str, peak_q: float) -> Query:
    """Per GPU from the hourly rollup (v_capacity_gap's arithmetic), with its hourly peaks."""
    sql = (
        f"WITH {_DAYS} AS span SELECT gpu_uuid, any(node) AS node, "
        "any(physical_uuid) AS physical_uuid, sum(allocated_s) / 3600 AS allocated_gpu_h, "
        "sum(allocated_s - unmeasured_s) / 3600 AS measured_gpu_h, "
        "sum(consumed_gpu_s) / 3600 AS consumed_gpu_h, "
        "sum(allocated_s - unmeasured_s - consumed_gpu_s) / 3600 AS gap_gpu_h, "
        "sum(unmeasured_s) / 3600 AS unmeasured_gpu_h, sum(idle_s) / 3600 AS idle_gpu_h, "
        "quantileExactIf({q:Float64})(activity_max, allocated_s > unmeasured_s) AS peak, "
        "max(memory_max_mib) AS memory_mib, min(hour) AS first_hour, max(hour) AS last_hour "
        f"FROM gpu_hours FINAL WHERE {_IN_DAYS} "
        f"GROUP BY gpu_uuid ORDER BY node, gpu_uuid LIMIT {MAX_GPUS}"
    )
    return Query(sql, _one(cluster, alloc, q=peak_q))


def peaks(cluster: str, alloc: str, fit_q: float, model_q: float) -> Query:
    """Over every GPU-hour at once, as ``gpugap recommend`` reads a workload's (FIT_USE,
    MODEL_USE): the quantiles of the hourly peaks, the peak memory, the measured GPU-minutes
    and those with a memory reading, whether any GPU was a slice (MIG, an AMD compute
    partition, an Intel tile: identities ending /<id>), its GPUs' identity prefixes."""
    measured = "allocated_s > unmeasured_s"
    sql = (
        f"WITH {_DAYS} AS span SELECT "
        f"quantileExactIf({{fit_q:Float64}})(activity_max, {measured}) AS fit_peak, "
        f"quantileExactIf({{model_q:Float64}})(activity_max, {measured}) AS model_peak, "
        "max(memory_max_mib) AS memory_mib, sum(memory_minutes) AS memory_minutes, "
        "toUInt64(sum(allocated_s - unmeasured_s) / 60) AS measured_minutes, "
        "countIf(startsWith(gpu_uuid, 'MIG-') OR position(gpu_uuid, '/') > 0) > 0 AS sliced, "
        "groupUniqArray(4)(substring(gpu_uuid, 1, 4)) AS prefixes "
        f"FROM gpu_hours FINAL WHERE {_IN_DAYS}"
    )
    return Query(sql, _one(cluster, alloc, fit_q=fit_q, model_q=model_q))


def padding(cluster: str, alloc: str) -> Query:
    sql = (
        "SELECT time_limit_s, elapsed_s, limit_ratio, padding_gpu_h FROM v_slurm_padding "
        f"WHERE {_ONE} LIMIT 1"
    )
    return Query(sql, _one(cluster, alloc))


def queue_wait(cluster: str, alloc: str, gang_id: str) -> Query:
    """Its wait (v_queue_wait): a gang's member waited as the gang did."""
    sql = (
        "SELECT queue, waiting_since, start_time, wait_s, gpu_h_waited, held_gpu_h, gpus, "
        "members, gang_size FROM v_queue_wait WHERE cluster = {cluster:String} AND "
        "if({gang:String} = '', gang_id = '' AND allocation_id = {alloc:String}, "
        "gang_id = {gang:String}) LIMIT 1"
    )
    return Query(sql, _one(cluster, alloc, gang=gang_id))


def family(where: str, params: dict[str, Any], since: datetime, until: datetime) -> Query:
    """A Slurm family's jobs that ended in [since, until] (SLURM_FAMILIES' columns): the
    elapsed times and limits of the completed ones, and how many hit their limit. ``where``
    and ``params``: gpugap.recommend.base.family_where."""
    sql = (
        "SELECT groupArrayIf(elapsed_s, final_state = 'COMPLETED') AS elapsed, "
        "groupArrayIf(time_limit_s, final_state = 'COMPLETED') AS limits, "
        "countIf(final_state = 'TIMEOUT') AS timeouts, count() AS jobs FROM (SELECT elapsed_s, "
        f"time_limit_s, final_state FROM v_allocations WHERE {where} "
        f"AND end_time >= {{since:{_T}}} AND end_time <= {{until:{_T}}} AND time_limit_s > 0 "
        "AND elapsed_s IS NOT NULL AND gpus_requested > 0 "
        f"ORDER BY end_time DESC LIMIT {MAX_FAMILY_JOBS})"
    )
    return Query(sql, {**params, "since": since, "until": until})


def rate_model(cluster: str) -> Query:
    """The cluster's GPU model on the rate card (FIT_USE's: its highest-priority rule's)."""
    sql = "SELECT argMax(gpu_model, priority) FROM v_rate_card WHERE cluster = {cluster:String}"
    return Query(sql, {"cluster": cluster})


def recommendations(cluster: str, target: Any) -> Query:
    """Open recommendations (v_recommendations_open) whose target is this allocation's
    family, as gpugap.recommend names it (recommend.queries.target_of)."""
    keys = ("target_kind", "user", "account", "job_name", "partition", "namespace",
            "owner_kind", "owner_name")  # fmt: skip
    values = [target.kind, target.user, target.account, target.job_name, target.partition,
              target.namespace, target.owner_kind, target.owner_name]  # fmt: skip
    match = " AND ".join(f"{k} = {{{k}:String}}" for k in keys)
    sql = (
        "SELECT id, kind, parameter, from_value, to_value, saved_gpu_h_per_week, confidence, "
        "rationale, apply FROM recommendations FINAL WHERE id IN (SELECT id FROM "
        f"v_recommendations_open) AND cluster = {{cluster:String}} AND {match} "
        f"ORDER BY saved_gpu_h_per_week DESC, id LIMIT {MAX_RECOMMENDATIONS}"
    )
    return Query(
        sql, {"cluster": cluster, **{k: v or "" for k, v in zip(keys, values, strict=True)}}
    )


_MINUTES = (
    "toStartOfHour(minute) >= {first:DateTime('UTC')} "
    "AND toStartOfHour(minute) <= {last:DateTime('UTC')} AND " + _ONE
)


def series(cluster: str, alloc: str, first: datetime, last: datetime, step_s: int) -> Query:
    """Per GPU and bucket of ``step_s`` from ``first``: utilisation (consumed over measured)
    and the highest minute's memory (0: no reading)."""
    sql = (
        "SELECT gpu_uuid, intDiv(toUInt32(minute) - toUInt32({first:DateTime('UTC')}), "
        "{step:UInt32}) AS i, sum(consumed_ms) / sum(least(measured_ms, allocated_ms)) AS util, "
        "maxIf(memory_used_mib, no_samples = 0) AS memory_mib "
        f"FROM gpu_minutes FINAL WHERE {_MINUTES} AND measured_ms > 0 "
        f"GROUP BY gpu_uuid, i ORDER BY gpu_uuid, i LIMIT {MAX_SERIES_POINTS + MAX_GPUS}"
    )
    return Query(sql, _one(cluster, alloc, first=first, last=last, step=step_s))


# a minute of the allocation is idle when every GPU it held is below its idle threshold over
# its measured seconds, for a minute held whole: the rollup's rule (warehouse.rows.ROLLUP)
_IDLE_MINUTES = f"""
SELECT toUInt32(toUnixTimestamp(m.minute) / 60) AS t,
    min({WHOLE_MINUTE_HELD} AND m.consumed_ms
        < if(m.idle_after_minutes > 0, m.idle_threshold_bp / 10000, p.threshold) * m.measured_ms)
        AS all_idle,
    sum(if(m.gpu_share > 0, m.gpu_share, 1)) AS gpus
FROM (SELECT * FROM gpu_minutes FINAL WHERE {_MINUTES} AND measured_ms > 0 AND allocated_ms > 0)
    AS m
LEFT JOIN (SELECT workload_class, threshold FROM idle_policy FINAL) AS p
    ON p.workload_class = m.workload_class
GROUP BY t
"""


def idle(cluster: str, alloc: str, first: datetime, last: datetime) -> Query:
    """The measured minutes, the idle ones, the idle stretches (minutes in a row, every GPU
    idle): how many, their lengths, the longest (first minute, minutes, GPU-hours)."""
    sql = f"""
WITH per_minute AS ({_IDLE_MINUTES}),
stretches AS (
    SELECT min(t) AS first_minute, count() AS minutes, sum(gpus) / 60 AS gpu_h
    FROM (SELECT t, gpus, t - row_number() OVER (ORDER BY t) AS island
          FROM per_minute WHERE all_idle)
    GROUP BY island
)
SELECT (SELECT count() FROM per_minute) AS measured_minutes, count() AS stretches,
    sum(minutes) AS idle_minutes, groupArray({MAX_EPISODES})(minutes) AS lengths,
    arraySlice(arraySort(x -> (-x.2, x.1), groupArrayIf((first_minute, minutes, gpu_h),
        minutes >= {MIN_STRETCH_MIN})), 1, {MAX_STRETCHES}) AS longest
FROM stretches
"""
    return Query(sql, _one(cluster, alloc, first=first, last=last))


def node_models(cluster: str, nodes: list[str], since: datetime, until: datetime) -> Query:
    """The pool, GPU model, memory and rate of the nodes it ran on (capacity_queries.NODES)."""
    sql = (
        f"WITH {NODES} SELECT node, toString(pool), toString(model), memory, rate, currency, "
        "prefix "
        "FROM nodes WHERE cluster = {cluster:String} AND has({nodes:Array(String)}, node)"
    )
    return Query(sql, {"cluster": cluster, "nodes": nodes, "since": since, "until": until})


def estate(since: datetime, until: datetime) -> Query:
    """The models each cluster's pools had while it ran (capacity_queries.ESTATE)."""
    return Query(ESTATE, {"since": since, "until": until})
