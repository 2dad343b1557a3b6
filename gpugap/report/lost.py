"""The report's lost work: GPU-hours of runs that did not finish by their own doing (preempted,
requeued, node failure, evicted, OOM-killed; v_lost_work, "Lost GPU-hours" in
docs/architecture.md#units-and-definitions), for the runs that ended in the window: totals, by
cause, class, team and queue.

A run's lost GPU-hours are all it held, wherever they fell: a run that ended in the window
counts whole, one that ended after it not at all."""

from __future__ import annotations

from typing import Any

from gpugap.report.models import LostRow, LostWork
from gpugap.report.table import Col, table

HEADING = "Work lost to preemption, requeue, eviction, node failure and OOM"

_T = "DateTime('UTC')"
_ENDED = f"FROM v_lost_work WHERE end_time >= {{since:{_T}}} AND end_time < {{until:{_T}}}"
_SUMS = "count() AS runs, sum(lost_gpu_h) AS lost, sum(consumed_gpu_h) AS consumed"
# one row of totals, one per cause and per class, one per team and per queue (the top ones):
# part says which. A queue is the Slurm partition or the namespace, named with its cluster.
QUERY = (
    f"(SELECT 'total' AS part, '' AS key, {_SUMS} {_ENDED}) "
    f"UNION ALL (SELECT 'cause' AS part, cause AS key, {_SUMS} {_ENDED} GROUP BY cause) "
    f"UNION ALL (SELECT 'class' AS part, workload_class AS key, {_SUMS} {_ENDED} "
    "GROUP BY workload_class) "
    f"UNION ALL (SELECT 'team' AS part, team AS key, {_SUMS} {_ENDED} GROUP BY team "
    "ORDER BY lost DESC, key LIMIT {top:UInt32}) "
    f"UNION ALL (SELECT 'queue' AS part, concat(cluster, '/', queue) AS key, {_SUMS} {_ENDED} "
    "GROUP BY key ORDER BY lost DESC, key LIMIT {top:UInt32})"
)
#: the breakdowns, in the order the table prints them
PARTS = ("cause", "class", "team", "queue")


def _h(value: Any) -> float:
    return round(float(value or 0.0), 4)


def lost_work(rows: list[dict[str, Any]]) -> LostWork:
    """The section from QUERY's rows."""

    def part(name: str) -> list[LostRow]:
        found = [r for r in rows if r["part"] == name]
        found.sort(key=lambda r: (-float(r["lost"] or 0.0), str(r["key"])))
        return [
            LostRow(
                key=str(r["key"]),
                runs=r["runs"],
                lost_gpu_h=_h(r["lost"]),
                consumed_gpu_h=_h(r["consumed"]),
            )
            for r in found
        ]

    total = next((r for r in rows if r["part"] == "total"), {"runs": 0})
    return LostWork(
        runs=total["runs"],
        lost_gpu_h=_h(total.get("lost")),
        consumed_gpu_h=_h(total.get("consumed")),
        by_cause=part("cause"),
        by_class=part("class"),
        by_team=part("team"),
        by_queue=part("queue"),
    )


def _gpu_h(v: float) -> str:
    return f"{v:,.2f}"


def text(lost: LostWork, width: int) -> list[str]:
    """The section as the table prints it."""
    out = ["", f"{HEADING} (runs that ended in the window)"]
    if not lost.runs:
        return [*out, "  nothing lost: no run ended preempted, requeued, on a failed node, "
                "evicted or OOM-killed"]  # fmt: skip
    runs = f"{lost.runs:,} run{'' if lost.runs == 1 else 's'}"
    out.append(
        f"  {runs}, {_gpu_h(lost.lost_gpu_h)} GPU-h lost (all they held), "
        f"{_gpu_h(lost.consumed_gpu_h)} GPU-h of it consumed"
    )
    for name in PARTS:
        rows = getattr(lost, f"by_{name}")
        out += ([""] if name != "cause" else []) + table(
            [Col(name, max=40), Col("runs", True), Col("lost GPU-h", True),
             Col("consumed GPU-h", True)],
            [[r.key or "(none)", f"{r.runs:,}", _gpu_h(r.lost_gpu_h), _gpu_h(r.consumed_gpu_h)]
             for r in rows],
            width,
        )  # fmt: skip
    return out


def csv_rows(lost: LostWork) -> list[list[Any]]:
    """``section,key,field,value`` rows: the totals, then per cause, class, team and queue."""
    fields = ("runs", "lost_gpu_h", "consumed_gpu_h")
    out: list[list[Any]] = [["lost_work", "", k, getattr(lost, k)] for k in fields]
    for name in PARTS:
        rows: list[LostRow] = getattr(lost, f"by_{name}")
        out += [[f"lost_work_by_{name}", r.key, k, getattr(r, k)] for r in rows for k in fields]
    return out
