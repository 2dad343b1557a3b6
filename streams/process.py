"""Routing records to the pure steps: one ``Processor`` holds the state of one shard (one
partition of the inputs): its nodes' cores, its gangs, and the merged idle episodes of its
allocations, with no I/O. ``handle`` runs a shard that holds everything (one partition);
``step``, ``scheduler``, ``merge`` and ``mark`` are the pieces ``streams.join`` routes records
through when the state is split over partitions (see docs/worker.md#scale-out).

State bounds (docs/worker.md#state-bounds): a node no record has named for
``CoreConfig.node_expiry_ms`` of event time (measured against the shard's watermark, checked
as :meth:`Processor.advance` moves it) is dropped whole once every minute of it is closed and
emitted, no allocation runs on it and no idle episode is open; a node with a running
allocation is kept however long it is silent. Dropping emits nothing. A node not held (new,
or back after its expiry) starts afresh; data of it before the closed frontier of the nodes
this shard has dropped (``expired_ms``) is late, as it would have been for the dropped node,
so no minute is emitted twice. At most ``CoreConfig.max_nodes`` nodes, ``max_gpus`` GPUs and
``max_allocs`` allocations are held (over every shard of a worker, ``Held``): a record for
one more is refused with the reason."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import cast

from gpugap.schemas.clock import MINUTE_MS, SECOND_MS, at, ms
from gpugap.schemas.models import (
    Alert,
    AllocationEvent,
    K8sPodEvent,
    NodeSample,
    Record,
    SlurmJobEvent,
)
from gpugap.schemas.types import DeadLetterKind
from gpugap.streams.allocate import GangTracker, from_pod, from_slurm
from gpugap.streams.core import CoreConfig, NodeCore, Output, Refused
from gpugap.streams.merge_alerts import AlertMerger
from gpugap.streams.state import NodeState, ProcessorState

#: rows per part of :meth:`Processor.advancing`
ROWS_PER_PART = 10_000


@dataclass
class Held:
    """What the shards of one worker hold together: what the caps count."""

    nodes: int = 0
    gpus: int = 0
    allocs: int = 0


@dataclass
class Result(Output):
    allocations: list[AllocationEvent] = field(default_factory=list)

    def add(self, other: Output) -> None:
        self.extend(other)
        if isinstance(other, Result):
            self.allocations += other.allocations


class Processor:
    def __init__(
        self,
        config: CoreConfig | None = None,
        state: ProcessorState | None = None,
        *,
        held: Held | None = None,
    ) -> None:
        self.cfg = config or CoreConfig()
        state = state or {"nodes": {}, "gangs": None, "max_ms": None, "merge": {}}
        self.state = state
        self.merger = AlertMerger(state.setdefault("merge", {}), state.setdefault("merged", {}))
        self.cores = {k: NodeCore(v, self.cfg) for k, v in state["nodes"].items()}
        self.gangs = GangTracker(
            state["gangs"],
            lateness_ms=self.cfg.alert_lateness_ms,
            expiry_ms=self.cfg.node_expiry_ms,
        )
        state["gangs"] = self.gangs.state
        #: nodes whose state changed since :meth:`changed` last handed them out (and those
        #: dropped: their snapshot record is deleted)
        self.dirty: set[str] = set()
        #: what counts against the caps (a worker's shards share it)
        self.held = held if held is not None else Held()
        self.held.nodes += len(self.cores)
        self.held.gpus += sum(len(c.state["known"]) for c in self.cores.values())
        self.held.allocs += sum(len(c.state["allocs"]) for c in self.cores.values())
        # the node expiry's bookkeeping (not state: rebuilt from it on restore)
        self._last: dict[str, int] = {}  # node -> the latest event time a record gave it
        self._due: dict[int, set[str]] = {}  # epoch minute of that time -> nodes
        self._due_heap: list[int] = []  # the minutes of _due
        self._wait: set[str] = set()  # due, but minutes or episodes still open: next sweep
        self._pinned: set[str] = set()  # due, but an allocation runs there: on its next record
        self._swept: int | None = None  # the watermark minute last swept
        self._order: list[str] | None = None  # sorted(self.cores), while no node comes or goes
        for key, c in self.cores.items():
            if (t := last_input(c.state)) is not None:
                self._touch(key, t)

    def core(self, cluster: str, node: str) -> NodeCore:
        key = f"{cluster}/{node}"
        c = self.cores.get(key)
        if c is None:
            c = self.cores[key] = NodeCore.new(cluster, node, self.cfg)
            self.state["nodes"][key] = c.state
            self._order = None
            self.held.nodes += 1
        self.dirty.add(key)
        return c

    def _node(
        self, cluster: str, node: str, *, rec: Record, t: int, first: int, out: Output
    ) -> NodeCore | None:
        """The core a record at ``t`` (its data from ``first`` on) goes to, or None when the
        node is new and the cap is reached (the record refused into ``out``)."""
        key = f"{cluster}/{node}"
        if key not in self.cores:
            cap = self.cfg.max_nodes
            if cap is not None and (n := self.held.nodes) >= cap:
                self._count("nodes_refused")
                expiry = self.cfg.node_expiry_ms
                after = f"{expiry / 1000:g} s" if expiry is not None else "never (no expiry)"
                reason = (
                    f"node {key!r} is new and this worker holds {n:,} nodes already (at most "
                    f"{cap:,}, GPUGAP_WORKER_MAX_NODES): refused to bound its memory; a node "
                    f"with no record for the expiry ({after}) and no running allocation is "
                    "forgotten (docs/worker.md#state-bounds)"
                )
                out.refused.append(Refused(rec, DeadLetterKind.REJECTED, reason))
                return None
            c = self.core(cluster, node)
            frontier = self.state.get("expired_ms")
            if frontier is not None and first < frontier:
                # a dropped node may have emitted the minutes before it: they stay closed
                c.state["closed_ms"] = frontier
        else:
            c = self.core(cluster, node)
        self._touch(key, t)
        return c

    def _count(self, what: str, n: int = 1) -> None:
        c = self.state.setdefault("counts", {})
        c[what] = c.get(what, 0) + n

    def _gpus_over(self, key: str, ns: NodeSample) -> Refused | None:
        """A sample refused: its GPUs new to this worker would make it hold too many."""
        cap, held = self.cfg.max_gpus, self.held.gpus
        if cap is None or held + len(ns.gpus) <= cap:
            return None
        c = self.cores.get(key)
        known = c.state["known"] if c is not None else {}
        new = sum(1 for g in ns.gpus if g.uuid not in known)
        if not new or held + new <= cap:
            return None
        self._count("gpus_refused")
        reason = (
            f"node {key!r}: {new} GPU(s) new to this worker, which holds {held:,} GPUs already "
            f"(at most {cap:,}, GPUGAP_WORKER_MAX_GPUS): refused to bound its memory; a GPU "
            "that stops reporting is forgotten after the expiry (docs/worker.md#state-bounds)"
        )
        return Refused(ns, DeadLetterKind.REJECTED, reason)

    def _allocate(self, a: AllocationEvent, out: Result) -> None:
        """One allocation event to its node, unless the caps refuse it."""
        key = f"{a.cluster}/{a.node}"
        cap, c = self.cfg.max_allocs, self.cores.get(key)
        new = c is None or (
            a.allocation_id not in c.state["allocs"]
            and a.allocation_id not in c.state.get("ended", {})
        )
        if cap is not None and new and self.held.allocs >= cap:
            self._count("allocations_refused")
            reason = (
                f"allocation {a.allocation_id} on {key!r} is new and this worker holds "
                f"{self.held.allocs:,} allocations already (at most {cap:,}, "
                "GPUGAP_WORKER_MAX_ALLOCATIONS): refused to bound its memory"
            )
            out.refused.append(Refused(a, DeadLetterKind.REJECTED, reason))
            return
        t = ms(a.time)
        if (c := self._node(a.cluster, a.node, rec=a, t=t, first=t, out=out)) is not None:
            self._run(c, out, a)

    def _run(self, c: NodeCore, out: Result, rec: NodeSample | AllocationEvent) -> None:
        """Feed a core, keeping count of the GPUs and allocations it holds (the caps)."""
        known, allocs = c.state["known"], c.state["allocs"]
        gpus, held = len(known), len(allocs)
        out.add(c.sample(rec) if isinstance(rec, NodeSample) else c.allocation(rec))
        self.held.gpus += len(known) - gpus
        self.held.allocs += len(allocs) - held

    # --- the node expiry -----------------------------------------------------------------

    def _touch(self, key: str, t: int) -> None:
        """A record for ``key`` at event time ``t``: due for the expiry from there on."""
        if self.cfg.node_expiry_ms is None:
            return
        prev = self._last.get(key)
        if prev is None or t > prev:
            self._last[key] = t
            if prev is not None and prev // MINUTE_MS != t // MINUTE_MS:
                old = self._due.get(prev // MINUTE_MS)
                if old is not None:
                    old.discard(key)
        else:
            t = prev
        if self._pinned:
            self._pinned.discard(key)
        m = t // MINUTE_MS
        bucket = self._due.get(m)
        if bucket is None:
            bucket = self._due[m] = set()
            heapq.heappush(self._due_heap, m)
        bucket.add(key)

    def _sweep(self, watermark: int) -> None:
        """Drop the nodes silent for the expiry at ``watermark`` that hold nothing open
        (once per minute of watermark)."""
        expiry = self.cfg.node_expiry_ms
        if expiry is None:
            return
        minute = watermark // MINUTE_MS
        if self._swept is not None and minute <= self._swept:
            return
        self._swept = minute
        check, self._wait = self._wait, set()
        heap, due = self._due_heap, self._due
        while heap and (heap[0] + 1) * MINUTE_MS + expiry <= watermark:
            check |= due.pop(heapq.heappop(heap), set())
        for key in sorted(check):
            last, c = self._last.get(key), self.cores.get(key)
            if last is None or c is None or last + expiry > watermark:
                continue  # gone, or a record came since (it is due later)
            why = kept(c.state, last)
            if why is None:
                self._drop(key, c)
            elif why == "running":
                self._pinned.add(key)
            else:
                self._wait.add(key)

    def _drop(self, key: str, c: NodeCore) -> None:
        del self.cores[key]
        del self.state["nodes"][key]
        self.held.nodes -= 1
        self.held.gpus -= len(c.state["known"])
        self.held.allocs -= len(c.state["allocs"])
        self._last.pop(key, None)
        self._order = None
        self.dirty.add(key)  # its snapshot record goes (a tombstone)
        s = c.state
        for what, n in s["counts"].items():  # the totals stay totals
            self._count(what, n)
        self._count("nodes_expired")
        closed = s["closed_ms"]
        if closed is not None and closed > self.state.get("expired_ms", closed - 1):
            self.state["expired_ms"] = closed

    def changed(self) -> set[str]:
        """The nodes whose state changed since the last call (for incremental snapshots)."""
        out, self.dirty = self.dirty, set()
        return out

    def _seen(self, t: int) -> None:
        m = self.state["max_ms"]
        self.state["max_ms"] = t if m is None else max(m, t)

    def handle(self, rec: Record) -> Result:
        out = self.step(rec)
        out.alerts = [m for a in out.alerts for m in self.merger.feed(a)]
        return out

    def step(self, rec: Record) -> Result:
        """One record, every node and gang this shard's; idle alerts are per node (unmerged)."""
        out = Result()
        if isinstance(rec, NodeSample):
            t = ms(rec.time)
            self._seen(t)
            out.alerts += self.gangs.advance(t)
            dt = (
                round(rec.interval_s * SECOND_MS)
                if rec.interval_s
                else self.cfg.default_interval_ms
            )
            if (over := self._gpus_over(f"{rec.cluster}/{rec.node}", rec)) is not None:
                out.refused.append(over)
                return out
            c = self._node(rec.cluster, rec.node, rec=rec, t=t, first=t - dt, out=out)
            if c is not None:
                self._run(c, out, rec)
            return out
        if isinstance(rec, SlurmJobEvent):
            allocs = from_slurm(rec)
        elif isinstance(rec, K8sPodEvent):
            allocs = from_pod(rec)
            out.alerts += self.gangs.pod(rec)
        elif isinstance(rec, AllocationEvent):
            allocs = [rec]
        else:
            return out
        self._seen(ms(rec.time))
        out.allocations += allocs if not isinstance(rec, AllocationEvent) else []
        for a in allocs:
            self._allocate(a, out)
        return out

    def scheduler(self, rec: SlurmJobEvent | K8sPodEvent, owns: Callable[[str], bool]) -> Result:
        """A scheduler event every shard reads: its allocations on the nodes this shard
        ``owns`` (``cluster/node``), its pod if the shard owns the gang (``cluster/gang``),
        and its time for the shard's clock. Idle alerts are per node (unmerged)."""
        out = Result()
        t = ms(rec.time)
        self._seen(t)
        if isinstance(rec, SlurmJobEvent):
            allocs = from_slurm(rec)
        else:
            allocs = from_pod(rec)
            if rec.gang_id is not None and owns(f"{rec.cluster}/{rec.gang_id}"):
                out.alerts += self.gangs.pod(rec)
            else:
                out.alerts += self.gangs.advance(t)
        for a in allocs:
            if owns(f"{a.cluster}/{a.node}"):
                out.allocations.append(a)
                self._allocate(a, out)
        return out

    def merge(self, alert: Alert) -> list[Alert]:
        """A node's idle alert of an allocation this shard merges: the marks may already
        be past its end (a restored shard sends its alerts again, after its marks)."""
        return self.merger.feed(alert) + self._by_marks()

    def watermark(self, extra_ms: int = 0) -> int | None:
        """What this shard tells the mergers: none of its nodes will report an idle run that
        starts before this. None: it has taken nothing yet (so it cannot say)."""
        m = self.state["max_ms"]
        return None if m is None else m + extra_ms - self.cfg.lateness_ms

    def mark(self, source: int, watermark: int | None, final: bool, sources: int) -> list[Alert]:
        """Shard ``source`` (of ``sources``) is at ``watermark``: resolve the merged episodes
        no node can join any more, once every shard has said where it is."""
        marks = self.state.setdefault("marks", {})
        prev = marks.get(str(source))
        if prev is not None and prev[0] is not None and (watermark or 0) < prev[0]:
            watermark = prev[0]  # a restarted shard says an earlier one again
        marks[str(source)] = [watermark, final]
        self.state["sources"] = sources
        return self._by_marks()

    def settled(self) -> bool:
        """Every shard has sent this merger its final mark: nothing can join an episode."""
        marks = self.state.get("marks") or {}
        return len(marks) >= self.state.get("sources", 1) and all(m[1] for m in marks.values())

    def _by_marks(self) -> list[Alert]:
        marks = self.state.get("marks")
        sources = self.state.get("sources")
        if not marks or sources is None or len(marks) < sources:
            return []
        if any(m[0] is None for m in marks.values()):
            return []
        final = all(m[1] for m in marks.values())
        return self._tick(min(m[0] for m in marks.values()), final=final)

    def advance(self, extra_ms: int = 0, *, merge: bool = True) -> Result:
        """Bring every node to the max event time seen (+ ``extra_ms``): a node that went
        quiet still closes its minutes. ``extra_ms = lateness`` closes everything seen.
        ``merge=False``: idle alerts stay per node, and the mergers are told by marks."""
        out = Result()
        for part in self.advancing(extra_ms):
            out.add(part)
        m = self.state["max_ms"]
        if merge and m is not None:
            out.alerts = [m for a in out.alerts for m in self.merger.feed(a)]
            out.alerts += self._tick(m + extra_ms - self.cfg.lateness_ms, final=extra_ms > 0)
        return out

    def advancing(self, extra_ms: int = 0) -> Iterator[Result]:
        """:meth:`advance` with ``merge=False``, in parts of about ``ROWS_PER_PART`` rows:
        quiet nodes close their minutes together, and 200,000 of them made 1.6 million
        rows at once. Then the node expiry, at the shard's watermark."""
        m = self.state["max_ms"]
        if m is None:
            return
        t = at(m + extra_ms)
        t_ms = m + extra_ms
        if self._order is None:
            self._order = sorted(self.cores)
        out = Result()
        for key in self._order:
            c = self.cores.get(key)
            before = c.state["max_ms"] if c is not None else None
            if c is None or before is None or t_ms <= before:
                continue  # NodeCore.advance would return nothing and change nothing
            known, allocs = c.state["known"], c.state["allocs"]
            gpus, held = len(known), len(allocs)
            out.add(c.advance(t))
            self.held.gpus += len(known) - gpus  # quiet GPUs expire as minutes close
            self.held.allocs += len(allocs) - held  # and ended allocations go
            self.dirty.add(key)
            if len(out.minutes) >= ROWS_PER_PART:
                yield out
                out = Result()
        self._sweep(m - self.cfg.lateness_ms)  # the shard's watermark, not the flush's
        out.alerts += self.gangs.advance(m + extra_ms)
        yield out

    def _tick(self, watermark_ms: int, *, final: bool = False) -> list[Alert]:
        need: dict[str, int] = {}
        for aid, m in self.merger.state.items():
            # the minutes the alert was judged by (its policy), else its class's
            policy = m["last"].get("policy")
            if policy is not None:
                minutes = policy["minutes"]
            else:
                minutes = self.cfg.idle.for_class(m["last"].get("workload_class"))[1]
            need[aid] = 0 if final else minutes * MINUTE_MS
        return self.merger.tick(watermark_ms, need)

    def counts(self) -> dict[str, int]:
        """Totals over the nodes held, those dropped, and this shard's own (nodes refused,
        expired; gangs)."""
        total: dict[str, int] = dict(self.state.get("counts", {}))
        for c in self.cores.values():
            for k, v in c.state["counts"].items():
                total[k] = total.get(k, 0) + v
        for k, v in self.gangs.counts.items():
            total[k] = total.get(k, 0) + v
        return total

    def open_minutes(self) -> int:
        """Minutes seen but not closed yet, over all nodes (a lag signal)."""
        n, seen = 0, self.state["max_ms"]
        if seen is None:
            return 0
        for c in self.cores.values():
            s = c.state
            if s["max_ms"] is not None and s["closed_ms"] is not None:
                # not past the latest event time: a flush moves node clocks beyond it
                n += max(0, (min(s["max_ms"], seen) - s["closed_ms"]) // MINUTE_MS)
        return n


def last_input(s: NodeState) -> int | None:
    """The latest event time a node's state shows a record for (a restored node's), else
    its closed frontier."""
    times = [int(cast(int, buf[-1][0]) or 0) for buf in s["samples"].values() if buf]
    for a in s["allocs"].values():
        times += [t for t in (a["start"], a["end"]) if t is not None]
    times += s.get("ended", {}).values()
    if times:
        return max(times)
    return s["closed_ms"] if s["closed_ms"] is not None else s["max_ms"]


def kept(s: NodeState, last: int) -> str | None:
    """Why a node silent since ``last`` is kept: "running" (an allocation has no end yet:
    only a record can change that), "open" (minutes, ends or idle episodes to close), or
    None (it can go)."""
    allocs = s["allocs"].values()
    if any(a["end"] is None for a in allocs):
        return "running"
    if s["max_ms"] is None and not allocs:
        return None  # it never took anything (a record for it was refused)
    closed = s["closed_ms"]
    if closed is None or closed <= last:
        return "open"
    if any((a["end"] is not None and a["end"] > closed) or a["orphan"] for a in allocs):
        return "open"
    idle = s["idle"]
    if idle.get("runs") or idle.get("episodes"):
        return "open"
    return None
