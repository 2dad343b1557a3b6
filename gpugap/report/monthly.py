"""The monthly report per team and per user (``gpugap monthly-report``), built from the
warehouse views: GPU-hours allocated, consumed and gap (``v_capacity_gap_daily``, whole UTC
days of the calendar month), the team's rank among teams by absolute waste, its most wasteful
jobs and their owners, the open recommendations for its jobs (``v_recommendations_open``),
and how long its work waited for GPUs (``v_queue_wait``, by the month the wait ended).

Ranks count from the most waste: 1 + the number with strictly more gap GPU-hours (ties share
a rank). Teams are ranked among every team with allocations in the month (rows without a team
are in no team); users among the owners of their team. A user's report covers the teams in
scope. Rendering and mailing: monthly_mail.py and monthly_send.py.
"""

# ruff: noqa: S608  (the SQL is this module's constants; every value is a bound parameter)
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gpugap.schemas.errors import ConfigError
from gpugap.warehouse.client import run_query

_SUMS = (
    "sum(allocated_gpu_h) AS allocated, sum(consumed_gpu_h) AS consumed, "
    "sum(gap_gpu_h) AS gap, sum(unmeasured_gpu_h) AS unmeasured"
)
_MONTH = "FROM v_capacity_gap_daily WHERE day >= {d0:Date} AND day < {d1:Date}"
_TEAMS = " AND team IN {teams:Array(String)}"
TEAM_TOTALS = f"SELECT team, {_SUMS} {_MONTH} AND team != '' GROUP BY team"
USER_TOTALS = f"SELECT team, owner, {_SUMS} {_MONTH}{_TEAMS} AND owner != '' GROUP BY team, owner"
# per team or per owner: KEY is one of those two column names, put in by _details
DAILY = f"SELECT KEY AS k, day, {_SUMS} {_MONTH}{_TEAMS} GROUP BY k, day"
TOP_JOBS = (
    "SELECT KEY AS k, cluster, allocation_id, any(owner), any(team), any(workload_class), "
    f"{_SUMS} {_MONTH}{_TEAMS} AND KEY != '' GROUP BY k, cluster, allocation_id "
    "ORDER BY k, gap DESC, allocation_id LIMIT {top:UInt32} BY k"
)
_WAITED = (
    "FROM v_queue_wait WHERE start_time >= {since:DateTime64(3, 'UTC')} "
    "AND start_time < {until:DateTime64(3, 'UTC')}" + _TEAMS
)
QUEUE = (
    f"SELECT KEY AS k, count(), avg(wait_s), max(wait_s), sum(gpu_h_waited) {_WAITED} GROUP BY k"
)
_OPEN = (
    "SELECT KEY AS k, o.id, o.kind, o.target, o.parameter, o.from_value, "
    "o.to_value, o.saved_gpu_h_per_week, o.confidence FROM v_recommendations_open AS o "
    "INNER JOIN (SELECT id, scheduler AS sched, cluster AS cl, user AS rec_user, "
    "if(scheduler = 'kubernetes', namespace, account) AS scope FROM recommendations FINAL) "
    "AS r ON r.id = o.id "
)
# a team's: Slurm job families of its account, Kubernetes workloads in the namespaces its pods
# ran in during the month
TEAM_RECOMMENDATIONS = (
    _OPEN.replace("KEY", "a.team")
    + "INNER JOIN (SELECT DISTINCT team, cluster AS a_cl, scheduler AS a_sched, "
    "if(scheduler = 'kubernetes', namespace, team) AS a_scope FROM v_allocations "
    "WHERE team IN {teams:Array(String)} AND start_time < {until:DateTime64(3, 'UTC')} "
    "AND (end_time IS NULL OR end_time >= {since:DateTime64(3, 'UTC')})) AS a "
    "ON a.a_cl = r.cl AND a.a_sched = r.sched AND a.a_scope = r.scope "
    "ORDER BY k, o.saved_gpu_h_per_week DESC, o.id LIMIT {top:UInt32} BY k"
)
# a user's: the Slurm job families that are theirs, in a team in scope
USER_RECOMMENDATIONS = (
    _OPEN.replace("KEY", "r.rec_user")
    + "WHERE r.sched = 'slurm' AND r.rec_user IN {users:Array(String)} "
    "AND r.scope IN {teams:Array(String)} "
    "ORDER BY k, o.saved_gpu_h_per_week DESC, o.id LIMIT {top:UInt32} BY k"
)
TOP_MAX = 50


@dataclass(frozen=True)
class Month:
    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Month:
        m = re.fullmatch(r"(\d{4})-(\d{2})", text.strip())
        if not m or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
            raise ConfigError(f"--month {text!r}: expected YYYY-MM (e.g. 2026-11)")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def before(cls, today: date) -> Month:
        """The calendar month before the one ``today`` is in."""
        last = today.replace(day=1) - timedelta(days=1)
        return cls(last.year, last.month)

    @property
    def first(self) -> date:
        return date(self.year, self.month, 1)

    @property
    def end(self) -> date:
        """The first day of the next month (exclusive)."""
        return (self.first + timedelta(days=31)).replace(day=1)

    @property
    def days(self) -> list[date]:
        return [self.first + timedelta(days=i) for i in range((self.end - self.first).days)]

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def title(self) -> str:
        return self.first.strftime("%B %Y")


@dataclass(frozen=True)
class Figures:
    allocated_gpu_h: float = 0.0
    consumed_gpu_h: float = 0.0
    gap_gpu_h: float = 0.0  # allocated and measured, not used
    unmeasured_gpu_h: float = 0.0  # allocated with no samples: in no one's gap

    @property
    def used(self) -> float:
        measured = self.allocated_gpu_h - self.unmeasured_gpu_h
        return self.consumed_gpu_h / measured if measured > 0 else 0.0

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(f: Figures) -> tuple[float, ...]:
    return (f.allocated_gpu_h, f.consumed_gpu_h, f.gap_gpu_h, f.unmeasured_gpu_h)


@dataclass(frozen=True)
class Rank:
    position: int  # 1: the most gap
    of: int

    def __str__(self) -> str:
        n = self.position
        suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        return f"{n}{suffix} of {self.of}"


@dataclass(frozen=True)
class Job:
    cluster: str
    allocation_id: str
    owner: str
    team: str
    workload_class: str
    figures: Figures


@dataclass(frozen=True)
class QueueTime:
    waited: int = 0  # jobs or gangs that started in the month after waiting
    mean_wait_s: float = 0.0
    max_wait_s: float = 0.0
    gpu_h_waited: float = 0.0  # GPUs asked for x time waited


@dataclass(frozen=True)
class OpenRecommendation:
    id: str
    kind: str
    target: str
    parameter: str
    from_value: str
    to_value: str
    saved_gpu_h_per_week: float
    confidence: float


@dataclass(frozen=True)
class Member:
    """One user's figures in one team, and their rank among its users."""

    team: str
    owner: str
    figures: Figures
    rank: Rank


@dataclass
class Subject:
    """What one mail is about: a team (kind 'team') or a user (kind 'user')."""

    kind: str
    name: str
    month: Month
    figures: Figures
    rank: Rank | None  # a team's among teams; a user's are in `members`
    daily: list[Figures] = field(default_factory=list)  # one per day of the month
    top_jobs: list[Job] = field(default_factory=list)
    recommendations: list[OpenRecommendation] = field(default_factory=list)
    queue: QueueTime = field(default_factory=QueueTime)
    members: list[Member] = field(default_factory=list)  # a team's users; a user's teams


def rank(totals: dict[str, Figures]) -> dict[str, Rank]:
    gaps = sorted((f.gap_gpu_h for f in totals.values()), reverse=True)
    return {
        name: Rank(1 + sum(1 for g in gaps if g > f.gap_gpu_h), len(gaps))
        for name, f in totals.items()
    }


def build(
    client: Any, month: Month, teams: list[str] | None, users: bool, top: int = 5
) -> list[Subject]:
    """The month's reports: one per team (``teams``, or every team with allocations), then,
    with ``users``, one per user of those teams. A named team without allocations in the
    month is a ConfigError naming those that had some."""
    if not 1 <= top <= TOP_MAX:
        raise ConfigError(f"--top must be 1..{TOP_MAX}, got {top}")
    since = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = month.end
    p: dict[str, Any] = {"d0": month.first, "d1": end, "since": since, "top": top}
    p["until"] = datetime(end.year, end.month, end.day, tzinfo=UTC)

    def rows(sql: str, **more: Any) -> list[Any]:
        return list(run_query(client, sql, {**p, **more}).result_rows)

    all_teams = {r[0]: Figures(*r[1:]) for r in rows(TEAM_TOTALS)}
    if teams:
        missing = sorted(set(teams) - set(all_teams))
        if missing:
            known = ", ".join(sorted(all_teams)[:20]) or "none"
            raise ConfigError(
                f"no allocations of team(s) {', '.join(map(repr, missing))} in {month.label}; "
                f"teams with allocations then: {known}"
            )
    chosen = sorted(set(teams) if teams else set(all_teams))
    p["teams"] = chosen
    team_ranks = rank(all_teams)
    members: dict[str, list[Member]] = {}
    by_team: dict[str, dict[str, Figures]] = {}
    for team, owner, *sums in rows(USER_TOTALS):
        by_team.setdefault(team, {})[owner] = Figures(*sums)
    for team, owners in by_team.items():
        ranks = rank(owners)
        members[team] = sorted(
            (Member(team, o, f, ranks[o]) for o, f in owners.items()),
            key=lambda m: (m.rank.position, m.owner),
        )
    out = [
        Subject("team", t, month, all_teams[t], team_ranks[t], members=members.get(t, []))
        for t in chosen
    ]
    if users:
        mine: dict[str, list[Member]] = {}
        for m in (m for t in chosen for m in members.get(t, [])):
            mine.setdefault(m.owner, []).append(m)
        for owner, teams_of in sorted(mine.items()):
            total = sum((m.figures for m in teams_of), Figures())
            out.append(Subject("user", owner, month, total, None, members=teams_of))
        p["users"] = sorted(mine)
    for kind, key in (("team", "team"), ("user", "owner")):
        subjects = {s.name: s for s in out if s.kind == kind}
        if subjects:
            _details(subjects, key, month, rows)
    return out


def _details(subjects: dict[str, Subject], key: str, month: Month, rows: Any) -> None:
    """The days, top jobs, queue time and open recommendations of each subject (every team's
    or every user's in one query each)."""
    assert key in ("team", "owner")  # a column name, never input
    days: dict[str, dict[date, Figures]] = {}
    for k, day, *sums in rows(DAILY.replace("KEY", key)):
        days.setdefault(k, {})[day] = Figures(*sums)
    for k, cluster, alloc, owner, team, cls, *sums in rows(TOP_JOBS.replace("KEY", key)):
        if k in subjects:
            subjects[k].top_jobs.append(Job(cluster, alloc, owner, team, cls, Figures(*sums)))
    for k, waited, mean, longest, gpu_h in rows(QUEUE.replace("KEY", key)):
        if k in subjects:
            subjects[k].queue = QueueTime(int(waited), float(mean), float(longest), gpu_h)
    sql = TEAM_RECOMMENDATIONS if key == "team" else USER_RECOMMENDATIONS
    for k, *rec in rows(sql):
        if k in subjects:
            subjects[k].recommendations.append(OpenRecommendation(*rec))
    for name, s in subjects.items():
        s.daily = [days.get(name, {}).get(d, Figures()) for d in month.days]
