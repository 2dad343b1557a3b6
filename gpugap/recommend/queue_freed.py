"""``--time`` recommendations with the queue hours they free for others: the family's
partition replayed through the backfill model (gpugap.queue) with the limits as asked and
with only this family's right-sized, the difference in everyone else's GPU-hours waited."""

from __future__ import annotations

from typing import Any

from gpugap.queue.cost import selection_cost
from gpugap.queue.warehouse import recorded_partitions
from gpugap.recommend.base import HistoryWindow
from gpugap.schemas.models import Recommendation

#: the most saving recommendations replayed (each costs REPEATS replays of its partition)
TOP = 10
REPEATS = 3


def family_key(rec: Recommendation) -> str:
    """The family as gpugap.queue.warehouse.family names it."""
    t = rec.target
    parts = (t.cluster, t.user, t.account, t.job_name, t.partition)
    return "\x1f".join(p or "" for p in parts)


def annotate(client: Any, w: HistoryWindow, recs: list[Recommendation]) -> list[Recommendation]:
    """The TOP saving time-limit records with "queue hours freed for others"; others as is."""
    chosen = sorted(
        (r for r in recs if r.kind == "slurm_time_limit"),
        key=lambda r: (-r.saved_gpu_hours_per_week, r.id),
    )[:TOP]
    if not chosen:
        return recs
    parts = {(p.cluster, p.partition): p for p in recorded_partitions(client, w.since, w.until)}
    done: dict[str, Recommendation] = {}
    for rec in chosen:
        p = parts.get((rec.target.cluster, rec.target.partition or ""))
        if p is None:
            continue
        fam = family_key(rec)
        ids = {j.id for j in p.jobs if j.family == fam}
        if not ids:
            continue
        limits = {fam: float(rec.change.to_value)}
        others, _own = selection_cost(p.jobs, p.shape, limits, ids, repeats=REPEATS)
        figures = dict(rec.evidence.figures)
        figures["queue_gpu_h_freed_for_others"] = round(others.mean, 3)
        figures["queue_gpu_h_freed_for_others_low"] = round(others.low, 3)
        figures["queue_gpu_h_freed_for_others_high"] = round(others.high, 3)
        noise = "" if others.clear else "; the replays disagree on the sign: within the noise"
        text = (
            f"Queue: replaying {p.partition}'s {len(p.jobs):,} jobs with this family's limits "
            f"right-sized frees {others.mean:,.1f} GPU-hours of other jobs' waiting "
            f"({others.low:,.1f} to {others.high:,.1f} over {REPEATS} replays{noise}; "
            "docs/queue.md)"
        )
        evidence = rec.evidence.model_copy(update={"figures": figures})
        rationale = f"{rec.rationale} {text}."[:4096]
        done[rec.id] = rec.model_copy(update={"evidence": evidence, "rationale": rationale})
    return [done.get(r.id, r) for r in recs]
