"""The follow-up of an accepted recommendation: the target's waste of its kind in the weeks
after the decision, beside what it was when recommended and what the change expected.

- a Slurm ``--time``: the padding (GPUs x (limit - elapsed)) of the family's jobs that
  started after the acceptance;
- every other kind: the gap (measured GPU-hours not consumed, v_capacity_gap) of the
  target's allocations in the hours after the acceptance. A workload moved to the other
  scheduler leaves none behind: its gap there is 0 and its new home is a new target.
"""

# ruff: noqa: S608  (the SQL is this module's constants and base.family_where's terms)
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpugap.recommend.base import family_where
from gpugap.recommend.queries import window
from gpugap.schemas.models import Recommendation
from gpugap.warehouse.client import run_query

_AFTER = "{after:DateTime64(3, 'UTC')}"
_UNTIL = "{until:DateTime64(3, 'UTC')}"
PADDING = f"""
SELECT count(), sum(gpus_requested * greatest(time_limit_s - elapsed_s, 0)) / 3600
FROM v_slurm_padding
WHERE cluster = {{cluster:String}} AND user = {{user:String}} AND account = {{account:String}}
    AND name = {{name:String}} AND partition = {{partition:String}}
    AND start_time >= {_AFTER} AND end_time < {_UNTIL}
"""
GAP = f"""
SELECT uniqExact(allocation_id), sum(gap_gpu_h)
FROM v_capacity_gap
WHERE hour >= {_AFTER} AND hour < {_UNTIL}
    AND allocation_id IN (SELECT allocation_id FROM v_allocations WHERE {{family}})
"""


@dataclass(frozen=True)
class FollowUp:
    measure: str  # "padding" or "gap"
    since: datetime
    weeks: float
    allocations: int  # jobs or pods measured since the decision
    measured_per_week: float  # the target's waste of this kind per week since the decision
    before_per_week: float  # the same, as the recommendation found it (before)
    expected_per_week: float  # before - saved


def _weeks(since: datetime, until: datetime) -> float:
    return max((until - since) / timedelta(days=7), 1 / 7)


def _padding(client: Any, rec: Recommendation, after: datetime, until: datetime) -> tuple[
    int, float, float
]:  # fmt: skip
    t = rec.target
    r = run_query(client, PADDING, {
        "cluster": t.cluster, "user": t.user or "", "account": t.account or "",
        "name": t.job_name or "", "partition": t.partition or "", "after": after, "until": until,
    }).result_rows[0]  # fmt: skip
    e = rec.evidence
    before = e.figures.get("padding_gpu_h", 0.0) * 7 / max(e.history_days, 1.0)
    return int(r[0]), float(r[1] or 0.0), before


def _gap(client: Any, rec: Recommendation, after: datetime, until: datetime) -> tuple[
    int, float, float
]:  # fmt: skip
    family, params = family_where(rec.target)
    sql = GAP.replace("{family}", family)
    r = run_query(client, sql, {**params, "after": after, "until": until}).result_rows[0]
    e = rec.evidence
    was = run_query(client, sql, {**params, "after": e.since, "until": e.until}).result_rows[0]
    before = float(was[1] or 0.0) * 7 / max(e.history_days, 1.0)
    return int(r[0]), float(r[1] or 0.0), before


def follow_up(client: Any, rec: Recommendation, accepted_at: datetime) -> FollowUp:
    """The target since ``accepted_at`` (to the latest data), beside the expectation."""
    measure = "padding" if rec.kind == "slurm_time_limit" else "gap"
    latest = window(client, 1.0).until
    if latest <= accepted_at:
        return FollowUp(measure, accepted_at, 0.0, 0, 0.0, 0.0, 0.0)
    n, waste, before = (_padding if measure == "padding" else _gap)(
        client, rec, accepted_at, latest
    )
    weeks = _weeks(accepted_at, latest)
    expected = max(before - rec.saved_gpu_hours_per_week, 0.0)
    return FollowUp(measure, accepted_at, weeks, n, waste / weeks, before, expected)
