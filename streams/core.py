"""The pure per-node core: allocation events + node samples in event time -> GPU-minutes.

No I/O, no clocks. ``NodeCore(state)`` wraps a plain JSON-able dict (``NodeState``, what a
snapshot stores under the node's key); every call returns what it produced (``Output``) and
leaves the new state in ``core.state``.

- **Watermark** = max event time seen on this node - ``lateness`` (default 120 s). A minute
  is closed, and its rows emitted, once the watermark reaches its end; everything before the
  first closed minute's start is buffered, so data out of order within the lateness is exact.
- **Late data** (a sample wholly inside closed minutes; an allocation start or end before the
  closed frontier) is returned in ``Output.refused`` with the reason and counted in
  ``state["counts"]``; a late allocation event still updates the allocation from the frontier
  on (its closed part cannot change any more).
- **Duplicates**: allocation events by ``event_id``, samples by (GPU, time): ignored, counted.
- **GPUs**: Slurm indices map to UUIDs from the node's own samples; Kubernetes pods get the
  GPUs whose samples carry their (namespace, pod) attribution *within the pod's lifetime*:
  the attribution names no UID, so each GPU keeps the spans of time a name was seen on it,
  and a pod recreated under the same name (a new UID, a new allocation) holds only what was
  seen while it ran. Where no telemetry says which GPU it is, a stable placeholder UUID
  stands in (``placeholder_uuid``): those rows are allocated and flagged ``no_samples``
  (consumption unknown, never idle or consumed).
- **Rows**: per GPU per minute one row per allocation holding it (split at allocation
  boundaries) and one unallocated row (``allocation_id`` None) for the seconds nobody held a
  GPU the node reports; its consumption is unattributed use.
- **End without start** is kept until its minute closes, then refused (nothing allocated);
  **end before start** is refused and the allocation spans nothing.
- **Bounds** (docs/worker.md#state-bounds): a GPU that has not reported for
  ``node_expiry_ms`` (event time, against the closed frontier) is forgotten unless a live
  allocation holds it, and so is a pod attribution no allocation names; a node holds at most
  ``MAX_GPUS_PER_NODE`` GPUs and ``max_allocs_per_node`` allocations (a record that would
  add more is refused), an allocation remembers its last ``EVENTS_KEPT`` event ids, a
  node its last ``ENDED_KEPT`` ended allocations, and a pod name at most ``SPANS_KEPT``
  spans per GPU (past that the closest two merge); a pod forgotten takes with it the spans
  of its name seen before the closed frontier that no pod of the name still held needs.
  Forgetting whole nodes, and the caps over every node of a worker, are
  ``streams.process``'s.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from gpugap.schemas.clock import DAY_MS, MINUTE_MS, SECOND_MS, at, minute_floor, ms
from gpugap.schemas.models import Alert, AllocationEvent, GpuMinute, GpuSample, NodeSample, Record
from gpugap.schemas.shares import mig_share
from gpugap.schemas.types import (
    MAX_GPUS_PER_NODE,
    ActivityMetric,
    DeadLetterKind,
    LifecycleKind,
    format_utc,
)
from gpugap.streams.detect_idle import IdleConfig, observe
from gpugap.streams.measured import measured_weights
from gpugap.streams.rows import held, in_life, learns, node_minutes, placeholder_uuid, pod_key
from gpugap.streams.state import (
    NodeState,
    Span,
    new_alloc_state,
    new_node_state,
    upgrade_node_state,
)
from gpugap.streams.window import Sample, sample_time

# ms: benchmarks/worker_inproc.py reads it from here
__all__ = [
    "CoreConfig",
    "NodeCore",
    "Output",
    "Refused",
    "ms",
    "placeholder_uuid",
    "state_bounds",
]

#: the state holds plain JSON values, not enum members
PLAIN: dict[ActivityMetric | None, str] = {e: e.value for e in ActivityMetric}
RETAIN_MS = 10 * MINUTE_MS  # keep ended allocations this long after the frontier (duplicates)
GAPS_KEPT = 4  # gaps between node samples kept for the alert wait (jitter, a lost sample)
TOMBSTONE_MS = DAY_MS  # then remember only that they ended (late deletions, duplicates)
#: event ids remembered per allocation (duplicates of older ones are applied again: a start
#: or an end applied twice changes nothing but a counter)
EVENTS_KEPT = 32
#: ended allocations remembered per node (the oldest go first, before TOMBSTONE_MS)
ENDED_KEPT = 10_000
#: spans of one pod name on one GPU (a name seen on a GPU, then not, then again: a pod
#: recreated under it, or gaps in the telemetry); past this the closest two merge
SPANS_KEPT = 16
#: a pod name seen on a GPU again within this many sample intervals goes on the same span
SPAN_GAP_INTERVALS = 2
#: what :func:`see` returns when every cached minute may have changed
EVERYTHING = -1
#: the defaults of the worker's state bounds (GPUGAP_WORKER_*, docs/worker.md#state-bounds)
NODE_EXPIRY_MS = 3_600_000
MAX_NODES = 200_000
MAX_GPUS = 8 * MAX_NODES
MAX_ALLOCS = 2 * MAX_NODES
MAX_ALLOCS_PER_NODE = 1_024


@dataclass(frozen=True)
class CoreConfig:
    lateness_ms: int = 120_000
    #: alerts judge a minute this long after its end (<= lateness), or one observed sample
    #: interval of the node if that is longer (``NodeCore.alert_wait``): an idle GPU pages
    #: within a minute or so of crossing its threshold, while the stored minutes wait the full
    #: lateness; data later than this still counts in the minutes but not in the alert raised
    alert_lateness_ms: int = 30_000
    default_interval_ms: int = 10_000
    idle: IdleConfig = field(default_factory=IdleConfig)
    #: the receiver's window around its wall clock: a record dated further ahead (a node's
    #: clock one day off made every node's minutes move a day on), or further back when set,
    #: is a dead letter. None = no bound (the pure core; replays and backfills of the past).
    max_future_ms: int | None = None
    max_past_ms: int | None = None
    #: a node silent this long in event time (no sample, no allocation event) is forgotten
    #: once nothing of it is open and no allocation runs on it; a GPU of a node, or a pod
    #: attribution, likewise. None = never (docs/worker.md#state-bounds)
    node_expiry_ms: int | None = NODE_EXPIRY_MS
    #: nodes held at most (over every shard of a worker): a record for one more is refused
    #: (a dead letter with the reason). None = no cap
    max_nodes: int | None = MAX_NODES
    #: GPUs held at most (over every shard of a worker): a sample bringing one more is
    #: refused. None = no cap
    max_gpus: int | None = MAX_GPUS
    #: allocations one node holds at most (running or ended in the last minutes), and all
    #: nodes together (over every shard of a worker; None = no cap)
    max_allocs_per_node: int = MAX_ALLOCS_PER_NODE
    max_allocs: int | None = MAX_ALLOCS

    def __post_init__(self) -> None:
        if not 0 <= self.alert_lateness_ms <= self.lateness_ms:
            raise ValueError("alert lateness must be between 0 and the allowed lateness")
        if self.node_expiry_ms is not None and self.node_expiry_ms < MINUTE_MS:
            raise ValueError("the node expiry must be at least a minute")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError("the node cap must be at least 1")
        if self.max_gpus is not None and self.max_gpus < 1:
            raise ValueError("the GPU cap must be at least 1")
        if self.max_allocs_per_node < 1:
            raise ValueError("the allocations per node must be at least 1")
        if self.max_allocs is not None and self.max_allocs < 1:
            raise ValueError("the allocation cap must be at least 1")


def state_bounds(worker: Any) -> dict[str, Any]:
    """CoreConfig's state bounds from the worker settings (``streams.settings.WorkerSettings``,
    ``GPUGAP_WORKER_*``; 0 turns a bound off)."""
    expiry = worker.node_idle_expiry_s
    return {
        "node_expiry_ms": round(expiry * SECOND_MS) if expiry else None,
        "max_nodes": worker.max_nodes or None,
        "max_gpus": worker.max_gpus or None,
        "max_allocs": worker.max_allocations or None,
        "max_allocs_per_node": worker.max_allocations_per_node,
    }


@dataclass(frozen=True)
class Refused:
    record: Record
    kind: DeadLetterKind
    reason: str


@dataclass
class Output:
    minutes: list[GpuMinute] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.minutes += other.minutes
        self.alerts += other.alerts
        self.refused += other.refused


class NodeCore:
    def __init__(self, state: NodeState, config: CoreConfig | None = None) -> None:
        self.state = upgrade_node_state(state)  # a checkpoint an earlier release wrote
        self.cfg = config or CoreConfig()
        #: minute start -> the rows the alert pass computed for it, reused when the minute
        #: closes unless something that could change them arrived in between (not state: a
        #: restored core recomputes them)
        self._rows: dict[int, list[GpuMinute]] = {}

    @classmethod
    def new(cls, cluster: str, node: str, config: CoreConfig | None = None) -> NodeCore:
        return cls(new_node_state(cluster, node), config)

    # --- input ---------------------------------------------------------------------------

    def _count(self, what: str, n: int = 1) -> None:
        c = self.state["counts"]
        c[what] = c.get(what, 0) + n

    def _seen(self, t: int) -> None:
        s = self.state
        s["max_ms"] = t if s["max_ms"] is None else max(s["max_ms"], t)
        if s["closed_ms"] is None:
            s["first_ms"] = t if s["first_ms"] is None else min(s["first_ms"], t)

    def _gap(self, t: int) -> None:
        """Note the gap from the latest node sample to one at ``t`` (later ones only; a gap
        longer than the lateness is a node that was away, not its interval)."""
        s = self.state
        last = s.get("sampled_ms")
        if last is not None and t <= last:
            return
        if last is not None and t - last <= self.cfg.lateness_ms:
            gaps = s.setdefault("gaps", [])
            gaps.append(t - last)
            del gaps[:-GAPS_KEPT]
        s["sampled_ms"] = t

    def alert_wait(self) -> int:
        """How long after a minute's end its idle alert is judged (ms): the alert lateness, or
        the node's sample interval if longer (the longest of its last gaps and its stated
        interval), never more than the lateness. A minute's last seconds are covered by the
        first sample after it, up to one interval later: judged sooner, a 60 s scrape's minute
        would be judged on part of its seconds, or on none (the next minute's run broken)."""
        s = self.state
        interval: int = max([*(s.get("gaps") or ()), s["interval_ms"] or 0])
        return min(self.cfg.lateness_ms, max(self.cfg.alert_lateness_ms, interval))

    def sample(self, ns: NodeSample) -> Output:
        s = self.state
        t = ms(ns.time)
        dt = (
            round(ns.interval_s * SECOND_MS)
            if ns.interval_s
            else s["interval_ms"] or self.cfg.default_interval_ms
        )
        s["interval_ms"] = dt
        closed = s["closed_ms"]
        if closed is not None and t <= closed:
            self._count("late_samples")
            reason = f"sample at {format_utc(ns.time)} is in minutes already closed"
            return Output(refused=[Refused(ns, DeadLetterKind.LATE, reason)])
        if len(s["known"]) + len(ns.gpus) > MAX_GPUS_PER_NODE and (over := self._too_many(ns)):
            return over
        self._count("samples")
        self._gap(t)
        self._seen(t - dt)
        self._seen(t)
        index, known, samples = s["index"], s["known"], s["samples"]
        everything = False  # whether cached rows of every minute may have changed
        since = t - dt  # else the earliest time from which they may have (EVERYTHING: all)
        for g in ns.gpus:
            u = g.uuid
            if g.mig is None:
                i_key = str(g.index)
                if index.get(i_key) != u:
                    index[i_key] = u
                    everything = True
                if g.partition is not None and self._partition(u, g):
                    everything = True
            elif self._slice(u, g):
                everything = True
            if u not in known:
                known[u] = t - dt
            buf = samples.get(u)
            if buf is None:
                buf = samples[u] = []
            metric = PLAIN.get(g.activity_metric)
            row: Sample = [t, dt, g.activity, metric, g.memory_used_mib, g.power_w]
            if g.measured_use is not None:
                row.append(measured_weights(g))
            if not buf or cast(int, buf[-1][0]) < t:  # in order: the usual case
                buf.append(row)
            else:
                i = bisect_left(buf, t, key=sample_time)
                if i < len(buf) and buf[i][0] == t:
                    self._count("duplicate_gpu_samples")
                    continue
                buf.insert(i, row)
                everything = True  # it trims the next sample's interval, wherever that began
            since = self._see_holders(g, t, dt, since)
        if self._rows:
            self._forget(None if everything else since)
        return self.close()

    def _see_holders(self, g: GpuSample, t: int, dt: int, since: int) -> int:
        """Note the pods ``g``'s attribution names on it at ``t``; the earliest time from
        which that changed what the node's rows say (``since`` if from no earlier)."""
        a = g.attribution
        if a is None or not a.pod:
            return since
        holders = [(a.namespace, a.pod)] + [(p.namespace, p.pod) for p in a.shared or ()]
        for namespace, pod in holders:
            pods = self.state["attrib"].setdefault(f"{namespace or ''}/{pod}", {})
            changed = see(pods, g.uuid, t, SPAN_GAP_INTERVALS * dt)
            if changed is not None and changed < since:
                since = changed
        return since

    def _slice(self, u: str, g: GpuSample) -> bool:
        """Note a MIG slice's physical GPU and share (streams.rows counts it by its share);
        whether that changed what the node's rows say."""
        mig = g.mig
        assert mig is not None
        share = mig_share(mig.profile, g.model)
        if share is None:
            self._count("mig_share_unknown")  # counted as a whole GPU: docs/architecture.md
            share = 1.0
        slices = self.state.setdefault("slices", {})
        now = [mig.parent_uuid, share]
        if slices.get(u) == now:
            return False
        slices[u] = now
        return True

    def _partition(self, u: str, g: GpuSample) -> bool:
        """Note an AMD compute partition's or Intel tile's physical device and share, as a MIG
        slice's (``partition`` marks it: its device has no part nobody can hold)."""
        part = g.partition
        assert part is not None
        slices = self.state.setdefault("slices", {})
        now = [part.parent_uuid, part.share, "partition"]
        if slices.get(u) == now:
            return False
        slices[u] = now
        return True

    def _too_many(self, ns: NodeSample) -> Output | None:
        """The sample refused if its new GPUs would make the node hold too many."""
        known = self.state["known"]
        new = sum(1 for g in ns.gpus if g.uuid not in known)
        if not new or len(known) + new <= MAX_GPUS_PER_NODE:
            return None
        self._count("node_gpus_refused")
        reason = (
            f"node {ns.node!r} would hold {len(known) + new} GPUs (at most {MAX_GPUS_PER_NODE}): "
            f"refused; a GPU that stops reporting is forgotten after the node expiry"
        )
        return Output(refused=[Refused(ns, DeadLetterKind.REJECTED, reason)])

    def _full(self, ev: AllocationEvent) -> Output:
        """A new allocation refused: the node holds as many as it may."""
        self._count("node_allocations_refused")
        reason = (
            f"node {ev.node!r} already holds {len(self.state['allocs']):,} allocations (at "
            f"most {self.cfg.max_allocs_per_node:,}, GPUGAP_WORKER_MAX_ALLOCATIONS_PER_NODE): "
            f"allocation {ev.allocation_id} refused"
        )
        return Output(refused=[Refused(ev, DeadLetterKind.REJECTED, reason)])

    def _forget(self, since: int | None) -> None:
        """Drop cached rows of minutes that data from ``since`` on (None: any) may change."""
        if since is None:
            self._rows.clear()
        else:
            for m0 in [m0 for m0 in self._rows if m0 + MINUTE_MS > since]:
                del self._rows[m0]

    def allocation(self, ev: AllocationEvent) -> Output:
        s = self.state
        out = Output()
        a = s["allocs"].get(ev.allocation_id)
        if a is not None and ev.event_id in a["events"]:
            self._count("duplicate_events")
            return out
        if a is None and ev.allocation_id in s.setdefault("ended", {}):
            # e.g. a pod's deletion long after its termination: the allocation is over
            self._count("events_after_end")
            return out
        if a is None and len(s["allocs"]) >= self.cfg.max_allocs_per_node:
            return self._full(ev)
        if a is None:
            a = s["allocs"][ev.allocation_id] = new_alloc_state(ev)
        a["events"].append(ev.event_id)
        if len(a["events"]) > EVENTS_KEPT:
            del a["events"][:-EVENTS_KEPT]
        self._rows.clear()
        t = ms(ev.time)
        self._count("allocation_events")
        closed = s["closed_ms"]
        if closed is not None and t < closed:
            self._count("late_events")
            reason = (
                f"allocation {ev.kind.value} at {format_utc(ev.time)} is before the closed "
                f"minutes (up to {format_utc(at(closed))}): applied from there on only"
            )
            out.refused.append(Refused(ev, DeadLetterKind.LATE, reason))
        if ev.kind is LifecycleKind.START:
            if a["start"] is not None:  # e.g. a pod's bound and running: the first counts
                self._count("conflicting_starts")
                a["start"] = min(a["start"], t)
                return out
            a["start"] = t
            if a["end"] is not None and a["end"] < t:
                a["start"] = a["end"]
                a["orphan"] = None
                self._count("end_before_start")
                reason = f"allocation {ev.allocation_id} ends before it starts: nothing allocated"
                out.refused.append(Refused(ev, DeadLetterKind.REJECTED, reason))
            else:
                a["orphan"] = None
        else:
            if a["end"] is not None:
                self._count("conflicting_ends")
                return out
            if a["start"] is not None and t < a["start"]:
                self._count("end_before_start")
                reason = f"allocation {ev.allocation_id} ends before it starts: nothing allocated"
                out.refused.append(Refused(ev, DeadLetterKind.REJECTED, reason))
                t = a["start"]
            elif a["start"] is None:
                a["orphan"] = ev.model_dump(mode="json")
            a["end"] = t
        if a["start"] is not None:
            self._seen(a["start"])
        self._seen(t)
        out.extend(self.close())
        return out

    def advance(self, t: datetime) -> Output:
        """Move this node's event-time clock (e.g. to the partition's max event time, so a
        node that went quiet still closes its minutes)."""
        s = self.state
        t_ms = ms(t)
        if s["max_ms"] is None or t_ms <= s["max_ms"]:
            return Output()
        s["max_ms"] = t_ms
        return self.close()

    # --- closing minutes -----------------------------------------------------------------

    def close(self) -> Output:
        s = self.state
        out = Output()
        seen = s["max_ms"]
        if seen is None:
            return out
        wm = seen - self.cfg.lateness_ms
        closed = s["closed_ms"]
        if closed is None:
            first = s["first_ms"]
            if first is None:
                return out
            closed = s["closed_ms"] = minute_floor(first)
        before = closed
        # alerts first: the idle detector runs ahead of the stored minutes (alert lateness)
        awm = seen - self.alert_wait()
        judged = s.get("judged_ms")
        if judged is None or judged < closed:
            judged = s["judged_ms"] = closed
        idle = s["idle"]
        heard = -1  # the time of the latest sample, once needed (-1: not yet known)
        while judged + MINUTE_MS <= awm:
            m0 = judged
            if not idle.get("runs") and not idle.get("episodes"):
                if s["allocs"] and heard < 0:
                    heard = max((cast(int, b[-1][0]) for b in s["samples"].values()), default=0)
                if not s["allocs"] or m0 >= heard:
                    # nothing to judge: no allocation here, or no sample from this minute on
                    # (its rows are no_samples, never idle). No rows made now and cached until
                    # the minute closes: that cache was most of a quiet node's memory
                    idle.setdefault("runs", {})
                    idle.setdefault("episodes", {})
                    judged = s["judged_ms"] = m0 + MINUTE_MS
                    continue
            rows = self._minute(m0)
            out.alerts += observe(
                s["idle"], s["node"], m0, rows, allocs=s["allocs"], cfg=self.cfg.idle
            )
            judged = s["judged_ms"] = m0 + MINUTE_MS
            if m0 + MINUTE_MS <= wm and closed == m0:  # the same minute closes now
                out.minutes += rows
                closed = s["closed_ms"] = m0 + MINUTE_MS
            else:
                self._rows[m0] = rows
        while closed + MINUTE_MS <= wm:
            m0 = closed
            cached = self._rows.pop(m0, None)
            out.minutes += cached if cached is not None else self._minute(m0)
            closed = s["closed_ms"] = m0 + MINUTE_MS
        if closed != before or out.minutes:
            self._prune(closed, out)
        return out

    def _expire(self, before: int, quiet: list[str]) -> None:
        """Forget the GPUs in ``quiet`` (their last sample is before ``before``) that no live
        allocation holds: they stop counting as capacity; and the pod attributions last seen
        before ``before`` that no allocation here names."""
        s = self.state
        allocs = s["allocs"]
        attrib = s["attrib"]
        named = {pod_key(a) for a in allocs.values()}
        for key in [k for k in attrib if k not in named]:
            last = max((spans[-1][1] for spans in attrib[key].values()), default=before)
            if last < before:
                del attrib[key]
        if not quiet:
            return
        live = {g for a in allocs.values() if a["end"] is None for g in held(s, a)}
        gone = [u for u in quiet if u not in live]
        slices = s.get("slices", {})
        for u in gone:
            del s["samples"][u]
            s["known"].pop(u, None)
            slices.pop(u, None)
        if gone:
            self._count("gpus_expired", len(gone))
            self._rows.clear()

    def _minute(self, m0: int) -> list[GpuMinute]:
        return node_minutes(self.state, m0, self.cfg.idle.for_alloc)

    def _prune(self, closed: int, out: Output) -> None:
        """Forget what no minute from ``closed`` on can need."""
        s = self.state
        ended = s.setdefault("ended", {})
        for aid in [k for k, end in ended.items() if end + TOMBSTONE_MS <= closed]:
            del ended[aid]
        if len(ended) > ENDED_KEPT:
            for aid in sorted(ended, key=ended.__getitem__)[: len(ended) - ENDED_KEPT]:
                del ended[aid]
        keep_from = closed - MINUTE_MS  # the previous sample trims the next one's interval
        expiry = self.cfg.node_expiry_ms
        quiet: list[str] = []  # GPUs that have not reported for the expiry
        for u, buf in s["samples"].items():
            i = bisect_left(buf, keep_from, key=sample_time)
            if i > 1:
                del buf[: i - 1]
            if expiry is not None and buf and cast(int, buf[-1][0]) + expiry <= closed:
                quiet.append(u)
        if expiry is not None and (quiet or s["attrib"]):
            self._expire(closed - expiry, quiet)
        gone: set[str] = set()  # pod names of allocations forgotten now
        for aid in list(s["allocs"]):
            a = s["allocs"][aid]
            if a["end"] is None or a["end"] > closed:
                continue
            if a["start"] is None and a["orphan"] is not None:
                self._count("end_without_start")
                reason = f"allocation {aid} ended with no start seen: nothing allocated"
                ev = AllocationEvent.model_validate(a["orphan"])
                out.refused.append(Refused(ev, DeadLetterKind.REJECTED, reason))
                a["orphan"] = None
            if a["end"] + RETAIN_MS <= closed:
                del s["allocs"][aid]
                s.setdefault("ended", {})[aid] = a["end"]
                if learns(a) and pod_key(a) in s["attrib"]:
                    gone.add(pod_key(a))
        if gone:
            self._trim(gone, closed)

    def _trim(self, keys: set[str], closed: int) -> None:
        """Forget the spans of the pod names ``keys`` seen before ``closed`` that lie in the
        life of no allocation held of that name (a pod recreated under the name keeps its
        own); later ones stay for a pod whose events may still come (or the expiry). No
        allocation held changes GPUs: no cached rows change."""
        s = self.state
        lives: dict[str, list[tuple[int | None, int | None]]] = {k: [] for k in keys}
        for a in s["allocs"].values():
            if learns(a) and (life := lives.get(pod_key(a))) is not None:
                life.append((a["start"], a["end"]))
        attrib = s["attrib"]
        for key, life in lives.items():
            pods = attrib[key]
            for u in list(pods):
                kept = [
                    sp
                    for sp in pods[u]
                    if sp[1] >= closed or any(in_life([sp], lo, hi) for lo, hi in life)
                ]
                if kept:
                    pods[u] = kept
                else:
                    del pods[u]
            if not pods:
                del attrib[key]


def see(pods: dict[str, list[Span]], u: str, t: int, gap: int) -> int | None:
    """Add a sample at ``t`` naming a pod on GPU ``u`` to the spans of that name (``pods``:
    per GPU, sorted, apart by more than ``gap``): None if they hold it already, else the
    earliest time from which rows may change (``EVERYTHING``: of any minute)."""
    spans = pods.get(u)
    if spans is None:
        pods[u] = [[t, t]]
        return EVERYTHING
    last = spans[-1]
    if t > last[1]:  # in order: the usual case
        if t - last[1] <= gap:
            before = last[1]
            last[1] = t  # only a pod starting after ``before`` can gain the GPU
            return before
        spans.append([t, t])
    elif t >= last[0]:
        return None
    else:  # out of order: before the latest span began
        i = bisect_left(spans, t, key=_last)  # the first span not over before t
        nxt = spans[i]
        if nxt[0] <= t:
            return None
        prev = spans[i - 1] if i else None
        if prev is not None and t - prev[1] <= gap:
            if nxt[0] - t <= gap:
                prev[1] = nxt[1]  # t joins the two
                del spans[i]
            else:
                prev[1] = t
        elif nxt[0] - t <= gap:
            nxt[0] = t
        else:
            spans.insert(i, [t, t])
    if len(spans) > SPANS_KEPT:  # bounded: the two closest become one
        j = min(range(1, len(spans)), key=lambda k: spans[k][0] - spans[k - 1][1])
        spans[j - 1][1] = spans[j][1]
        del spans[j]
    return EVERYTHING


def _last(span: Span) -> int:
    return span[1]
