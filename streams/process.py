"""Routing records to the pure steps: one ``Processor`` holds the state of one shard (one
partition of the inputs): its nodes' cores, its gangs, and the merged idle episodes of its
allocations, with no I/O. ``handle`` runs a shard that holds everything (one partition);
``step``, ``scheduler``, ``merge`` and ``mark`` are the pieces ``streams.join`` routes records
through when the state is split over partitions (see docs/worker.md#scale-out)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.clock import MINUTE_MS, at, ms
from schemas.models import (
    Alert,
    AllocationEvent,
    K8sPodEvent,
    NodeSample,
    Record,
    SlurmJobEvent,
)
from streams.allocate import GangTracker, from_pod, from_slurm
from streams.core import CoreConfig, NodeCore, Output
from streams.merge_alerts import AlertMerger
from streams.state import ProcessorState


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
    ) -> None:
        self.cfg = config or CoreConfig()
        state = state or {"nodes": {}, "gangs": None, "max_ms": None, "merge": {}}
        self.state = state
        self.merger = AlertMerger(state.setdefault("merge", {}), state.setdefault("merged", {}))
        self.cores = {k: NodeCore(v, self.cfg) for k, v in state["nodes"].items()}
        self.gangs = GangTracker(state["gangs"], lateness_ms=self.cfg.alert_lateness_ms)
        state["gangs"] = self.gangs.state
        #: nodes whose state changed since :meth:`changed` last handed them out
        self.dirty: set[str] = set()

    def core(self, cluster: str, node: str) -> NodeCore:
        key = f"{cluster}/{node}"
        c = self.cores.get(key)
        if c is None:
            c = self.cores[key] = NodeCore.new(cluster, node, self.cfg)
            self.state["nodes"][key] = c.state
        self.dirty.add(key)
        return c

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
            out.add(self.core(rec.cluster, rec.node).sample(rec))
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
            out.add(self.core(a.cluster, a.node).allocation(a))
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
                out.add(self.core(a.cluster, a.node).allocation(a))
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
        m = self.state["max_ms"]
        if m is None:
            return out
        t = at(m + extra_ms)
        t_ms = m + extra_ms
        for key in sorted(self.cores):
            c = self.cores[key]
            before = c.state["max_ms"]
            if before is None or t_ms <= before:
                continue  # NodeCore.advance would return nothing and change nothing
            out.add(c.advance(t))
            self.dirty.add(key)
        out.alerts += self.gangs.advance(m + extra_ms)
        if merge:
            out.alerts = [m for a in out.alerts for m in self.merger.feed(a)]
            out.alerts += self._tick(m + extra_ms - self.cfg.lateness_ms, final=extra_ms > 0)
        return out

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
        total: dict[str, int] = {}
        for c in self.cores.values():
            for k, v in c.state["counts"].items():
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
