"""Compute the recommendations from the warehouse, publish them, record decisions on them.

gpugap never changes a scheduler: a recommendation is a record, a decision is a row in the
append-only ``recommendation_decisions`` table, and an accepted one prints what a person runs.

Recommendations reach the warehouse one way: published on ``recommendations.v1``, stored by
the ClickHouse sink (``gpugap sink clickhouse``) like every other topic it reads. Nothing here
writes the ``recommendations`` table; the reads (list, show, decisions) query it.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpugap.recommend import (
    batch,
    boundary,
    fit,
    interactive,
    model,
    packing,
    placement,
    queue_freed,
    services,
    stranding,
)
from gpugap.recommend.base import HistoryWindow, rank
from gpugap.recommend.capacity_queries import estate, model_uses, spread_runs, strandings
from gpugap.recommend.queries import (
    gpu_families,
    notebooks,
    partial_gangs,
    slurm_families,
    window,
)
from gpugap.recommend.usage_queries import gpu_uses, service_demand
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.models import Recommendation, RecommendationTarget
from gpugap.schemas.types import utc_now
from gpugap.warehouse.client import run_query

if TYPE_CHECKING:
    from gpugap.groundfloor.kafka.publish import Publisher
    from gpugap.groundfloor.settings import KafkaSettings

DECISIONS = ("accept", "reject", "defer")
DEFAULT_DAYS = 14.0  # KRR's default history (336 h)


Found = list[Recommendation | None]


def _time_limits(client: Any, w: HistoryWindow, now: datetime) -> Found:
    return [batch.time_limit(f, w, now) for f in slurm_families(client, w)]


def _gpu_counts(client: Any, w: HistoryWindow, now: datetime) -> Found:
    return [batch.gpu_count(f, w, now) for f in gpu_families(client, w)]


def _culling(client: Any, w: HistoryWindow, now: datetime) -> Found:
    books: dict[RecommendationTarget, list[interactive.NotebookIdle]] = defaultdict(list)
    for b in notebooks(client, w):
        books[b.target].append(b)
    return [interactive.idle_culling(t, bs, w, now) for t, bs in books.items()]


def _gangs(client: Any, w: HistoryWindow, now: datetime) -> Found:
    gangs: dict[RecommendationTarget, list[placement.PartialGang]] = defaultdict(list)
    for g in partial_gangs(client, w):
        gangs[g.target].append(g)
    return [placement.placement(t, gs, w, now) for t, gs in gangs.items()]


def _services(client: Any, w: HistoryWindow, now: datetime) -> Found:
    """Kubernetes services by hour of day; variable Slurm services to Kubernetes."""
    out: Found = []
    for d in service_demand(client, w):
        out += [services.service_schedule(d, w, now), placement.to_kubernetes(d, w, now)]
    return out


def _shares(client: Any, w: HistoryWindow, now: datetime) -> Found:
    return [fit.gpu_share(u, w, now) for u in gpu_uses(client, w)]


def _models(client: Any, w: HistoryWindow, now: datetime) -> Found:
    uses = model_uses(client, w)
    if not uses:
        return []
    models = estate(client, w)
    return [model.gpu_model(u, models, w, now) for u in uses]


def _strandings(client: Any, w: HistoryWindow, now: datetime) -> Found:
    return [stranding.cpus_per_gpu(s, w, now) for s in strandings(client, w)]


def _spread(client: Any, w: HistoryWindow, now: datetime) -> Found:
    runs: dict[tuple[RecommendationTarget, float], list[packing.SpreadRun]] = defaultdict(list)
    for r in spread_runs(client, w):
        runs[r.target, r.gpus].append(r)
    return [packing.pack_nodes(t, rs, w, now) for (t, _), rs in runs.items()]


#: every recommender, by the name its timing is reported under
RECOMMENDERS: dict[str, Callable[[Any, HistoryWindow, datetime], Found]] = {
    "slurm_time_limit": _time_limits,
    "gpu_count": _gpu_counts,
    "idle_culling": _culling,
    "placement": _gangs,
    "services": _services,
    "gpu_share": _shares,
    "gpu_model": _models,
    "cpus_per_gpu": _strandings,
    "pack_nodes": _spread,
}


def compute(
    client: Any,
    days: float = DEFAULT_DAYS,
    until: datetime | None = None,
    now: datetime | None = None,
    timings: dict[str, float] | None = None,
    *,
    not_worth: list[Recommendation] | None = None,
) -> tuple[HistoryWindow, list[Recommendation]]:
    """Every recommender over the last ``days`` of data, ranked by GPU-hours saved. Moves
    whose egress would cost more than they save are left out (into ``not_worth``)."""
    now = now or utc_now()
    t = time.perf_counter()
    w = window(client, days, until)
    marks = {"window": (time.perf_counter() - t) * 1000}
    recs: Found = []
    for name, recommend in RECOMMENDERS.items():
        t = time.perf_counter()
        recs += recommend(client, w, now)
        marks[name] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    ranked = boundary.annotate(client, w, rank(recs), not_worth)
    marks["boundary"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    ranked = queue_freed.annotate(client, w, ranked)
    marks["queue"] = (time.perf_counter() - t) * 1000
    if timings is not None:
        timings.update(marks)
    return w, ranked


async def send(publisher: Publisher, recs: Sequence[Recommendation]) -> int:
    """The records on ``recommendations.v1`` through ``publisher`` (flushed by its close),
    keyed by id: a recomputed one replaces its predecessor in the sink's ReplacingMergeTree
    and in a compacted topic."""
    from gpugap.schemas.topics import RECOMMENDATIONS

    for r in recs:
        await publisher.send(RECOMMENDATIONS, r)
    return len(recs)


def publish(recs: Sequence[Recommendation], kafka: KafkaSettings, out: str | None = None) -> int:
    """Publish on ``recommendations.v1``: to Kafka (``kafka``, its topic prefix included),
    or with ``out`` JSON lines to that file (``-``: stdout) instead. Returns once every record
    is acknowledged (Kafka: acks=all); the ClickHouse sink stores them from the topic."""
    import asyncio

    from gpugap.groundfloor.kafka.publish import open_publisher

    async def run() -> int:
        async with open_publisher(out, kafka) as pub:
            return await send(pub, recs)

    return asyncio.run(run())


LIST = """
SELECT id, kind, target, parameter, from_value, to_value, saved_gpu_h_per_week, confidence,
    workload_class, decision, decided_by, computed_at
FROM v_recommendations
WHERE (current OR {all:UInt8}) AND (decision != 'reject' OR {all:UInt8})
ORDER BY saved_gpu_h_per_week DESC, id
LIMIT {top:UInt32}
"""


def listing(client: Any, top: int = 20, everything: bool = False) -> list[dict[str, Any]]:
    """Current recommendations not rejected, by GPU-hours saved (``everything``: all)."""
    result = run_query(client, LIST, {"all": int(everything), "top": top})
    return [dict(zip(result.column_names, r, strict=True)) for r in result.result_rows]


def get(client: Any, rec_id: str) -> Recommendation:
    return _stored(client, rec_id)[0]


def _stored(client: Any, rec_id: str) -> tuple[Recommendation, str]:
    """The stored record and its target as the sink wrote it."""
    rows = run_query(
        client,
        "SELECT record, target FROM recommendations FINAL WHERE id = {id:String}",
        {"id": rec_id},
    ).result_rows
    if not rows:
        raise ConfigError(
            f"no recommendation {rec_id!r} (gpugap recommend list shows the ids; "
            "gpugap recommend compute publishes them and the ClickHouse sink stores them)"
        )
    return Recommendation.model_validate(json.loads(rows[0][0])), str(rows[0][1])


@dataclass(frozen=True)
class Decision:
    id: str
    decision: str
    decided_by: str
    reason: str
    decided_at: datetime


def decide(
    client: Any, rec_id: str, decision: str, *, by: str, why: str, now: datetime | None = None
) -> tuple[Recommendation, Decision]:
    """Append a decision (append-only: earlier ones stay; the latest is the state)."""
    if decision not in DECISIONS:
        raise ConfigError(f"decision {decision!r}: choose one of {', '.join(DECISIONS)}")
    if not by.strip():
        raise ConfigError("--by: say who decides")
    if not why.strip():
        raise ConfigError("--why: say why (it is the audit trail)")
    rec, target = _stored(client, rec_id)
    d = Decision(rec.id, decision, by.strip(), why.strip(), now or utc_now())
    client.insert(
        "recommendation_decisions",
        [
            [
                d.id, d.decision, d.decided_by, d.reason, d.decided_at, rec.kind,
                target, rec.change.parameter, rec.change.from_value,
                rec.change.to_value, rec.saved_gpu_hours_per_week, rec.confidence,
            ]
        ],
        column_names=[
            "id", "decision", "decided_by", "reason", "decided_at", "kind", "target",
            "parameter", "from_value", "to_value", "saved_gpu_h_per_week", "confidence",
        ],
    )  # fmt: skip
    return rec, d


def decisions(client: Any, rec_id: str | None = None) -> list[Decision]:
    """The audit trail, newest first (one recommendation's, or all)."""
    rows = run_query(
        client,
        "SELECT id, decision, decided_by, reason, decided_at FROM v_recommendation_decisions "
        "WHERE {id:String} = '' OR id = {id:String}",
        {"id": rec_id or ""},
    ).result_rows
    return [
        Decision(r[0], r[1], r[2], r[3], r[4].replace(tzinfo=UTC) if r[4].tzinfo is None else r[4])
        for r in rows
    ]
