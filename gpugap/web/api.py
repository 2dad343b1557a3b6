"""The page's API: a name, the browser's parameters, and the JSON of the named queries.

``answer(name, query, run)`` validates the parameters (``gpugap.web.params``), runs the fixed
queries of that name (``gpugap.web.queries``) through ``run`` and shapes the rows for the
page: tables as columns and rows, charts as one array per series (times in epoch seconds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpugap.web import params, queries
from gpugap.web.queries import Query

Rows = tuple[list[str], list[Sequence[Any]]]
Run = Callable[[Query], Awaitable[Rows]]
NAMES = ("extent", "options", "allocation", *queries.FILTERED)


class NotFound(KeyError):
    """No query of that name."""


def _table(rows: Rows) -> dict[str, Any]:
    columns, data = rows
    return {"columns": columns, "rows": [[queries.epoch(v) for v in r] for r in data]}


def _record(rows: Rows) -> dict[str, Any]:
    columns, data = rows
    return {c: queries.epoch(v) for c, v in zip(columns, data[0], strict=True)} if data else {}


def _series(rows: Rows, step_h: int) -> tuple[list[int], dict[str, dict[int, float]]]:
    """(the buckets in order, {column: {bucket: value}}), values as average GPUs."""
    columns, data = rows
    times = sorted({queries.epoch(r[0]) for r in data})
    out: dict[str, dict[int, float]] = {c: {} for c in columns[1:]}
    for r in data:
        t = queries.epoch(r[0])
        for c, v in zip(columns[1:], r[1:], strict=True):
            if isinstance(v, (int, float)):
                out[c][t] = out[c].get(t, 0.0) + v / step_h
    return times, out


def shape_timeseries(rows: Rows, f: params.Filters) -> dict[str, Any]:
    grain, step_h = queries.buckets(f)
    data = rows[1]
    times = sorted({queries.epoch(r[0]) for r in data})
    index = {t: i for i, t in enumerate(times)}
    totals = {k: [0.0] * len(times) for k in ("allocated", "consumed", "gap", "unmeasured")}
    per_group: dict[str, list[float]] = {}
    for t, g, allocated, consumed, gap, unmeasured in data:
        i = index[queries.epoch(t)]
        for k, v in (("allocated", allocated), ("consumed", consumed), ("gap", gap),
                     ("unmeasured", unmeasured)):  # fmt: skip
            totals[k][i] += v / step_h
        name = g or "(none)"
        per_group.setdefault(name, [0.0] * len(times))[i] += gap / step_h
    ranked = sorted(per_group, key=lambda n: (-sum(per_group[n]), n))
    groups = [(n, per_group[n]) for n in ranked[: queries.MAX_GROUPS]]
    rest = ranked[queries.MAX_GROUPS :]
    if rest:
        other = [sum(per_group[n][i] for n in rest) for i in range(len(times))]
        groups.append((f"other ({len(rest)})", other))
    return {
        "grain": grain,
        "step_h": step_h,
        "by": f.by,
        "t": times,
        **{k: [round(v, 4) for v in vs] for k, vs in totals.items()},
        "groups": [{"name": n, "gap": [round(v, 4) for v in gap]} for n, gap in groups],
    }


def shape_unallocated(rows: Rows, f: params.Filters) -> dict[str, Any]:
    grain, step_h = queries.buckets(f)
    times, series = _series(rows, step_h)
    return {
        "grain": grain,
        "step_h": step_h,
        "t": times,
        **{k: [round(series[k].get(t, 0.0), 4) for t in times] for k in series},
        "unallocated_gpu_h": round(sum(v * step_h for v in series["unallocated"].values()), 4),
        "unattributed_gpu_h": round(sum(v * step_h for v in series["unattributed"].values()), 4),
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
    build = queries.FILTERED.get(name)
    if build is None:
        raise NotFound(name)
    f = params.filters(query, now or datetime.now(UTC))
    rows = await run(build(f))
    if name == "timeseries":
        return shape_timeseries(rows, f)
    if name == "unallocated":
        return shape_unallocated(rows, f)
    if name == "summary":
        return shape_summary(rows)
    if name == "padding":
        return shape_padding(rows)
    return _table(rows)
