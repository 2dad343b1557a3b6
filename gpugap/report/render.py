"""The report as text (a terminal, 100 columns), JSON (the published schema) or CSV (long
form: one value per line, ``section,key,field,value``, for spreadsheets and pivots)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Any

from gpugap.report import beyond, drift, lost
from gpugap.report.models import Gap, Report
from gpugap.report.table import Col, table
from gpugap.schemas.errors import ConfigError

FORMATS = ("table", "json", "csv")
WIDTH = 100


def render(report: Report, fmt: str = "table") -> str:
    if fmt == "json":
        return report.model_dump_json(indent=2)
    if fmt == "csv":
        return _csv(report)
    if fmt == "table":
        return "\n".join(_text(report))
    raise ConfigError(f"unknown --format {fmt!r}: choose one of {', '.join(FORMATS)}")


def gpu_h(v: float) -> str:
    return f"{v:,.2f}"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def when(t: datetime | None) -> str:
    return "-" if t is None else f"{t:%Y-%m-%d %H:%M}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def alloc_label(cluster: str, allocation_id: str, name: str, scheduler: str) -> str:
    """Pods by namespace/name (their id is a uid), Slurm jobs by id and name."""
    if scheduler == "kubernetes" and name:
        return f"k8s/{cluster}/{name}"
    return f"{allocation_id} ({name})" if name else allocation_id


def _window(report: Report) -> list[str]:
    w = report.window
    if w.since is None and w.until is None:
        span = f"all data, from {w.data_from:%Y-%m-%d}" if w.data_from else "all data (none yet)"
    else:
        start = when(w.hour_from) if w.hour_from else "the first data"
        end = when(w.hour_to) if w.hour_to else "now"
        span = f"{start} .. {end} UTC (whole hours)"
    return [
        "gpugap report: GPU-hours allocated vs consumed",
        f"window       {span}",
        f"latest data  {when(w.latest_minute)} UTC (the 'now' sections are as of this minute)",
    ]


def _gap_cells(g: Gap) -> list[str]:
    return [
        gpu_h(g.allocated_gpu_h),
        gpu_h(g.consumed_gpu_h),
        gpu_h(g.gap_gpu_h),
        pct(g.gap_pct),
        gpu_h(g.unmeasured_gpu_h),
        gpu_h(g.idle_gpu_h),
    ]


_GAP_COLS = [
    Col("allocated", True),
    Col("consumed", True),
    Col("gap", True),
    Col("gap %", True),
    Col("unmeasured", True),
    Col("idle", True),
]


def _text(r: Report) -> list[str]:
    out = _window(r)
    out += ["", f"Gap by {r.by} (GPU-hours; gap = measured - consumed, gap % of measured)"]
    rows = [[g.key or "(none)", *_gap_cells(g)] for g in r.breakdown]
    rows.append(["total", *_gap_cells(r.totals)])
    out += table([Col(r.by, max=40), *_GAP_COLS], rows, WIDTH)

    out += ["", f"Top {r.top} allocations by gap (GPU-hours)"]
    out += _or_none(
        table(
            [Col("#", True), Col("allocation"), Col("owner", max=16), Col("class"),
             Col("GPUs", True), Col("allocated", True), Col("gap", True), Col("gap %", True)],
            [
                [str(a.rank), alloc_label(a.cluster, a.allocation_id, a.name, a.scheduler),
                 a.owner, a.workload_class, "" if a.gpus_requested is None else
                 str(a.gpus_requested), gpu_h(a.gap.allocated_gpu_h), gpu_h(a.gap.gap_gpu_h),
                 pct(a.gap.gap_pct)]
                for a in r.top_allocations
            ],
            WIDTH,
        ),
        r.top_allocations,
    )  # fmt: skip

    out += ["", f"Top {r.top} owners by gap (GPU-hours)"]
    out += _or_none(
        table(
            [Col("#", True), Col("owner", max=24), Col("teams"), Col("allocs", True),
             Col("allocated", True), Col("consumed", True), Col("gap", True), Col("gap %", True)],
            [
                [str(o.rank), o.owner or "(none)", ",".join(o.teams), str(o.allocations),
                 gpu_h(o.gap.allocated_gpu_h), gpu_h(o.gap.consumed_gpu_h),
                 gpu_h(o.gap.gap_gpu_h), pct(o.gap.gap_pct)]
                for o in r.top_owners
            ],
            WIDTH,
        ),
        r.top_owners,
    )  # fmt: skip

    c = r.capacity
    out += [
        "",
        "Capacity (GPUs that reported)",
        f"  {gpu_h(c.capacity_gpu_h)} GPU-h: allocated {gpu_h(c.allocated_gpu_h)}, "
        f"unallocated {gpu_h(c.unallocated_gpu_h)} ({pct(c.unallocated_pct)})",
        f"  unattributed use (activity on unallocated GPUs): {gpu_h(c.unattributed_gpu_h)} GPU-h",
    ]
    if r.unattributed_nodes:
        out += table(
            [Col("cluster", max=20), Col("node", max=40), Col("unallocated", True),
             Col("unattributed", True)],
            [[n.cluster, n.node, gpu_h(n.unallocated_gpu_h), gpu_h(n.unattributed_gpu_h)]
             for n in r.unattributed_nodes],
            WIDTH,
        )  # fmt: skip

    p = r.slurm_padding
    ratio = "-" if p.median_limit_ratio is None else f"{p.median_limit_ratio:.1f}x"
    out += [
        "",
        "Slurm time-limit padding (finished jobs that ended in the window)",
        f"  {plural(p.jobs, 'job')}, median limit/elapsed {ratio}, "
        f"padding {gpu_h(p.padding_gpu_h)} GPU-h (GPUs x unused limit)",
    ]
    if p.rows:
        out += table(
            [Col("user", max=24), Col("account", max=24), Col("jobs", True),
             Col("median limit/elapsed", True), Col("padding GPU-h", True)],
            [[x.user or "(none)", x.account or "(none)", str(x.jobs),
              f"{x.median_limit_ratio:.1f}x", gpu_h(x.padding_gpu_h)] for x in p.rows],
            WIDTH,
        )  # fmt: skip

    i = r.idle_now
    out += [
        "",
        "Idle allocations now (every measured minute of its idle rule's window below its "
        "threshold)",
        f"  {plural(i.allocations, 'allocation')}, {plural(i.gpus, 'GPU')}",
    ]
    if i.rows:
        out += table(
            [Col("allocation"), Col("owner", max=16), Col("class"), Col("GPUs", True),
             Col("activity", True), Col("idle rule"), Col("last minute")],
            [[alloc_label(x.cluster, x.allocation_id, x.name, x.scheduler), x.owner,
              x.workload_class, str(x.gpus), f"{100 * x.activity:.1f}%",
              f"<{100 * x.idle_threshold:g}% {x.idle_minutes}m", when(x.last_minute)]
             for x in i.rows],
            WIDTH,
        )  # fmt: skip

    g = r.partial_gangs_now
    out += [
        "",
        "Partial gangs now (open alerts: some pods running and holding GPUs, others Pending)",
        f"  {plural(g.gangs, 'gang')}, {gpu_h(g.held_gpu_h)} GPU-h held while waiting",
    ]
    if g.rows:
        out += table(
            [Col("gang"), Col("owner", max=16), Col("team", max=16), Col("running", True),
             Col("pending", True), Col("open since"), Col("held GPU-h", True)],
            [[f"{x.cluster}/{x.gang_id}", x.owner, x.team, _n(x.running_pods),
              _n(x.pending_pods), when(x.opened_at), gpu_h(x.held_gpu_h)] for x in g.rows],
            WIDTH,
        )  # fmt: skip
    return (
        out
        + lost.text(r.lost_work, WIDTH)
        + beyond.text(r.beyond_idle, WIDTH)
        + drift.text(r.scheduler_drift)
    )


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def _or_none(lines: list[str], items: list[Any]) -> list[str]:
    return lines if items else ["  (none)"]


def _csv(r: Report) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["section", "key", "field", "value"])
    data = r.model_dump(mode="json")
    for field in ("window", "capacity"):
        for k, v in data[field].items():
            out.writerow([field, "", k, v])
    for k, v in data["totals"].items():
        if k != "key":
            out.writerow(["totals", "all", k, v])
    for g in data["breakdown"]:
        for k, v in g.items():
            if k != "key":
                out.writerow([f"by_{r.by}", g["key"], k, v])
    keys = {
        "top_allocations": "allocation_id",
        "top_owners": "owner",
        "unattributed_nodes": "node",
    }
    for section, key in keys.items():
        for item in data[section]:
            for k, v in _flat(item).items():
                if k != key:
                    out.writerow([section, item[key], k, v])
    for section, key in (
        ("slurm_padding", "user"),
        ("idle_now", "allocation_id"),
        ("partial_gangs_now", "gang_id"),
    ):
        for k, v in data[section].items():
            if k != "rows":
                out.writerow([section, "", k, v])
        for item in data[section]["rows"]:
            for k, v in _flat(item).items():
                if k != key:
                    out.writerow([section, item[key], k, v])
    out.writerows(lost.csv_rows(r.lost_work))
    out.writerows(beyond.csv_rows(r.beyond_idle))
    out.writerows(
        ["scheduler_drift", f"{d.cluster}/{d.scope}/{d.name}", k, v]
        for d in r.scheduler_drift
        for k, v in d.model_dump(mode="json").items()
        if k not in ("cluster", "scope", "name")
    )
    return buf.getvalue().rstrip("\n")


def _flat(item: dict[str, Any]) -> dict[str, Any]:
    """Nested gap figures inline; lists joined with commas."""
    out: dict[str, Any] = {}
    for k, v in item.items():
        if isinstance(v, dict):
            out.update({kk: vv for kk, vv in v.items() if kk != "key"})
        elif isinstance(v, list):
            out[k] = ",".join(map(str, v))
        else:
            out[k] = v
    return out
