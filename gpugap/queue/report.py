"""The report's queue section (``gpugap report --queue``): how long work waited for GPUs, by
queue (Slurm partition or namespace), class, team and GPU count, from v_queue_wait; and per
Slurm partition what its padded limits cost the queue, by replaying its recorded jobs
through the backfill model with the limits asked for and with the ``--time`` rule's
(gpugap.queue.cost; assumptions in docs/queue.md)."""

# ruff: noqa: S608  (the SQL is assembled from this module's constants only; values are bound)
from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpugap.queue.cost import QueueFigures, Spread, queue_cost
from gpugap.queue.warehouse import recorded_partitions
from gpugap.report import sections
from gpugap.report.queries import window_parameters
from gpugap.report.sections import with_section
from gpugap.report.table import Col, table
from gpugap.warehouse.client import run_query

#: each variant replayed this many times (the first as recorded, then jittered)
REPEATS = 3
#: padded users replayed one by one per partition (each costs REPEATS replays)
USERS = 3

_T = "DateTime64(3, 'UTC')"
_STATS = (
    "count() AS jobs, sum(w.gpus) AS gpus, quantileExact(0.5)(w.wait_s) AS p50_wait_s, "
    "quantileExact(0.95)(w.wait_s) AS p95_wait_s, avg(w.wait_s) AS mean_wait_s, "
    "sum(w.gpu_h_waited) AS gpu_h_waited, sum(w.held_gpu_h) AS held_gpu_h, "
    "countIf(w.members < w.gang_size) AS incomplete_gangs"
)
_WHERE = f"start_time >= {{since:{_T}}} AND start_time < {{until:{_T}}}"
_KEYS = {
    "by_queue": "concat(cluster, '/', queue)",
    "by_class": "workload_class",
    "by_team": "team",
    "by_gpus": "toString(gpus)",
}
_ROUNDED = ("p50_wait_s", "p95_wait_s", "mean_wait_s", "gpu_h_waited", "held_gpu_h")


def _wait_sql(section: str) -> str:
    # the key is named in the inner query: an alias over a column the outer one sums clashes
    order = "toUInt32(key)" if section == "by_gpus" else "gpu_h_waited DESC, key"
    scheduler = "any(w.scheduler)" if section == "by_queue" else "''"
    return (
        f"SELECT w.group_key AS key, {scheduler} AS scheduler, {_STATS} FROM "
        f"(SELECT *, {_KEYS[section]} AS group_key FROM v_queue_wait WHERE {_WHERE}) AS w "
        f"GROUP BY key ORDER BY {order} LIMIT {{top:UInt32}}"
    )


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WaitRow(_Model):
    key: str = Field(description="cluster/queue, class, team or GPU count")
    scheduler: str = Field(description="by_queue: slurm or kubernetes")
    jobs: int = Field(description="jobs, pods and gangs (a gang counts once) that started")
    gpus: int = Field(description="GPUs they asked for")
    p50_wait_s: float
    p95_wait_s: float
    mean_wait_s: float
    gpu_h_waited: float = Field(description="GPUs x wait")
    held_gpu_h: float = Field(description="GPUs a gang's bound pods held while the rest waited")
    incomplete_gangs: int = Field(description="gangs with members still unbound")


class Range(_Model):
    mean: float
    low: float
    high: float
    clear: bool = Field(description="every replay agrees on the sign: larger than the noise")


class Figures(_Model):
    jobs: int
    gpu_h_waited: float
    mean_wait_s: float
    p95_wait_s: float
    makespan_s: float
    backfilled: int


class PaddedUser(_Model):
    user: str
    jobs_right_sized: int
    over_rule_gpu_h: float = Field(
        description="GPUs x (limit asked - limit by the --time rule), over the right-sized jobs "
        "(not the report's padding, GPUs x unused limit)"
    )
    others_gpu_h_waited: float = Field(description="everyone else's, limits as asked")
    others_gpu_h_freed: Range = Field(description="... less with this user's limits right-sized")
    own_gpu_h_freed: Range


class PartitionCost(_Model):
    cluster: str
    partition: str
    nodes: int = Field(description="nodes the jobs ran on (the model's partition)")
    gpus_per_node: int
    jobs: int = Field(description="jobs replayed")
    jobs_in_window: int = Field(description="more than jobs: only the latest were replayed")
    measured_mean_wait_s: float = Field(description="what the jobs really waited")
    measured_gpu_h_waited: float
    asked: Figures = Field(description="the model, limits as asked (submit times as recorded)")
    right_sized: Figures = Field(description="the model, limits by the --time rule")
    jobs_right_sized: int
    repeats: int
    gpu_h_freed: Range = Field(description="GPU-hours waited, asked minus right-sized")
    mean_wait_freed_s: Range
    padded_users: list[PaddedUser]


class QueueReport(_Model):
    """How long work waited for GPUs, and what padded Slurm limits cost the queue."""

    by_queue: list[WaitRow]
    by_class: list[WaitRow]
    by_team: list[WaitRow]
    by_gpus: list[WaitRow]
    partitions: list[PartitionCost]


def _range(s: Spread, digits: int = 3) -> Range:
    return Range(
        mean=round(s.mean, digits), low=round(s.low, digits), high=round(s.high, digits),
        clear=s.clear,
    )  # fmt: skip


def _figures(f: QueueFigures) -> Figures:
    return Figures(
        jobs=f.jobs, gpu_h_waited=round(f.gpu_h_waited, 3), mean_wait_s=round(f.mean_wait_s, 1),
        p95_wait_s=round(f.p95_wait_s, 1), makespan_s=round(f.makespan_s, 1),
        backfilled=f.backfilled,
    )  # fmt: skip


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def build_queue(
    client: Any,
    since: datetime | None = None,
    until: datetime | None = None,
    top: int = 10,
    *,
    repeats: int = REPEATS,
    users: int = USERS,
) -> QueueReport:
    """The queue section for work that started in [since, until) (hours, as the report's)."""
    p = window_parameters(since and _aware(since), until and _aware(until))
    params = {"since": p["since"], "until": p["until"], "top": top}
    waits = {
        section: [
            WaitRow(**{**r, **{k: round(float(r[k]), 3) for k in _ROUNDED}})
            for r in run_query(client, _wait_sql(section), params).named_results()
        ]
        for section in _KEYS
    }
    costs = []
    for rec in recorded_partitions(client, p["since"], p["until"]):
        c = queue_cost(rec.jobs, rec.shape, top_users=users, repeats=repeats)
        gpus = {j.id: j.gpus for j in rec.jobs}
        measured = rec.measured_wait_s
        costs.append(
            PartitionCost(
                cluster=rec.cluster,
                partition=rec.partition,
                nodes=rec.shape.nodes,
                gpus_per_node=rec.shape.gpus_per_node,
                jobs=len(rec.jobs),
                jobs_in_window=rec.jobs_in_window,
                measured_mean_wait_s=round(sum(measured.values()) / len(measured), 1),
                measured_gpu_h_waited=round(
                    sum(gpus[i] * w for i, w in measured.items()) / 3600, 3
                ),
                asked=_figures(c.asked),
                right_sized=_figures(c.right_sized),
                jobs_right_sized=c.jobs_right_sized,
                repeats=c.repeats,
                gpu_h_freed=_range(c.gpu_h_freed),
                mean_wait_freed_s=_range(c.mean_wait_freed_s, 1),
                padded_users=[
                    PaddedUser(
                        user=u.user,
                        jobs_right_sized=u.jobs_right_sized,
                        over_rule_gpu_h=round(u.over_rule_gpu_h, 3),
                        others_gpu_h_waited=round(u.others_gpu_h_waited, 3),
                        others_gpu_h_freed=_range(u.others_gpu_h_freed),
                        own_gpu_h_freed=_range(u.own_gpu_h_freed),
                    )
                    for u in c.by_user
                ],
            )
        )
    return QueueReport(**waits, partitions=costs)


# --- rendering ----------------------------------------------------------------------------


def duration(s: float) -> str:
    """A wait for people: 42s, 17m, 3.4h, 2.1d."""
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _decimals(values: Sequence[float], least: int = 1, most: int = 3) -> int:
    """The fewest decimals (``least``..``most``) that keep distinct values apart and show a
    non-zero one as non-zero: a spread of 0.04..0.06 must not read 0.0..0.1."""
    for d in range(least, most):
        shown = {round(v, d) for v in values}
        if len(shown) == len(set(values)) and all(round(v, d) or not v for v in values):
            return d
    return most


def _freed(r: Range, fmt: Any = None) -> str:
    """The mean and the spread over the replays; "noise" only where replays disagree on the
    sign of a change (one frees, another costs), and one figure where they all agree."""
    if fmt is None:
        d = _decimals([r.mean, r.low, r.high])
        fmt = f"{{:,.{d}f}}".format
    if r.low == r.high:
        return fmt(r.mean)
    noise = ", noise" if r.low < 0 < r.high else ""
    return f"{fmt(r.mean)} ({fmt(r.low)}..{fmt(r.high)}{noise})"


def render_table(q: QueueReport) -> str:
    lines = ["", "QUEUE (waiting for GPUs; gangs wait as one, from the first pod to the last)"]
    titles = {
        "by_queue": ("queue", "By queue (Slurm partition, Kubernetes namespace)"),
        "by_class": ("class", "By class"),
        "by_team": ("team", "By team"),
        "by_gpus": ("GPUs", "By GPUs asked for"),
    }
    for section, (head, title) in titles.items():
        rows: list[WaitRow] = getattr(q, section)
        lines += ["", f"  {title}"]
        if not rows:
            lines.append("  (no started work with a submit time in the window)")
            continue
        lines += table(
            [
                Col(head, max=28),
                Col("jobs", True),
                Col("p50 wait", True),
                Col("p95 wait", True),
                Col("mean wait", True),
                Col("GPU-h waited", True),
                Col("held GPU-h", True),
            ],
            [
                [
                    r.key or "(none)",
                    f"{r.jobs:,}",
                    duration(r.p50_wait_s),
                    duration(r.p95_wait_s),
                    duration(r.mean_wait_s),
                    f"{r.gpu_h_waited:,.1f}",
                    f"{r.held_gpu_h:,.1f}",
                ]
                for r in rows
            ],
        )
    lines += ["", "  What padded limits cost the queue (EASY-backfill replay, docs/queue.md)"]
    if not q.partitions:
        lines.append("  (no Slurm jobs started in the window)")
    for c in q.partitions:
        cut = "" if c.jobs == c.jobs_in_window else f" (the latest of {c.jobs_in_window:,})"
        lines += [
            "",
            f"  {c.cluster}/{c.partition}: {c.jobs:,} jobs{cut} on {c.nodes} "
            f"node{'s' if c.nodes != 1 else ''} x "
            f"{c.gpus_per_node} GPUs; {c.jobs_right_sized:,} right-sized by the --time rule",
        ]
        lines += table(
            [
                Col("", max=22),
                Col("GPU-h waited", True),
                Col("mean wait", True),
                Col("p95 wait", True),
                Col("makespan", True),
                Col("backfilled", True),
            ],
            [
                ["measured", f"{c.measured_gpu_h_waited:,.1f}",
                 duration(c.measured_mean_wait_s), "", "", ""],
                *(
                    [label, f"{f.gpu_h_waited:,.1f}", duration(f.mean_wait_s),
                     duration(f.p95_wait_s), duration(f.makespan_s), f"{f.backfilled:,}"]
                    for label, f in (("model, as asked", c.asked),
                                     ("model, right-sized", c.right_sized))
                ),
            ],
        )  # fmt: skip
        lines.append(
            f"  freed over {c.repeats} replays: {_freed(c.gpu_h_freed)} GPU-h waited, "
            f"mean wait {_freed(c.mean_wait_freed_s, duration)}"
        )
        if c.padded_users:
            lines += table(
                [
                    Col("padded user", max=20),
                    Col("jobs", True),
                    Col("over rule GPU-h", True),
                    Col("others' GPU-h freed", True),
                    Col("own GPU-h freed", True),
                ],
                [
                    [
                        u.user or "(none)",
                        f"{u.jobs_right_sized:,}",
                        f"{u.over_rule_gpu_h:,.1f}",
                        _freed(u.others_gpu_h_freed),
                        _freed(u.own_gpu_h_freed),
                    ]
                    for u in c.padded_users
                ],
            )
    return "\n".join(lines)


def render_csv_rows(q: QueueReport) -> str:
    """Long-form rows (section,key,field,value) without a header: appended to the report's."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    data = q.model_dump(mode="json")
    for section in _KEYS:
        for r in data[section]:
            for k, v in r.items():
                if k != "key":
                    out.writerow([f"queue_{section}", r["key"], k, v])
    for c in data["partitions"]:
        key = f"{c['cluster']}/{c['partition']}"
        for k, v in c.items():
            if k in ("cluster", "partition", "padded_users"):
                continue
            if isinstance(v, dict):
                for kk, vv in v.items():
                    out.writerow(["queue_partitions", key, f"{k}.{kk}", vv])
            else:
                out.writerow(["queue_partitions", key, k, v])
        for u in c["padded_users"]:
            for k, v in u.items():
                if k == "user":
                    continue
                items = v.items() if isinstance(v, dict) else [("", v)]
                for kk, vv in items:
                    field = f"{k}.{kk}" if kk else k
                    out.writerow(["queue_padded_users", f"{key}:{u['user']}", field, vv])
    return buf.getvalue().rstrip("\n")


def extend_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The report's JSON Schema with the ``queue`` member ``--queue`` adds."""
    return sections.extend_schema(schema, "queue", QueueReport)


def render_with(report_text: str, q: QueueReport, fmt: str) -> str:
    """The report with the queue section: after the table, as a ``queue`` member of the
    JSON (``extend_schema``), as ``queue_*`` rows after the CSV's."""
    return with_section(
        report_text,
        fmt,
        "queue",
        q,
        csv_rows=lambda: render_csv_rows(q),
        table=lambda: render_table(q),
    )
