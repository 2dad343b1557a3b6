"""What padded limits cost the queue: a partition's jobs replayed with the limits asked for and
with the ``--time`` recommender's limits, and the difference in waiting.

Right-sizing follows the recommender's rule (gpugap.queue.limits.right_sized_limit) per job
family; a job that ran longer than its family's new limit keeps the limit it asked for (the
model never kills work the rule's users would have protected with a longer limit), and the rule
never raises a limit."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpugap.queue.backfill import Partition, QueuedJob, Start, replay
from gpugap.queue.limits import right_sized_limit

#: per-user costs are replayed for this many users, the most padded first (one replay each)
TOP_USERS = 10
#: each variant is replayed this many times, submit times jittered by up to JITTER_S after the
#: first (recorded) replay
REPEATS = 5
JITTER_S = 60.0


@dataclass(frozen=True, slots=True)
class QueueFigures:
    jobs: int
    gpu_h_waited: float  # sum of GPUs x wait
    mean_wait_s: float
    p95_wait_s: float  # nearest rank
    makespan_s: float  # first submit to last end
    backfilled: int


@dataclass(frozen=True, slots=True)
class Spread:
    """A difference over the replays: the mean, and the lowest and highest."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(sum(values) / len(values), min(values), max(values))

    @property
    def clear(self) -> bool:
        """Every replay agrees on the sign: the effect is larger than the model's noise."""
        return self.low > 0 or self.high < 0


@dataclass(frozen=True, slots=True)
class UserCost:
    """One user's padding, what it cost their own jobs' waiting and everyone else's."""

    user: str
    jobs_right_sized: int
    over_rule_gpu_h: float  # GPUs x (limit asked - limit by the rule), over the changed jobs
    others_gpu_h_waited: float  # everyone else, this user's limits as asked (first replay)
    others_gpu_h_freed: Spread  # ... minus with only this user's limits right-sized
    own_gpu_h_freed: Spread  # the user's own jobs


@dataclass(frozen=True, slots=True)
class QueueCost:
    """The first replay's figures (submit times as recorded) and the differences over all."""

    asked: QueueFigures
    right_sized: QueueFigures
    jobs_right_sized: int
    repeats: int
    gpu_h_freed: Spread  # GPU-hours waited, as asked minus right-sized
    mean_wait_freed_s: Spread
    by_user: tuple[UserCost, ...]


def figures(jobs: Sequence[QueuedJob], starts: Sequence[Start]) -> QueueFigures:
    """The queue's waiting under one replay."""
    gpus = {j.id: j.gpus for j in jobs}
    waits = sorted(s.wait_s for s in starts)
    if not waits:
        return QueueFigures(0, 0.0, 0.0, 0.0, 0.0, 0)
    p95 = waits[max(math.ceil(0.95 * len(waits)) - 1, 0)]
    return QueueFigures(
        jobs=len(starts),
        gpu_h_waited=sum(gpus[s.id] * s.wait_s for s in starts) / 3600,
        mean_wait_s=sum(waits) / len(waits),
        p95_wait_s=p95,
        makespan_s=max(s.end_s for s in starts) - min(j.submit_s for j in jobs),
        backfilled=sum(s.backfilled for s in starts),
    )


def right_sized_limits(jobs: Sequence[QueuedJob]) -> dict[str, float]:
    """Each job family's limit by the recommender's rule, where the rule changes it."""
    fams: dict[str, list[QueuedJob]] = {}
    for j in jobs:
        if j.family:
            fams.setdefault(j.family, []).append(j)
    out: dict[str, float] = {}
    for fam, members in fams.items():
        done = [j for j in members if not j.timed_out]
        timeouts = len(members) - len(done)
        if not done or any(math.isinf(j.limit_s) for j in members):
            continue  # an unlimited job: the rule has no current limit to cut
        new = right_sized_limit([j.run_s for j in done], [j.limit_s for j in members], timeouts)
        if new is not None:
            out[fam] = float(new)
    return out


def right_size(
    jobs: Sequence[QueuedJob],
    limits: dict[str, float],
    only: Callable[[QueuedJob], bool] = lambda _j: True,
) -> list[QueuedJob]:
    """The jobs with their family's new limit (``only`` those it selects)."""
    out = []
    for j in jobs:
        new = limits.get(j.family)
        if new is not None and only(j) and j.run_s <= new < j.limit_s:
            out.append(replace(j, limit_s=new))
        else:
            out.append(j)
    return out


def jittered(jobs: Sequence[QueuedJob], repeat: int, jitter_s: float) -> list[QueuedJob]:
    """Repeat 0: the jobs as recorded; then each submit time moved later by up to ``jitter_s``
    (seeded by the repeat). A backfill schedule is chaotic: one job starting a second earlier
    changes who fits where, so one replay's difference can have either sign; the spread over
    the repeats says how much of a difference is the model's noise."""
    if repeat == 0:
        return list(jobs)
    rnd = random.Random(repeat)
    return [replace(j, submit_s=j.submit_s + rnd.uniform(0, jitter_s)) for j in jobs]


def queue_cost(
    jobs: Sequence[QueuedJob],
    partition: Partition,
    *,
    top_users: int = TOP_USERS,
    repeats: int = REPEATS,
    jitter_s: float = JITTER_S,
    max_job_test: int = 500,
) -> QueueCost:
    """Replay the partition as asked and right-sized, ``repeats`` times (jittered); per padded
    user (``top_users`` of them, the most padding first), the waiting with only that user's
    limits right-sized, theirs and everyone else's."""
    limits = right_sized_limits(jobs)
    sized = right_size(jobs, limits)
    changed = [(a, b) for a, b in zip(jobs, sized, strict=True) if b.limit_s < a.limit_s]
    padding: dict[str, tuple[int, float]] = {}
    for a, b in changed:
        n, h = padding.get(a.user, (0, 0.0))
        padding[a.user] = (n + 1, h + a.gpus * (a.limit_s - b.limit_s) / 3600)
    ranked = sorted(padding.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top_users]
    mine = {u: {j.id for j in jobs if j.user == u} for u, _ in ranked}
    first: tuple[QueueFigures, QueueFigures] | None = None
    freed_h: list[float] = []
    freed_wait: list[float] = []
    others: dict[str, list[tuple[float, float]]] = {u: [] for u in mine}  # (before, after)
    own: dict[str, list[float]] = {u: [] for u in mine}
    for r in range(max(repeats, 1)):
        js = jittered(jobs, r, jitter_s)
        asked_starts = replay(js, partition, max_job_test=max_job_test)
        js_sized = right_size(js, limits)
        asked = figures(js, asked_starts)
        right = figures(js_sized, replay(js_sized, partition, max_job_test=max_job_test))
        first = first or (asked, right)
        freed_h.append(asked.gpu_h_waited - right.gpu_h_waited)
        freed_wait.append(asked.mean_wait_s - right.mean_wait_s)
        for user, ids in mine.items():
            b_o, d_o, d_m = _alone(
                js, asked_starts, limits, ids, partition, max_job_test=max_job_test
            )
            others[user].append((b_o, d_o))
            own[user].append(d_m)
    assert first is not None
    by_user = tuple(
        UserCost(
            user, n, pad_h,
            others_gpu_h_waited=others[user][0][0],
            others_gpu_h_freed=Spread.of([d for _, d in others[user]]),
            own_gpu_h_freed=Spread.of(own[user]),
        )
        for user, (n, pad_h) in ranked
    )  # fmt: skip
    return QueueCost(
        asked=first[0],
        right_sized=first[1],
        jobs_right_sized=len(changed),
        repeats=max(repeats, 1),
        gpu_h_freed=Spread.of(freed_h),
        mean_wait_freed_s=Spread.of(freed_wait),
        by_user=by_user,
    )


def selection_cost(
    jobs: Sequence[QueuedJob],
    partition: Partition,
    limits: dict[str, float],
    ids: set[str],
    *,
    repeats: int = REPEATS,
    jitter_s: float = JITTER_S,
    max_job_test: int = 500,
) -> tuple[Spread, Spread]:
    """With only the jobs ``ids`` right-sized (``limits`` by family): the GPU-hours of
    waiting freed for everyone else, and for those jobs themselves, over ``repeats`` replays."""
    others, own = [], []
    for r in range(max(repeats, 1)):
        js = jittered(jobs, r, jitter_s)
        asked = replay(js, partition, max_job_test=max_job_test)
        _, d_o, d_m = _alone(js, asked, limits, ids, partition, max_job_test=max_job_test)
        others.append(d_o)
        own.append(d_m)
    return Spread.of(others), Spread.of(own)


def _alone(
    js: Sequence[QueuedJob],
    asked_starts: Sequence[Start],
    limits: dict[str, float],
    ids: set[str],
    partition: Partition,
    *,
    max_job_test: int,
) -> tuple[float, float, float]:
    """Replay with only the jobs ``ids`` right-sized: the others' GPU-hours waited as asked,
    and how many fewer the others and those jobs waited."""
    alone = replay(
        right_size(js, limits, lambda j: j.id in ids), partition, max_job_test=max_job_test
    )
    b_o, b_m = _split(js, asked_starts, ids)
    a_o, a_m = _split(js, alone, ids)
    return b_o, b_o - a_o, b_m - a_m


def _split(
    jobs: Sequence[QueuedJob], starts: Sequence[Start], ids: set[str]
) -> tuple[float, float]:
    """GPU-hours waited by the jobs not in ``ids``, and by those in it."""
    gpus = {j.id: j.gpus for j in jobs}
    theirs = sum(gpus[s.id] * s.wait_s for s in starts if s.id in ids)
    return sum(gpus[s.id] * s.wait_s for s in starts) / 3600 - theirs / 3600, theirs / 3600
