"""Beside each placement recommendation, the data movement across the boundary (docs/cost.md):
what the workload (else its team) moved between environments in the window, what that cost,
what a GiB costs in the direction the move would send its data, and the GPU-hours saved in
currency, from the rate card. Honest where it cannot know: the data a workload reads inside
its own environment crosses no counter until it moves, so with no transfers recorded the
record says "not measured", never 0.
"""

# ruff: noqa: S608  (the SQL is this module's constants and base.family_where's terms)
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpugap.recommend.base import HistoryWindow
from gpugap.recommend.queries import target_of
from gpugap.schemas.models import Recommendation, RecommendationTarget
from gpugap.warehouse.client import run_query

GIB = 1 << 30
_W = "{since:DateTime64(3, 'UTC')}"
_U = "{until:DateTime64(3, 'UTC')}"

#: every transfer in the window by allocation, team and direction (the transfers table is
#: small beside the minutes; one query for every placement)
TRANSFERS = f"""
SELECT allocation_id, team, from_env, to_env, sum(bytes), sum(cost), countIf(cost IS NULL)
FROM v_transfers
WHERE time >= {_W} AND time < {_U}
GROUP BY allocation_id, team, from_env, to_env
"""
#: the allocations those transfers name, and those of their teams, with what names their
#: workload (queries.target_of)
MEMBERS = f"""
SELECT DISTINCT cluster, scheduler, allocation_id, owner, team, name, partition, owner_kind,
    owner_name
FROM v_allocations
WHERE (allocation_id IN {{ids:Array(String)}} OR team IN {{teams:Array(String)}})
    AND start_time < {_U} AND (end_time IS NULL OR end_time >= {_W})
"""
#: each cluster's environment and default GPU-hour rate; the busiest cluster per scheduler
CARD = """
SELECT cluster, argMax(environment, priority), argMax(gpu_hour_rate, priority), any(currency)
FROM v_rate_card GROUP BY cluster
"""
BUSIEST = f"""
SELECT scheduler, argMax(cluster, n) FROM (
    SELECT scheduler, cluster, count() AS n FROM v_allocations
    WHERE end_time IS NULL OR end_time >= {_W} GROUP BY scheduler, cluster
) GROUP BY scheduler
"""
RATES = """
SELECT cluster, from_env, to_env, per_gib FROM transfer_rate
WHERE updated_at = (SELECT max(updated_at) FROM rate_card)
"""


@dataclass(frozen=True)
class Movement:
    scope: str  # "workload", "team" or "" (no transfers recorded)
    gib_per_week: dict[str, float]  # per direction 'from->to', as measured
    cost_per_week: float | None  # None: some direction has no rate
    src_env: str | None  # the move: where its data is now, where it would go
    dst_env: str | None
    move_per_gib: float | None
    saved_cost_per_week: float | None  # the GPU-hours saved at the source cluster's rate
    currency: str
    #: what the move would send across the boundary: the measured traffic of its scope, all
    #: directions, assumed to follow the workload and cross src->dst (None: not measured)
    move_gib_per_week: float | None = None
    move_cost_per_week: float | None = None  # at move_per_gib; 0 where nothing crosses
    net_per_week: float | None = None  # saved - move cost; None where either is unknown

    @property
    def pays(self) -> bool:
        """A move whose egress costs more than the compute it saves is not proposed; one
        that cannot be weighed (no transfers recorded, no rate) still is, and says so."""
        return self.net_per_week is None or self.net_per_week >= 0


Flow = dict[str, list[float]]  # direction -> [bytes, cost, unrated transfers]


@dataclass
class Boundary:
    """What annotate reads once: the window's transfers by allocation and team, which
    workload each of their allocations belongs to, the rate card."""

    by_alloc: dict[str, Flow]
    by_team: dict[str, Flow]
    allocs: dict[RecommendationTarget, set[str]]
    teams: dict[RecommendationTarget, set[str]]
    clusters: dict[str, dict[str, Any]]
    busiest: dict[str, str]
    rates: dict[tuple[str, str, str], float]
    currency: str


def _add(flows: dict[str, Flow], key: str, direction: str, r: tuple[Any, ...]) -> None:
    f = flows.setdefault(key, {}).setdefault(direction, [0.0, 0.0, 0.0])
    f[0] += float(r[4])
    f[1] += float(r[5] or 0.0)
    f[2] += float(r[6])


def read(client: Any, w: HistoryWindow) -> Boundary:
    window = {"since": w.since, "until": w.until}
    by_alloc: dict[str, Flow] = {}
    by_team: dict[str, Flow] = {}
    for r in run_query(client, TRANSFERS, window).result_rows:
        direction = f"{r[2]}->{r[3]}"
        if r[0]:
            _add(by_alloc, r[0], direction, r)
        if r[1]:
            _add(by_team, r[1], direction, r)
    allocs: dict[RecommendationTarget, set[str]] = defaultdict(set)
    teams: dict[RecommendationTarget, set[str]] = defaultdict(set)
    if by_alloc or by_team:
        params = {**window, "ids": sorted(by_alloc), "teams": sorted(by_team)}
        for r in run_query(client, MEMBERS, params).result_rows:
            meta = dict(zip(("owner", "team", "name", "partition", "owner_kind", "owner_name"),
                            (v or "" for v in r[3:9]), strict=True))  # fmt: skip
            t = target_of({"cluster": r[0], "scheduler": r[1], **meta})
            allocs[t].add(r[2])
            if r[4]:
                teams[t].add(r[4])
    rows = run_query(client, CARD).result_rows
    return Boundary(
        by_alloc, by_team, allocs, teams,
        clusters={r[0]: {"env": r[1], "rate": float(r[2])} for r in rows},
        busiest=dict(run_query(client, BUSIEST, {"since": w.since}).result_rows),
        rates={(r[0], r[1], r[2]): float(r[3]) for r in run_query(client, RATES).result_rows},
        currency=next((r[3] for r in rows if r[3]), ""),
    )  # fmt: skip


def _sum(flows: dict[str, Flow], keys: set[str]) -> Flow:
    out: Flow = {}
    for k in keys:
        for direction, f in flows.get(k, {}).items():
            o = out.setdefault(direction, [0.0, 0.0, 0.0])
            for i in range(3):
                o[i] += f[i]
    return out


def movement(rec: Recommendation, w: HistoryWindow, b: Boundary) -> Movement:
    own = _sum(b.by_alloc, b.allocs.get(rec.target, set()))
    team = _sum(b.by_team, b.teams.get(rec.target, set()))
    scope, picked = ("workload", own) if own else ("team", team) if team else ("", {})
    gib = {k: f[0] / GIB / w.weeks for k, f in picked.items()}
    rated = all(f[2] == 0 for f in picked.values())
    cost = sum(f[1] for f in picked.values()) / w.weeks if rated else None
    here = b.clusters.get(rec.target.cluster) or {}
    there = b.clusters.get(b.busiest.get(rec.change.to_value, "")) or {}
    src, dst = here.get("env"), there.get("env")
    per_gib = b.rates.get((rec.target.cluster, src, dst)) if src and dst and src != dst else None
    rate = here.get("rate")
    saved = rec.saved_gpu_hours_per_week * rate if rate is not None else None
    move_gib = sum(gib.values()) if scope else None
    move_cost = None
    if move_gib is not None and src and dst:
        move_cost = 0.0 if src == dst else move_gib * per_gib if per_gib is not None else None
    net = saved - move_cost if saved is not None and move_cost is not None else None
    return Movement(
        scope, gib, cost, src, dst, per_gib, saved, b.currency, move_gib, move_cost, net
    )


def annotate(
    client: Any,
    w: HistoryWindow,
    recs: list[Recommendation],
    not_worth: list[Recommendation] | None = None,
) -> list[Recommendation]:
    """Placement records with their data movement in figures and rationale; others as is.
    A move whose egress would cost more than the compute it saves is left out (appended,
    with its figures, to ``not_worth``): it is not a recommendation, nor in any total."""
    if not any(r.kind == "placement" for r in recs):
        return recs
    b = read(client, w)
    out = []
    for r in recs:
        if r.kind != "placement":
            out.append(r)
            continue
        m = movement(r, w, b)
        if m.pays:
            out.append(with_movement(r, m))
        elif not_worth is not None:
            not_worth.append(with_movement(r, m))
    return out


def with_movement(rec: Recommendation, m: Movement) -> Recommendation:
    figures = dict(rec.evidence.figures)
    figures["boundary_gib_per_week"] = round(sum(m.gib_per_week.values()), 3)
    if m.cost_per_week is not None and m.scope:
        figures["boundary_cost_per_week"] = round(m.cost_per_week, 2)
    if m.move_per_gib is not None:
        figures["move_egress_per_gib"] = m.move_per_gib
    if m.saved_cost_per_week is not None:
        figures["saved_cost_per_week"] = round(m.saved_cost_per_week, 2)
    if m.move_gib_per_week is not None:
        figures["move_gib_per_week"] = round(m.move_gib_per_week, 3)
    if m.move_cost_per_week is not None:
        figures["move_egress_cost_per_week"] = round(m.move_cost_per_week, 2)
    if m.net_per_week is not None:
        figures["net_saved_cost_per_week"] = round(m.net_per_week, 2)
    evidence = rec.evidence.model_copy(update={"figures": figures})
    text = movement_text(rec, m)
    rationale = f"{rec.rationale} {text}"[:4096]
    if not m.pays:
        rationale = f"Not worth moving: {rationale}"[:4096]
    return rec.model_copy(update={"evidence": evidence, "rationale": rationale})


def movement_text(rec: Recommendation, m: Movement) -> str:
    """What was measured, then what the move itself would send and cost, each in its own
    direction, then the net: never the past traffic of one direction at the other's rate."""
    cur = f" {m.currency}" if m.currency else ""
    if m.scope:
        dirs = ", ".join(f"{k} {v:,.1f} GiB" for k, v in sorted(m.gib_per_week.items()))
        text = f"Data movement: its {m.scope} moved {dirs} a week across the boundary"
        text += (f" ({m.cost_per_week:,.2f}{cur}/week)" if m.cost_per_week is not None
                 else " (some of it at no rate)")  # fmt: skip
    else:
        text = ("Data movement: no transfers recorded for this workload or its team, so the "
                "data the move would send across the boundary is not measured")  # fmt: skip
    crosses = m.src_env and m.dst_env and m.src_env != m.dst_env
    if crosses:
        rate = f"{m.move_per_gib:g}{cur}/GiB" if m.move_per_gib is not None else "no rate"
        text += f"; moved, its data crosses {m.src_env}->{m.dst_env} at {rate}"
        if m.move_gib_per_week is not None:
            text += (f": {m.move_gib_per_week:,.1f} GiB a week if that traffic follows it"
                     + (f", {m.move_cost_per_week:,.2f}{cur}/week of egress"
                        if m.move_cost_per_week is not None else ", at no known rate"))  # fmt: skip
    if m.saved_cost_per_week is not None:
        text += (f"; the GPU-hours saved are worth {m.saved_cost_per_week:,.2f}{cur}/week at "
                 f"{rec.target.cluster}'s rate")  # fmt: skip
    if m.net_per_week is not None and crosses:
        text += f"; net {m.net_per_week:,.2f}{cur}/week"
    return text + "."
