"""A small EASY-backfill scheduler model: where each job of a partition would start, given the
limits its users asked for.

Pure and deterministic. Assumptions (docs/queue.md):

- jobs are served in priority order (``order``: the submit time by default, or the recorded
  start order); the main pass starts jobs until the first that does not fit, then stops;
- that first blocked job gets one reservation (EASY): its *shadow time* is when enough GPUs
  free up if every running job ends at its limit (start + limit, what Slurm plans with);
- a later job (among the next ``max_job_test``, Slurm's ``bf_max_job_test``) starts now if it
  fits now and either its limit ends before the shadow time or it leaves the reserved job
  room at the shadow time;
- a job really ends at start + min(run, limit); no preemption, no fair share, no QOS limits;
- a job asks for ``nodes`` whole nodes' worth of ``gpus_per_node`` GPUs each; nodes are chosen
  best fit (the fullest node that fits first), as select/cons_tres packs.

Slurm's own backfill reserves for every job it tests (bf_max_job_test), not only the first:
on mixes where a second blocked job's reservation matters the two differ (docs/queue.md).
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One job as recorded: when it was submitted, what it asked for, how long it really ran."""

    id: str
    submit_s: float
    nodes: int
    gpus_per_node: int
    limit_s: float  # the limit asked for; math.inf = unlimited
    run_s: float  # the recorded elapsed time
    user: str = ""
    family: str = ""  # the recommender's job family (user, account, name, partition)
    order: float | None = None  # priority key, smaller first; None = submit_s
    timed_out: bool = False

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Partition:
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True, slots=True)
class Start:
    id: str
    start_s: float
    end_s: float
    wait_s: float
    backfilled: bool


class _Free:
    """Free GPUs per node, with a count of nodes per free level so a fit test is O(levels)."""

    __slots__ = ("count", "free")

    def __init__(self, p: Partition) -> None:
        self.free = [p.gpus_per_node] * p.nodes
        self.count = [0] * (p.gpus_per_node + 1)
        self.count[p.gpus_per_node] = p.nodes

    def fits(self, nodes: int, g: int) -> bool:
        return sum(self.count[g:]) >= nodes

    def take(self, node: int, g: int) -> None:
        f = self.free[node]
        self.count[f] -= 1
        self.count[f - g] += 1
        self.free[node] = f - g

    def give(self, node: int, g: int) -> None:
        self.take(node, -g)


def _fits(free: Sequence[int], nodes: int, g: int) -> bool:
    return sum(1 for f in free if f >= g) >= nodes


def _choose(
    free: Sequence[int], nodes: int, g: int, keep: Sequence[int] | None, need: int
) -> list[int]:
    """Best fit: the fullest nodes that fit; with ``keep`` (free GPUs at the shadow time), first
    the nodes that taking ``g`` leaves as useful to the reserved job (``need`` GPUs per node)."""
    ok = [i for i, f in enumerate(free) if f >= g]
    if keep is None:
        ok.sort(key=lambda i: (free[i], i))
    else:
        # a node whose GPUs at the shadow time the reserved job can use, and would no longer
        ok.sort(key=lambda i: (keep[i] >= need > keep[i] - g, free[i], i))
    return ok[:nodes]


def replay(
    jobs: Iterable[QueuedJob], partition: Partition, *, max_job_test: int = 500
) -> list[Start]:
    """Every job's start and end under EASY backfill, in start order (ties: priority order)."""
    return _Replay(jobs, partition, max_job_test).run()


class _Replay:
    def __init__(self, jobs: Iterable[QueuedJob], partition: Partition, max_job_test: int) -> None:
        self.todo = sorted(jobs, key=lambda j: (j.submit_s, j.id))
        for j in self.todo:
            if j.nodes > partition.nodes or j.gpus_per_node > partition.gpus_per_node or j.gpus < 1:
                raise ValueError(
                    f"job {j.id!r} asks for {j.nodes} x {j.gpus_per_node} GPUs; the partition "
                    f"has {partition.nodes} x {partition.gpus_per_node} (a job with no GPUs is "
                    "not queued for GPUs)"
                )
        self.max_job_test = max_job_test
        self.free = _Free(partition)
        self.pending: list[tuple[float, str, int]] = []  # (order, id, index), priority order
        self.running: dict[int, tuple[float, list[int]]] = {}  # index -> (planned end, nodes)
        self.ends: list[tuple[float, int]] = []  # (real end, index), a heap
        self.out: list[Start] = []
        # the blocked job's shadow time and free GPUs per node then, while nothing ends
        self.shadow: tuple[float, list[int]] | None = None

    def run(self) -> list[Start]:
        todo, pending, ends, nxt = self.todo, self.pending, self.ends, 0
        while nxt < len(todo) or ends:
            now = min(todo[nxt].submit_s if nxt < len(todo) else INF, ends[0][0] if ends else INF)
            freed = False
            while ends and ends[0][0] <= now:
                _, i = heapq.heappop(ends)
                for n in self.running.pop(i)[1]:
                    self.free.give(n, todo[i].gpus_per_node)
                freed = True
            arrived: list[tuple[float, str, int]] = []
            while nxt < len(todo) and todo[nxt].submit_s <= now:
                j = todo[nxt]
                arrived.append((j.submit_s if j.order is None else j.order, j.id, nxt))
                insort(pending, arrived[-1])
                nxt += 1
            if not freed and self.shadow is not None and all(a > pending[0] for a in arrived):
                # nothing ended and nobody arrived ahead of the reserved job: only the
                # arrivals can start, by backfill, against the same reservation
                blocked = todo[pending[0][2]]
                for a in arrived:
                    pos = pending.index(a)
                    if pos <= self.max_job_test and self._backfill(a[2], now, blocked):
                        pending.pop(pos)
                continue
            self._schedule(now)
        return self.out

    def _start(self, i: int, now: float, nodes: list[int], backfilled: bool) -> None:
        j = self.todo[i]
        for n in nodes:
            self.free.take(n, j.gpus_per_node)
        self.running[i] = (now + j.limit_s, nodes)
        end = now + min(j.run_s, j.limit_s)
        heapq.heappush(self.ends, (end, i))
        self.out.append(Start(j.id, now, end, now - j.submit_s, backfilled))

    def _reserve(self, b: QueuedJob) -> tuple[float, list[int]]:
        """The shadow time of the blocked job ``b`` and the free GPUs per node then."""
        at = list(self.free.free)
        for planned, i in sorted((r[0], k) for k, r in self.running.items()):
            for n in self.running[i][1]:
                at[n] += self.todo[i].gpus_per_node
            if _fits(at, b.nodes, b.gpus_per_node):
                return planned, at
        return INF, at

    def _backfill(self, i: int, now: float, blocked: QueuedJob) -> bool:
        j, free = self.todo[i], self.free
        assert self.shadow is not None
        if not free.fits(j.nodes, j.gpus_per_node):
            return False
        shadow_s, at = self.shadow
        if now + j.limit_s <= shadow_s:  # done (by its limit) before the reservation
            self._start(i, now, _choose(free.free, j.nodes, j.gpus_per_node, None, 0), True)
            return True
        nodes = _choose(free.free, j.nodes, j.gpus_per_node, at, blocked.gpus_per_node)
        for n in nodes:
            at[n] -= j.gpus_per_node
        if _fits(at, blocked.nodes, blocked.gpus_per_node):  # leaves the reservation room
            self._start(i, now, nodes, True)
            return True
        for n in nodes:
            at[n] += j.gpus_per_node
        return False

    def _schedule(self, now: float) -> None:
        pending, free = self.pending, self.free
        self.shadow = None
        while pending:  # the main pass: priority order, up to the first job that does not fit
            j = self.todo[pending[0][2]]
            if not free.fits(j.nodes, j.gpus_per_node):
                break
            nodes = _choose(free.free, j.nodes, j.gpus_per_node, None, 0)
            self._start(pending.pop(0)[2], now, nodes, False)
        if not pending:
            return
        blocked = self.todo[pending[0][2]]
        self.shadow = self._reserve(blocked)
        shadow_s = self.shadow[0]
        tested, k = 0, 1
        # free GPUs and the reservation's room only shrink during a pass: a shape that fits
        # nowhere now, or whose long jobs (past the shadow time) left no room, never will
        no_fit: set[tuple[int, int]] = set()
        no_room: set[tuple[int, int]] = set()
        while k < len(pending) and tested < self.max_job_test and free.count[0] < len(free.free):
            i = pending[k][2]
            j = self.todo[i]
            tested += 1
            shape = (j.nodes, j.gpus_per_node)
            long = now + j.limit_s > shadow_s
            if shape not in no_fit and not (long and shape in no_room):
                if self._backfill(i, now, blocked):
                    pending.pop(k)
                    continue
                if not free.fits(*shape):
                    no_fit.add(shape)
                elif long:
                    no_room.add(shape)
            k += 1
