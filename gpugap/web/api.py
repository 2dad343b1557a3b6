"""The page's API: a name, the browser's parameters, and the JSON of the named queries.

``answer(name, query, run)`` validates the parameters (``gpugap.web.params``), runs the fixed
queries of that name (``gpugap.web.queries``) through ``run`` and shapes the rows for the
page: tables as columns and rows, charts as one array per series (times in epoch seconds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpugap.cost import report as cost
from gpugap.job import report as job
from gpugap.web import params, queries
from gpugap.web.queries import Query

Rows = tuple[list[str], list[Sequence[Any]]]
Run = Callable[[Query], Awaitable[Rows]]
NAMES = ("extent", "options", "allocation", "job", "cost", *queries.FILTERED)
COST_COLUMNS = ["cluster", "environment", "rate_status", "allocated_gpu_h", "allocated_cost",
                "unallocated_cost", "egress_gib", "egress_cost", "total_cost"]  # fmt: skip


class NotFound(KeyError):
    """No query of that name."""


def _table(rows: Rows) -> dict[str, Any]:
    columns, data = rows
    return {"columns": columns, "rows": [[queries.epoch(v) for v in r] for r in data]}


def _record(rows: Rows) -> dict[str, Any]:
    columns, data = rows
    return {c: queries.epoch(v) for c, v in zip(columns, data[0], strict=True)} if data else {}


def _bucket_fields(b: queries.Bucket, times: list[int]) -> dict[str, Any]:
    return {"grain": b.grain, "step_s": b.step_s, "step_h": round(b.step_h, 6),
            "bucket": b.label, "t": times}  # fmt: skip


def shape_timeseries(rows: Rows, f: params.Filters | None) -> dict[str, Any]:
    """Per bucket of the range ``f`` (None: no data in the range, no buckets), in average GPUs:
    a bucket's GPU-hours over its length. Buckets without rows are 0."""
    b = queries.buckets(f) if f else queries.Bucket("hour", 3600, 0)
    times = b.grid(f.until) if f else []
    index = {t: i for i, t in enumerate(times)}
    totals = {k: [0.0] * len(times) for k in ("allocated", "consumed", "gap", "unmeasured")}
    per_group: dict[str, list[float]] = {}
    for t, g, allocated, consumed, gap, unmeasured in rows[1]:
        i = index.get(queries.epoch(t))
        if i is None:  # pragma: no cover (the query's buckets are the grid's)
            continue
        for k, v in (("allocated", allocated), ("consumed", consumed), ("gap", gap),
                     ("unmeasured", unmeasured)):  # fmt: skip
            totals[k][i] += v / b.step_h
        name = g or "(none)"
        per_group.setdefault(name, [0.0] * len(times))[i] += gap / b.step_h
    ranked = sorted(per_group, key=lambda n: (-sum(per_group[n]), n))
    groups = [(n, per_group[n]) for n in ranked[: queries.MAX_GROUPS]]
    rest = ranked[queries.MAX_GROUPS :]
    if rest:
        other = [sum(per_group[n][i] for n in rest) for i in range(len(times))]
        groups.append((f"other ({len(rest)})", other))
    return {
        **_bucket_fields(b, times),
        "by": f.by if f else "class",
        **{k: [round(v, 4) for v in vs] for k, vs in totals.items()},
        "groups": [{"name": n, "gap": [round(v, 4) for v in gap]} for n, gap in groups],
    }


def shape_unallocated(rows: Rows, f: params.Filters | None) -> dict[str, Any]:
    """Like shape_timeseries; the totals in GPU-hours."""
    b = queries.buckets(f) if f else queries.Bucket("hour", 3600, 0)
    times = b.grid(f.until) if f else []
    index = {t: i for i, t in enumerate(times)}
    series = {k: [0.0] * len(times) for k in ("unallocated", "unattributed")}
    gpu_h = dict.fromkeys(series, 0.0)
    for t, unallocated, unattributed in rows[1]:
        i = index.get(queries.epoch(t))
        if i is None:  # pragma: no cover (the query's buckets are the grid's)
            continue
        for k, v in (("unallocated", unallocated), ("unattributed", unattributed)):
            series[k][i] += v / b.step_h
            gpu_h[k] += v
    return {
        **_bucket_fields(b, times),
        **{k: [round(v, 4) for v in vs] for k, vs in series.items()},
        **{f"{k}_gpu_h": round(v, 4) for k, v in gpu_h.items()},
    }


def shape_summary(rows: Rows) -> dict[str, Any]:
    out = _record(rows)
    measured = out.get("measured_gpu_h") or 0.0
    out["gap_pct"] = round(100 * out.get("gap_gpu_h", 0.0) / measured, 2) if measured else None
    return out


def shape_padding(rows: Rows) -> dict[str, Any]:
    columns, data = rows
    jobs = int(data[0][-2]) if data else 0
    total = float(data[0][-1]) if data else 0.0
    table = _table((columns[:-2], [r[:-2] for r in data]))
    return {**table, "jobs": jobs, "padding_gpu_h": round(total, 4)}


def shape_allocation(meta: Rows, timeline: Rows) -> dict[str, Any]:
    gpus: dict[str, dict[str, Any]] = {}
    for hour, uuid, node, allocated, measured, consumed, gap in timeline[1]:
        g = gpus.setdefault(uuid, {"gpu_uuid": uuid, "node": node, "t": [], "activity": [],
                                   "allocated_gpu_h": 0.0, "consumed_gpu_h": 0.0,
                                   "gap_gpu_h": 0.0})  # fmt: skip
        g["t"].append(queries.epoch(hour))
        g["activity"].append(round(consumed / measured, 4) if measured > 0 else None)
        g["allocated_gpu_h"] += allocated
        g["consumed_gpu_h"] += consumed
        g["gap_gpu_h"] += gap
    for g in gpus.values():
        for k in ("allocated_gpu_h", "consumed_gpu_h", "gap_gpu_h"):
            g[k] = round(g[k], 4)
    return {"meta": _record(meta) or None, "gpus": list(gpus.values()),
            "truncated": len(timeline[1]) >= queries.MAX_TIMELINE_ROWS}  # fmt: skip


def shape_job(outcome: job.Outcome) -> dict[str, Any]:
    """``gpugap job``'s report under ``job`` (match "one"), or the candidates of an id that
    names several allocations (match "ambiguous"), or why none (match "unknown")."""
    if isinstance(outcome, job.JobReport):
        return {"match": "one", "job": outcome.model_dump(mode="json")}
    return outcome.model_dump(mode="json")


def _named(rows: Rows) -> list[dict[str, Any]]:
    columns, data = rows
    return [dict(zip(columns, r, strict=True)) for r in data]


def shape_cost(card: Rows, clusters: Rows, transfers: Rows, f: params.Filters) -> dict[str, Any]:
    """Per cluster and for all of them: what ``gpugap report --cost`` says (its own rows and
    sums, gpugap.cost.report), as a table; null is "no rate": a sum with an unknown part is
    unknown, never 0."""
    info = _named(card)[0] if card[1] else {}
    by_cluster, total, _ = cost.by_cluster_with_egress(_named(clusters), _named(transfers))
    loaded = bool(info.get("card_id"))
    rows = [
        [r.key if c == "cluster" else getattr(r, c) for c in COST_COLUMNS]
        for r in [*by_cluster, total]
    ]
    return {
        "currency": info.get("currency") if loaded else None,
        "rate_card": {"card_id": info["card_id"], "name": info["card_name"],
                      "loaded_at": queries.epoch(info["loaded_at"])} if loaded else None,
        "columns": COST_COLUMNS,
        "rows": [[queries.epoch(v) for v in r] for r in rows],
        "not_applied": {
            "egress": [k for k in ("cluster", "team", "class")
                       if k not in queries.COST_FILTERED["egress"]],
        },
        "filtered": {"team": bool(f.teams), "class": bool(f.classes)},
        "truncated": max(len(clusters[1]), len(transfers[1])) >= queries.MAX_COST_ROWS,
    }  # fmt: skip


async def answer(
    name: str, query: Mapping[str, list[str]], run: Run, now: datetime | None = None
) -> dict[str, Any]:
    """The JSON for one API call; BadRequest for a bad parameter, NotFound for a bad name."""
    if name == "extent":
        if query:
            raise params.BadRequest("extent takes no parameters")
        rec = _record(await run(queries.EXTENT))
        return {"first": rec.get("first_day"), "latest": rec.get("latest_minute")}
    if name == "options":
        if query:
            raise params.BadRequest("options takes no parameters")
        _, data = await run(queries.OPTIONS)
        clusters, teams, classes = data[0] if data else ([], [], [])
        return {"clusters": list(clusters), "teams": list(teams), "classes": list(classes)}
    if name == "allocation":
        key = params.allocation(query)
        meta = await run(queries.allocation_meta(key))
        return shape_allocation(meta, await run(queries.allocation_timeline(key)))
    if name == "job":
        asked = params.job(query)
        outcome = await job.run_async(
            lambda q: run(queries.job_query(q)), job.plan(asked.id, asked.cluster)
        )
        return shape_job(outcome)
    if name == "cost":
        f = params.filters(query, now or datetime.now(UTC))
        card = await run(queries.COST_CARD)
        clusters = await run(queries.cost_clusters(f))
        return shape_cost(card, clusters, await run(queries.cost_transfers(f)), f)
    build = queries.FILTERED.get(name)
    if build is None:
        raise NotFound(name)
    f = params.filters(query, now or datetime.now(UTC))
    if name in ("timeseries", "unallocated"):
        # the charts over time: the range less what is before or after the stored data (the
        # bucket follows what can be drawn: a month over a day of data is that day, hourly)
        ext = _record(await run(queries.EXTENT))
        within = queries.within_data(f, ext.get("first_day"), ext.get("latest_minute"))
        rows = await run(build(within)) if within else ([], [])
        shape = shape_timeseries if name == "timeseries" else shape_unallocated
        return shape(rows, within)
    rows = await run(build(f))
    if name == "summary":
        return shape_summary(rows)
    if name == "padding":
        return shape_padding(rows)
    return _table(rows)
