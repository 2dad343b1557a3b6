"""The report's waste beyond idle allocations (docs/architecture.md#stranded-gpus): free GPUs
stranded by CPUs or memory others hold (v_stranded, v_stranded_by_allocation), work spread over
more nodes than it needed (v_spread_work), and quota held but unused (v_queue_quota_hourly),
in the window: polls and hours that fall in it, spread work that ran in it."""

from __future__ import annotations

from typing import Any

from gpugap.report.models import BeyondIdle, QueueRow, SpreadRow, Stranded, StrandedRow
from gpugap.report.table import Col, table

HEADING = "Beyond idle: stranded GPUs, work spread thin, quota held but unused"


STRANDED = (
    "SELECT sum(allocated_gpu_h) AS allocated, sum(usable_free_gpu_h) AS usable, "
    "sum(stranded_cpu_gpu_h) AS cpu, sum(stranded_memory_gpu_h) AS memory, "
    "sum(unavailable_gpu_h) AS unavailable FROM v_stranded "
    "WHERE time >= {since:DateTime('UTC')} AND time < {until:DateTime('UTC')}"
)
STRANDED_BY_ALLOCATION = (
    "SELECT concat(s.cluster, '/', s.allocation_id) AS key, any(a.team) AS team, "
    "any(a.owner) AS owner, sumIf(s.stranded_gpu_h, s.cause = 'cpu') AS cpu, "
    "sumIf(s.stranded_gpu_h, s.cause = 'memory') AS memory "
    "FROM v_stranded_by_allocation AS s LEFT JOIN v_allocations AS a "
    "ON a.cluster = s.cluster AND a.allocation_id = s.allocation_id "
    "WHERE s.time >= {since:DateTime('UTC')} AND s.time < {until:DateTime('UTC')} "
    "GROUP BY key ORDER BY cpu + memory DESC, key LIMIT {top:UInt32}"
)
STRANDED_BY_NODE = (
    "SELECT concat(cluster, '/', node) AS key, '' AS team, '' AS owner, "
    "sum(stranded_cpu_gpu_h) AS cpu, sum(stranded_memory_gpu_h) AS memory FROM v_stranded "
    "WHERE time >= {since:DateTime('UTC')} AND time < {until:DateTime('UTC')} "
    "GROUP BY key HAVING cpu + memory > 0 "
    "ORDER BY cpu + memory DESC, key LIMIT {top:UInt32}"
)
SPREAD = (
    "SELECT concat(cluster, '/', allocation_id) AS unit, team, owner, nodes, min_nodes, gpus, "
    "allocated_gpu_h FROM v_spread_work WHERE last_day >= toDate({since:DateTime('UTC')}) "
    "AND first_day <= toDate({until:DateTime('UTC')} - INTERVAL 1 SECOND) "
    "ORDER BY allocated_gpu_h DESC, unit LIMIT {top:UInt32}"
)
QUEUES = (
    "SELECT concat(cluster, '/', kind, '/', if(namespace = '', '', concat(namespace, '/')), "
    "queue) AS name, max(parent) AS parent, sum(entitled_gpu_h) AS entitled, "
    "sum(allocated_gpu_h) AS allocated, sum(consumed_gpu_h) AS consumed, "
    "sum(unused_gpu_h) AS unused, sum(borrowed_gpu_h) AS borrowed, sum(lent_gpu_h) AS lent, "
    "sum(pending_workload_h) AS pending, sum(waited_gpu_h) AS waited "
    "FROM v_queue_quota_hourly "
    "WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} "
    "GROUP BY name ORDER BY unused DESC, pending DESC, name LIMIT {top:UInt32}"
)


def _h(value: Any) -> float:
    return round(float(value or 0.0), 4)


def beyond_idle(queries: Any) -> BeyondIdle:
    """The section, through ``queries`` (the report's Queries: its window and top)."""
    total = (queries.rows("stranded", STRANDED) or [{}])[0]

    def stranded_rows(name: str, sql: str) -> list[StrandedRow]:
        return [
            StrandedRow(key=r["key"], team=r["team"] or "", owner=r["owner"] or "",
                        stranded_cpu_gpu_h=_h(r["cpu"]), stranded_memory_gpu_h=_h(r["memory"]))
            for r in queries.rows(name, sql)
        ]  # fmt: skip

    return BeyondIdle(
        stranded=Stranded(
            allocated_gpu_h=_h(total.get("allocated")),
            usable_free_gpu_h=_h(total.get("usable")),
            stranded_cpu_gpu_h=_h(total.get("cpu")),
            stranded_memory_gpu_h=_h(total.get("memory")),
            unavailable_gpu_h=_h(total.get("unavailable")),
            by_allocation=stranded_rows("stranded by allocation", STRANDED_BY_ALLOCATION),
            by_node=stranded_rows("stranded by node", STRANDED_BY_NODE),
        ),
        spread=[
            SpreadRow(
                unit=r["unit"],
                team=r["team"],
                owner=r["owner"],
                nodes=r["nodes"],
                min_nodes=r["min_nodes"],
                gpus=_h(r["gpus"]),
                allocated_gpu_h=_h(r["allocated_gpu_h"]),
            )
            for r in queries.rows("spread work", SPREAD)
        ],
        queues=[
            QueueRow(
                queue=r["name"],
                parent=r["parent"],
                entitled_gpu_h=_h(r["entitled"]),
                allocated_gpu_h=_h(r["allocated"]),
                consumed_gpu_h=_h(r["consumed"]),
                unused_gpu_h=_h(r["unused"]),
                borrowed_gpu_h=_h(r["borrowed"]),
                lent_gpu_h=_h(r["lent"]),
                pending_workload_h=_h(r["pending"]),
                waited_gpu_h=_h(r["waited"]),
            )
            for r in queries.rows("queue quotas", QUEUES)
        ],
    )


def _g(v: float) -> str:
    return f"{v:,.2f}"


def text(b: BeyondIdle, width: int) -> list[str]:
    """The section as the table prints it."""
    s = b.stranded
    out = ["", HEADING]
    if not (s.allocated_gpu_h or s.usable_free_gpu_h or s.unavailable_gpu_h):
        out += ["  stranded GPUs: no node capacity polled in the window",
                "  (gpugap produce slurm-capacity, kubernetes-capacity)"]  # fmt: skip
    else:
        out += [
            f"  free GPU-h: {_g(s.usable_free_gpu_h)} usable, {_g(s.stranded_cpu_gpu_h)} "
            f"stranded by CPU, {_g(s.stranded_memory_gpu_h)} stranded by memory,",
            f"  {_g(s.unavailable_gpu_h)} on unschedulable nodes "
            f"({_g(s.allocated_gpu_h)} GPU-h allocated on the nodes polled)",
        ]
        for name, rows in (("stranded by", s.by_allocation), ("stranded on", s.by_node)):
            if rows:
                out += ["", *table(
                    [Col(name, max=48), Col("team", max=16), Col("by CPU GPU-h", True),
                     Col("by memory GPU-h", True)],
                    [[r.key, r.team, _g(r.stranded_cpu_gpu_h), _g(r.stranded_memory_gpu_h)]
                     for r in rows],
                    width,
                )]  # fmt: skip
    if b.spread:
        out += ["", "  work spread over more nodes than it needed", *table(
            [Col("run or gang", max=48), Col("team", max=16), Col("nodes", True),
             Col("would fit", True), Col("GPUs", True), Col("GPU-h", True)],
            [[r.unit, r.team, f"{r.nodes:,}", f"{r.min_nodes:,}", f"{r.gpus:g}",
              _g(r.allocated_gpu_h)] for r in b.spread],
            width,
        )]  # fmt: skip
    if b.queues:
        out += ["", "  queues: entitlement beside what their work held and used", *table(
            [Col("queue", max=40), Col("entitled GPU-h", True), Col("held", True),
             Col("consumed", True), Col("unused", True), Col("lent", True),
             Col("pending wl-h", True), Col("waited", True)],
            [[r.queue, _g(r.entitled_gpu_h), _g(r.allocated_gpu_h), _g(r.consumed_gpu_h),
              _g(r.unused_gpu_h), _g(r.lent_gpu_h), _g(r.pending_workload_h),
              _g(r.waited_gpu_h)] for r in b.queues],
            width,
        )]  # fmt: skip
    return out


def csv_rows(b: BeyondIdle) -> list[list[Any]]:
    """``section,key,field,value`` rows: stranded totals and rows, spread work, queues."""
    s = b.stranded
    totals = ("allocated_gpu_h", "usable_free_gpu_h", "stranded_cpu_gpu_h",
              "stranded_memory_gpu_h", "unavailable_gpu_h")  # fmt: skip
    out: list[list[Any]] = [["stranded", "", k, getattr(s, k)] for k in totals]
    for part, rows in (
        ("stranded_by_allocation", s.by_allocation),
        ("stranded_by_node", s.by_node),
    ):
        out += [[part, r.key, k, getattr(r, k)] for r in rows
                for k in ("team", "stranded_cpu_gpu_h", "stranded_memory_gpu_h")]  # fmt: skip
    out += [["spread", r.unit, k, v] for r in b.spread
            for k, v in r.model_dump().items() if k != "unit"]  # fmt: skip
    out += [["queues", r.queue, k, v] for r in b.queues
            for k, v in r.model_dump().items() if k != "queue"]  # fmt: skip
    return out
