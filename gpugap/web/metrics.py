"""``/metrics`` of ``gpugap web``: the gap itself as Prometheus gauges, for sites that alert
with Prometheus (deploy/prometheus/gpugap-rules.yaml has the rules).

Every series comes from the warehouse views through the page's read-only workers. A scrape
answers from a copy at most ``CACHE_S`` old, so many scrapers cost the warehouse one set of
queries per ``CACHE_S``; each query returns at most ``MAX_SERIES`` rows. "Now" is the data's
own: the minute before each cluster's newest stored minute (the newest may still be arriving
GPU by GPU), and v_idle_now / v_alerts_open as the report reads them.
"""

# ruff: noqa: S608  (the SQL is this module's constants only)
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpugap.schemas.errors import GpugapError
from gpugap.schemas.types import normal_text
from gpugap.web.queries import Query

log = logging.getLogger("gpugap.web")

CACHE_S = 15.0
MAX_SERIES = 5000  # per query; ties broken by every label, so the same series every scrape
LABEL_MAX = 128  # characters of a label value (a 4 kB name made an 80 MB page)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATEST = (
    "(SELECT cluster, max(minute) - INTERVAL 1 MINUTE AS m FROM gpu_minutes "
    "WHERE minute >= (SELECT latest_minute FROM v_data_extent) - INTERVAL 1 HOUR "
    "GROUP BY cluster)"
)
_NOW = (
    "SELECT g.cluster AS cluster, g.scheduler AS scheduler, g.workload_class AS "
    "workload_class, g.team AS team, sum(g.allocated_ms) / 60000 AS allocated, "
    "sum(g.consumed_ms) / 60000 AS consumed FROM gpu_minutes AS g FINAL "
    f"WHERE g.minute >= (SELECT latest_minute FROM v_data_extent) - INTERVAL 1 HOUR "
    f"AND (g.cluster, g.minute) IN {_LATEST} AND g.allocation_id != '' "
    "GROUP BY cluster, scheduler, workload_class, team ORDER BY allocated DESC, cluster, "
    f"scheduler, workload_class, team LIMIT {MAX_SERIES}"
)
_UNALLOCATED = (
    "SELECT g.cluster AS cluster, sum(g.unallocated_ms) / 60000 AS unallocated "
    "FROM gpu_minutes AS g FINAL "
    "WHERE g.minute >= (SELECT latest_minute FROM v_data_extent) - INTERVAL 1 HOUR "
    f"AND (g.cluster, g.minute) IN {_LATEST} GROUP BY cluster ORDER BY cluster "
    f"LIMIT {MAX_SERIES}"
)
_IDLE = (
    "SELECT cluster, scheduler, workload_class, team, sum(gpus) AS gpus, count() AS n "
    "FROM v_idle_now GROUP BY cluster, scheduler, workload_class, team "
    f"ORDER BY gpus DESC, cluster, scheduler, workload_class, team LIMIT {MAX_SERIES}"
)
_ALERTS = (
    "SELECT cluster, kind, workload_class, team, count() AS n FROM v_alerts_open "
    "GROUP BY cluster, kind, workload_class, team ORDER BY n DESC, cluster, kind, "
    f"workload_class, team LIMIT {MAX_SERIES}"
)
# work lost (v_lost_work) by runs that ended in the day before the data's newest minute
_LOST = (
    "SELECT cluster, cause, team, sum(lost_gpu_h) AS lost, count() AS runs FROM v_lost_work "
    "WHERE end_time > (SELECT latest_minute FROM v_data_extent) - INTERVAL 1 DAY "
    f"GROUP BY cluster, cause, team ORDER BY lost DESC, cluster, cause, team LIMIT {MAX_SERIES}"
)
# stranded GPUs at each node's latest poll, for the nodes polled in the hour before the newest
# poll (a node no longer polled drops out)
_STRANDED = (
    "SELECT cluster, part.1 AS cause, sum(part.2) AS gpus FROM (SELECT cluster, node, "
    "argMax(stranded_cpu_gpus, time) AS by_cpu, argMax(stranded_memory_gpus, time) AS by_memory, "
    "max(time) AS polled FROM v_stranded "
    "WHERE time > (SELECT max(time) FROM node_capacity) - INTERVAL 1 HOUR "
    "GROUP BY cluster, node) ARRAY JOIN [('cpu', by_cpu), ('memory', by_memory)] AS part "
    f"GROUP BY cluster, cause ORDER BY cluster, cause LIMIT {MAX_SERIES}"
)
# each queue's entitlement and holdings at its latest poll (its flavors summed), for the queues
# polled in the hour before the newest poll
_QUOTAS = (
    "SELECT cluster, kind, namespace, queue, sum(entitled) AS entitled, sum(held) AS held, "
    "sum(pending) AS pending FROM (SELECT cluster, kind, namespace, queue, flavor, resource, "
    "argMax(coalesce(entitled_gpus, 0), time) AS entitled, "
    "argMax(coalesce(held_gpus, 0), time) AS held, "
    "argMax(coalesce(pending_workloads, 0), time) AS pending "
    "FROM queue_quotas FINAL "
    "WHERE time > (SELECT max(time) FROM queue_quotas) - INTERVAL 1 HOUR "
    "GROUP BY cluster, kind, namespace, queue, flavor, resource) "
    "GROUP BY cluster, kind, namespace, queue "
    f"ORDER BY entitled DESC, cluster, kind, namespace, queue LIMIT {MAX_SERIES}"
)
# GPUs of the work spread thin (v_spread_work) that ran on the newest data's day
_SPREAD = (
    "SELECT cluster, team, sum(gpus) AS gpus, sum(extra_nodes) AS extra FROM v_spread_work "
    "WHERE last_day >= toDate((SELECT latest_minute FROM v_data_extent)) "
    f"GROUP BY cluster, team ORDER BY gpus DESC, cluster, team LIMIT {MAX_SERIES}"
)
# gpugap's allocated GPUs against the scheduler's own count (v_scheduler_drift) at each
# cluster's latest poll of it, for the clusters polled in the hour before the newest poll
_DRIFT = (
    "SELECT cluster, scope, name, scheduler_gpus, gpugap_gpus, drift_gpus FROM v_scheduler_drift "
    "WHERE time > (SELECT max(time) FROM scheduler_gpu_counts) - INTERVAL 1 HOUR "
    f"ORDER BY abs(drift_gpus) DESC, cluster, scope, name LIMIT {MAX_SERIES}"
)
_FRESH = f"SELECT cluster, toUnixTimestamp(m) + 60 AS t FROM {_LATEST} ORDER BY cluster"

_GROUP = ("cluster", "scheduler", "workload_class", "team")


@dataclass(frozen=True)
class Family:
    name: str
    help: str
    query: str
    labels: tuple[str, ...]
    value: str  # the column


FAMILIES: Sequence[Family] = (
    Family("gpugap_gpus_allocated", "GPU-equivalents allocated in the latest complete minute",
           _NOW, _GROUP, "allocated"),
    Family("gpugap_gpus_consumed", "GPU-equivalents consumed (busy) in the latest complete "
           "minute", _NOW, _GROUP, "consumed"),
    Family("gpugap_gpus_unallocated", "GPU-equivalents no allocation held in the latest "
           "complete minute", _UNALLOCATED, ("cluster",), "unallocated"),
    Family("gpugap_gpus_idle", "GPUs of allocations idle now (v_idle_now)", _IDLE, _GROUP,
           "gpus"),
    Family("gpugap_idle_allocations", "allocations idle now (v_idle_now)", _IDLE, _GROUP, "n"),
    Family("gpugap_alerts_open", "open alerts (v_alerts_open)", _ALERTS,
           ("cluster", "kind", "workload_class", "team"), "n"),
    Family("gpugap_lost_gpu_hours_24h", "GPU-hours held by runs that ended preempted, "
           "requeued, on a failed node, evicted or OOM-killed in the 24 hours before the "
           "newest data (v_lost_work)", _LOST, ("cluster", "cause", "team"), "lost"),
    Family("gpugap_lost_runs_24h", "runs that ended so in those 24 hours (v_lost_work)", _LOST,
           ("cluster", "cause", "team"), "runs"),
    Family("gpugap_gpus_stranded", "free GPU-equivalents nobody can use for the CPUs or memory "
           "others hold beyond their share, at each node's latest poll (v_stranded)", _STRANDED,
           ("cluster", "cause"), "gpus"),
    Family("gpugap_spread_gpus", "GPUs of runs and gangs on more nodes than they needed, that "
           "ran on the newest data's day (v_spread_work)", _SPREAD, ("cluster", "team"), "gpus"),
    Family("gpugap_spread_extra_nodes", "the nodes beyond what those needed", _SPREAD,
           ("cluster", "team"), "extra"),
    Family("gpugap_queue_entitled_gpus", "GPUs a queue is entitled to (nominal quota, "
           "deserved, GrpTRES) at its latest poll", _QUOTAS,
           ("cluster", "kind", "namespace", "queue"), "entitled"),
    Family("gpugap_queue_held_gpus", "GPUs its queue manager says it holds (0: not reported)",
           _QUOTAS, ("cluster", "kind", "namespace", "queue"), "held"),
    Family("gpugap_queue_pending_workloads", "workloads waiting to be admitted", _QUOTAS,
           ("cluster", "kind", "namespace", "queue"), "pending"),
    Family("gpugap_scheduler_gpu_drift", "gpugap's allocated GPUs less the scheduler's own "
           "count of them (slurmctld's metrics) at its latest poll: 0 when gpugap sees every "
           "job (v_scheduler_drift)", _DRIFT, ("cluster", "scope", "name"), "drift_gpus"),
    Family("gpugap_scheduler_gpus_allocated", "the scheduler's own count of allocated GPUs "
           "at that poll", _DRIFT, ("cluster", "scope", "name"), "scheduler_gpus"),
    Family("gpugap_data_latest_minute_seconds", "end of the latest complete minute stored, "
           "Unix time (how fresh the figures above are)", _FRESH, ("cluster",), "t"),
)  # fmt: skip

Run = Callable[[Query], Awaitable[tuple[list[str], list[Any]]]]


def _label(v: Any) -> str:
    """A label value in its normal form (no control characters: a carriage return broke the
    page for Prometheus's own parser), at most LABEL_MAX characters, as the text format
    escapes it (backslash and quote; no newline is left)."""
    text = normal_text(str(v))
    if len(text) > LABEL_MAX:
        text = text[: LABEL_MAX - 1] + "…"
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _number(v: Any) -> str:
    f = float(v)
    return "NaN" if math.isnan(f) else repr(f) if not math.isinf(f) else "+Inf"


def render(results: dict[str, tuple[list[str], list[Any]]], up: bool, seconds: float) -> str:
    lines = []
    for fam in FAMILIES:
        lines += [f"# HELP {fam.name} {fam.help}", f"# TYPE {fam.name} gauge"]
        cols, rows = results.get(fam.query, ([], []))
        at = {c: i for i, c in enumerate(cols)}
        for r in rows:
            labels = ",".join(f'{k}="{_label(r[at[k]])}"' for k in fam.labels)
            lines.append(f"{fam.name}{{{labels}}} {_number(r[at[fam.value]])}")
    lines += [
        "# HELP gpugap_warehouse_up 1 if the last refresh of these figures read the warehouse",
        "# TYPE gpugap_warehouse_up gauge",
        f"gpugap_warehouse_up {int(up)}",
        "# HELP gpugap_metrics_refresh_seconds how long the last refresh took",
        "# TYPE gpugap_metrics_refresh_seconds gauge",
        f"gpugap_metrics_refresh_seconds {seconds:.3f}",
    ]
    return "\n".join(lines) + "\n"


class Exporter:
    """The text of /metrics, refreshed at most every CACHE_S (one refresh at a time)."""

    def __init__(self, run: Run, cache_s: float = CACHE_S) -> None:
        self.run = run
        self.cache_s = cache_s
        self._text = ""
        self._at = -math.inf
        self._lock = asyncio.Lock()

    async def text(self) -> str:
        async with self._lock:
            if time.monotonic() - self._at >= self.cache_s:
                self._text = await self._refresh()
                self._at = time.monotonic()
            return self._text

    async def _refresh(self) -> str:
        started = time.monotonic()
        queries = list(dict.fromkeys(f.query for f in FAMILIES))
        try:
            answers = await asyncio.gather(*(self.run(Query(q, {})) for q in queries))
        except GpugapError as exc:
            # the families stay declared, without series; gpugap_warehouse_up says so
            log.warning("/metrics: the warehouse did not answer: %s", exc)
            return render({}, False, time.monotonic() - started)
        return render(dict(zip(queries, answers, strict=True)), True, time.monotonic() - started)
