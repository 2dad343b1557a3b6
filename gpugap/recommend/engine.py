"""Compute the recommendations from the warehouse, store them, record decisions on them.

gpugap never changes a scheduler: a recommendation is a record, a decision is a row in the
append-only ``recommendation_decisions`` table, and an accepted one prints what a person runs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.recommend import logic
from gpugap.recommend.logic import Window
from gpugap.recommend.queries import (
    gpu_families,
    notebooks,
    partial_gangs,
    slurm_families,
    window,
)
from gpugap.report.query import run_query
from schemas.errors import ConfigError
from schemas.models import Recommendation, RecommendationTarget
from schemas.types import utc_now
from sinks.clickhouse.sink import RECOMMENDATION_COLUMNS, recommendation_row

DECISIONS = ("accept", "reject", "defer")
DEFAULT_DAYS = 14.0  # KRR's default history (336 h)


def compute(
    client: Any,
    days: float = DEFAULT_DAYS,
    until: datetime | None = None,
    now: datetime | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[Window, list[Recommendation]]:
    """Every recommender over the last ``days`` of data, ranked by GPU-hours saved."""
    import time

    now = now or utc_now()
    marks: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        marks[name] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()

    w = window(client, days, until)
    lap("window")
    recs: list[Recommendation | None] = [
        logic.time_limit(f, w, now) for f in slurm_families(client, w)
    ]
    lap("slurm_time_limit")
    recs += [logic.gpu_count(f, w, now) for f in gpu_families(client, w)]
    lap("gpu_count")
    books: dict[RecommendationTarget, list[logic.NotebookIdle]] = defaultdict(list)
    for b in notebooks(client, w):
        books[b.target].append(b)
    recs += [logic.idle_culling(target, bs, w, now) for target, bs in books.items()]
    lap("idle_culling")
    gangs: dict[RecommendationTarget, list[logic.PartialGang]] = defaultdict(list)
    for g in partial_gangs(client, w):
        gangs[g.target].append(g)
    recs += [logic.placement(target, gs, w, now) for target, gs in gangs.items()]
    lap("placement")
    if timings is not None:
        timings.update(marks)
    return w, logic.rank(recs)


def store(client: Any, recs: Sequence[Recommendation]) -> None:
    """Into ``recommendations`` (the sink's row for recommendations.v1): the same id replaces
    its earlier row."""
    if recs:
        rows = [recommendation_row(r) for r in recs]
        client.insert("recommendations", rows, column_names=RECOMMENDATION_COLUMNS)


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
    rows = run_query(
        client,
        "SELECT record FROM recommendations FINAL WHERE id = {id:String}",
        {"id": rec_id},
    ).result_rows
    if not rows:
        raise ConfigError(
            f"no recommendation {rec_id!r} (gpugap recommend list shows the ids; "
            "gpugap recommend compute writes them)"
        )
    return Recommendation.model_validate(json.loads(rows[0][0]))


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
    rec = get(client, rec_id)
    d = Decision(rec.id, decision, by.strip(), why.strip(), now or utc_now())
    client.insert(
        "recommendation_decisions",
        [
            [
                d.id, d.decision, d.decided_by, d.reason, d.decided_at, rec.kind,
                recommendation_target_text(rec), rec.change.parameter, rec.change.from_value,
                rec.change.to_value, rec.saved_gpu_hours_per_week, rec.confidence,
            ]
        ],
        column_names=[
            "id", "decision", "decided_by", "reason", "decided_at", "kind", "target",
            "parameter", "from_value", "to_value", "saved_gpu_h_per_week", "confidence",
        ],
    )  # fmt: skip
    return rec, d


def recommendation_target_text(rec: Recommendation) -> str:
    from sinks.clickhouse.sink import recommendation_target

    return recommendation_target(rec)


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


# --- the follow-up: the target's gap after an accepted change, beside the expectation -----

FOLLOWUP_TIME = """
SELECT count(), sum(gpus_requested * greatest(time_limit_s - elapsed_s, 0)) / 3600
FROM v_slurm_padding
WHERE cluster = {cluster:String} AND user = {user:String} AND account = {account:String}
    AND name = {name:String} AND partition = {partition:String}
    AND start_time >= {after:DateTime64(3, 'UTC')} AND end_time < {until:DateTime64(3, 'UTC')}
"""


@dataclass(frozen=True)
class FollowUp:
    since: datetime
    weeks: float
    jobs: int
    measured_per_week: float  # the target's waste of this kind per week since the decision
    before_per_week: float  # the same, as the recommendation found it (before)
    expected_per_week: float  # before - saved


def follow_up(client: Any, rec: Recommendation, accepted_at: datetime) -> FollowUp | None:
    """For a Slurm --time change: the padding GPU-hours per week of the family's jobs that
    started after the acceptance, beside what it was and what the change expected. Other
    kinds: not measured yet (None)."""
    if rec.kind != "slurm_time_limit":
        return None
    t = rec.target
    latest = window(client, 1.0).until
    if latest <= accepted_at:
        return FollowUp(accepted_at, 0.0, 0, 0.0, 0.0, 0.0)
    r = run_query(
        client,
        FOLLOWUP_TIME,
        {
            "cluster": t.cluster, "user": t.user or "", "account": t.account or "",
            "name": t.job_name or "", "partition": t.partition or "", "after": accepted_at,
            "until": latest,
        },
    ).result_rows[0]  # fmt: skip
    weeks = max((latest - accepted_at) / timedelta(days=7), 1 / 7)
    before = (
        rec.evidence.figures.get("padding_gpu_h", 0.0) * 7 / max(rec.evidence.history_days, 1.0)
    )
    return FollowUp(
        accepted_at,
        weeks,
        int(r[0]),
        float(r[1] or 0.0) / weeks,
        before,
        max(before - rec.saved_gpu_hours_per_week, 0.0),
    )
