"""Routing records to the pure steps: one ``Processor`` holds the per-node cores and the gang
tracker of one worker (or one partition), with no I/O. Both runners (the asyncio worker in
streams/worker.py and the Faust app in streams/app.py) are thin adapters around it."""

from __future__ import annotations

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
        self.merger = AlertMerger(state.setdefault("merge", {}))
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
        out = self._handle(rec)
        out.alerts = [m for a in out.alerts for m in self.merger.feed(a)]
        return out

    def _handle(self, rec: Record) -> Result:
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

    def advance(self, extra_ms: int = 0) -> Result:
        """Bring every node to the max event time seen (+ ``extra_ms``): a node that went
        quiet still closes its minutes. ``extra_ms = lateness`` closes everything seen."""
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
