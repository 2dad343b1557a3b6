"""``gpugap job ID``: one allocation, for the person who ran it: allocated, consumed and the
gap (the views' figures), each GPU's utilisation and memory over time, idle stretches, Slurm
padding, the queue wait, and advice from ``gpugap recommend``'s rules (job_advice.py).

The id is what its user knows: a Slurm job id (``12345``), an array task (``12345_7``), a run
after a requeue (``12345#1``), a pod as ``namespace/name`` or by its UID, or the allocation id
itself (``slurm/CLUSTER/12345``, ``k8s/CLUSTER/UID``). One that names several allocations
(runs, clusters, pods of one name) lists them (``Ambiguous``); one that names none is
``Unknown``.

A report is a plan (``plan``): batches of fixed queries (job_queries.py) and the rows they
return, the report at the end; pure, so the command (``run``, a clickhouse-connect client)
and the page (``run_async``, its query threads) share it::

    from gpugap.job.report import job_report
    outcome = job_report(settings.clickhouse, "12345", cluster=None)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from datetime import timedelta
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.job import advice as advise
from gpugap.job import queries as jq
from gpugap.job import rows as shape
from gpugap.job.models import (
    Ambiguous,
    JobReport,
    OpenRecommendation,
    Outcome,
    Unknown,
)
from gpugap.job.rows import Rows
from gpugap.recommend.base import family_where
from gpugap.recommend.fit import PEAK_QUANTILE as FIT_QUANTILE
from gpugap.recommend.model import PEAK_QUANTILE as MODEL_QUANTILE
from gpugap.recommend.queries import target_of
from gpugap.schemas.errors import ConfigError

Batch = dict[str, jq.Query]
Plan = Generator[Batch, dict[str, Rows], Outcome]
FORMS = "a Slurm job id (12345, 12345_7, 12345#1), namespace/pod, a pod UID or an allocation id"


def plan(ident: str, cluster: str | None = None) -> Plan:  # noqa: PLR0915 (one report)
    """The report of the allocation ``ident`` names (in ``cluster``): batches of queries
    out, their rows in; Unknown, Ambiguous or the JobReport back."""
    try:
        resolve = jq.resolve(ident, cluster)
    except ValueError as exc:
        raise ConfigError(f"job id {ident[:80]!r}: {exc}") from None
    found = shape.records((yield {"resolve": resolve})["resolve"])
    where = f" in cluster {cluster!r}" if cluster else ""
    if not found:
        msg = f"no allocation matches {ident!r}{where} ({FORMS})"
        return Unknown(id=ident, cluster=cluster, message=msg)
    if int(found[0]["matches"]) > 1:
        cands = [shape.candidate(m) for m in found]
        return Ambiguous(id=ident, cluster=cluster, matches=int(found[0]["matches"]),
                         candidates=cands)  # fmt: skip
    meta = found[0]
    a = shape.allocation(meta)
    c, aid = a.cluster, a.allocation_id
    target = target_of({k: meta[k] or "" for k in ("cluster", "scheduler", "owner", "team",
                                                    "name", "partition", "owner_kind",
                                                    "owner_name")})  # fmt: skip
    batch: Batch = {
        "totals": jq.totals(c, aid),
        "gpus": jq.per_gpu(c, aid, FIT_QUANTILE),
        "peaks": jq.peaks(c, aid, FIT_QUANTILE, MODEL_QUANTILE),
        "padding": jq.padding(c, aid),
        "queue": jq.queue_wait(c, aid, a.gang_id),
        "rate_model": jq.rate_model(c),
        "recommendations": jq.recommendations(c, target),
    }
    if a.scheduler == "slurm" and a.final_state == "COMPLETED" and a.end_time:
        sql, params = family_where(target)
        since = a.end_time - timedelta(days=advise.HISTORY_DAYS)
        batch["family"] = jq.family(sql, params, since, a.end_time)
    got = yield batch
    totals = shape.records(got["totals"])[0]
    gpu_rows = shape.records(got["gpus"])
    gpus = [shape.gpu(r) for r in gpu_rows]
    peaks = shape.records(got["peaks"])[0]
    peaks["measured_gpu_h"] = sum(g.measured_gpu_h for g in gpus)
    n, needed = advise.needed_gpus(gpus)
    consumed = sum(g.consumed_gpu_h for g in gpus)
    notes: list[str] = []
    series, idle, lengths, model_advice = None, None, [], None
    if gpu_rows:
        first = min(shape.utc(r["first_hour"]) or shape.EPOCH for r in gpu_rows)
        last = max(shape.utc(r["last_hour"]) or shape.EPOCH for r in gpu_rows)
        step_s, points = shape.series_step(first, last, len(gpus))
        later: Batch = {
            "series": jq.series(c, aid, first, last, step_s),
            "idle": jq.idle(c, aid, first, last),
        }
        worth = advise.model_worth_asking(peaks, peaks["measured_gpu_h"], consumed)
        if worth:
            end = last + timedelta(hours=1)
            later["nodes"] = jq.node_models(c, sorted({g.node for g in gpus}), first, end)
            later["estate"] = jq.estate(first, end)
        more = yield later
        series = shape.series(more["series"], gpus, first, step_s, points)
        idle_row = shape.records(more["idle"])[0]
        idle, lengths = shape.idle(idle_row), [int(x) for x in idle_row["lengths"]]
        if worth:
            use = (peaks["measured_gpu_h"], consumed, needed)
            model_advice = advise.gpu_model(
                a, target=target, peaks=peaks, use=use, nodes=more["nodes"][1],
                estate=more["estate"][1],
            )  # fmt: skip
        notes.append(f"over time: {step_s // 60}-minute buckets (UTC)")
    else:
        notes.append("no GPU-hour of it is stored: no telemetry reached the warehouse")
    if a.end_time is None:
        notes.append("still running (or its end is not known): figures up to the latest data")
    family = shape.records(got["family"])[0] if "family" in got else None
    card = str(got["rate_model"][1][0][0]) if got["rate_model"][1] else ""
    advice = [
        advise.gpu_count(a, gpus),
        advise.time_limit(a, family),
        advise.gpu_share(a, peaks, card, needed),
        model_advice,
        advise.idle_culling(a, idle, lengths, n),
    ]
    return JobReport(
        allocation=a,
        figures=shape.figures(totals),
        gpus=gpus,
        series=series,
        idle=idle,
        padding=shape.padding(got["padding"]),
        queue=shape.queue_wait(got["queue"], gang=bool(a.gang_id)),
        advice=[x for x in advice if x is not None],
        recommendations=[OpenRecommendation(**r) for r in shape.records(got["recommendations"])],
        notes=notes,
    )  # fmt: skip


def _rows(result: Any) -> Rows:
    return list(result.column_names), list(result.result_rows)


def run(client: Any, p: Plan) -> Outcome:
    """Drive a plan with a clickhouse-connect client (read-only queries, in turn)."""
    from gpugap.warehouse.client import run_query

    try:
        batch = next(p)
        while True:
            batch = p.send({k: _rows(run_query(client, q.sql, q.params)) for k, q in batch.items()})
    except StopIteration as done:
        return done.value


async def run_async(runner: Callable[[jq.Query], Awaitable[Rows]], p: Plan) -> Outcome:
    """Drive a plan with an async query runner (the page's), each batch's queries at once."""
    try:
        batch = next(p)
        while True:
            names = list(batch)
            rows = await asyncio.gather(*(runner(batch[k]) for k in names))
            batch = p.send(dict(zip(names, rows, strict=True)))
    except StopIteration as done:
        return done.value


def job_report(settings: ClickHouseSettings, ident: str, cluster: str | None = None) -> Outcome:
    """Connect, report, close: the one call for a caller holding settings."""
    from gpugap.warehouse.client import connect

    client = connect(settings)
    try:
        return run(client, plan(ident, cluster))
    finally:
        client.close()
