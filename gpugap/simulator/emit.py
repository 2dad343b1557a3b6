"""Emitting the plan in event time: node samples on each node's own grid, scheduler events as
they happen, and the scenario's faults (duplicates, late delivery, malformed bytes).

Delivery order is event time, except for what a fault delays: a late record is held back and
delivered after records with later event times; a duplicate is delivered again, unchanged,
a little later. Malformed records are raw bytes next to the record they were made from. A lost
node sample (a missed scrape, loss.py) is never sent at all: not late, not duplicated.
Every Kafka timestamp is the record's event time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.schemas import Topic, encode
from gpugap.schemas.topics import NODE_CAPACITY, SAMPLES
from gpugap.simulator import scenario
from gpugap.simulator.activity import NOISE, NOISE_MASK
from gpugap.simulator.capacity import polls
from gpugap.simulator.estate import Node
from gpugap.simulator.events import encoded, scheduler_events
from gpugap.simulator.loss import first_sample, lost_samples
from gpugap.simulator.plan import INF, Plan
from gpugap.simulator.wire import Clock, NodeWire, gpu_json

Msg = tuple[Topic[Any], bytes, bytes, int]  # topic, key, value, event time (s)


@dataclass
class Stats:
    records: Counter[str] = field(default_factory=Counter)  # messages sent, by topic
    duplicates: Counter[str] = field(default_factory=Counter)
    late: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)  # never sent (missed scrapes)
    malformed: Counter[str] = field(default_factory=Counter)  # by '<topic>:<variant>'
    gpu_samples: int = 0
    bytes: int = 0  # of valid records
    seconds: float = 0.0  # wall time from the first record to the last one flushed
    until: int = 0  # simulated time reached (s after the start)
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "records": dict(sorted(self.records.items())),
            "duplicates": dict(sorted(self.duplicates.items())),
            "late": dict(sorted(self.late.items())),
            "lost": dict(sorted(self.lost.items())),
            "malformed": dict(sorted(self.malformed.items())),
            "gpu_samples": self.gpu_samples,
            "bytes": self.bytes,
        }


def malformed(topic: str, value: bytes, variant: int) -> tuple[str, bytes]:
    """Bytes that no consumer may accept as a record, made from a good one."""
    if variant == 0:
        return "truncated", value[: len(value) // 2]
    if variant == 1:
        return "not_json", b"\x00\xff\xfe" + value[:16]
    if variant == 2:
        return "naive_time", value.replace(b'Z"', b'"', 1)
    if topic == SAMPLES.name:
        return "out_of_range", value.replace(b'"activity":', b'"activity":1.7,"was":', 1)
    return "wrong_type", value.replace(b'"cluster":', b'"cluster":null,"was":', 1)


class Emitter:
    #: yield to the event loop every so many samples (the Kafka client's tasks need it)
    YIELD_EVERY = 256

    def __init__(self, sc: scenario.Scenario, plan: Plan, window: int) -> None:
        self.sc = sc
        self.plan = plan
        self.window = window
        self.clock = Clock(sc.scenario.start)
        self.stats = Stats()
        self._rng = random.Random(f"{sc.scenario.seed}/faults")
        # (delivery time, events before samples, sequence, message)
        self._queue: list[tuple[int, int, int, Msg]] = []
        self._seq = 0

    def _later(self, at: int, prio: int, msg: Msg) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, prio, self._seq, msg))

    async def run(
        self, pub: Publisher, stop: asyncio.Event | None = None, speed: float | None = None
    ) -> Stats:
        """Publish everything; ``speed`` = simulated seconds per wall second (None: no waits)."""
        self._schedule_events()
        self._schedule_capacity()
        nodes = self._nodes()
        states: list[list[Any]] = [[] for _ in nodes]
        until = [-INF] * len(nodes)  # each node's state holds until then
        f, rng, stats, queue = self.sc.faults, self._rng, self.stats, self._queue
        # one draw per sample decides whether a fault hits it (they are rare)
        s_late = f.sample_late_rate
        s_any = s_late + f.sample_duplicate_rate + f.malformed_rate
        window, clock, send = self.window, self.clock, pub.send_encoded
        started = time.perf_counter()
        wall0 = asyncio.get_running_loop().time()
        n = sent = gpus = nbytes = t = 0
        try:
            while nodes:
                t, i, node, wire, gone = nodes[0]
                if t - node.interval >= window:
                    heapq.heappop(nodes)
                    continue
                while queue and queue[0][0] <= t:
                    await self._deliver(pub, heapq.heappop(queue)[3])
                if speed is not None:
                    await self._pace(pub, stop, wall0 + t / speed)
                n += 1
                if n % self.YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let the Kafka client's tasks and signals in
                    if stop is not None and stop.is_set():
                        break
                # drawn for a lost sample too, so which other samples are late, duplicated
                # or malformed does not depend on which ones are lost
                r = rng.random() if s_any else 1.0
                if t in gone:  # a missed scrape (loss.py): nothing is sent, ever
                    self._lose(r)
                else:
                    if t >= until[i]:
                        states[i], until[i] = node_state(node, t)
                    val = sample_json(states[i], t, wire, clock)
                    gpus += len(states[i])
                    if r >= s_late:
                        await send(SAMPLES, wire.key, val, clock.origin_ms + t * 1000)
                        sent += 1
                        nbytes += len(val)
                    if r < s_any:
                        await self._sample_fault(pub, r, (SAMPLES, wire.key, val, t))
                heapq.heapreplace(nodes, (t + node.interval, i, node, wire, gone))
            else:
                while queue:
                    await self._deliver(pub, heapq.heappop(queue)[3])
                stats.complete = True
            await pub.flush()
        finally:
            self._tally(sent, nbytes, gpus, t, started)
        return stats

    def _tally(self, sent: int, nbytes: int, gpus: int, t: int, started: float) -> None:
        """Add the node samples' counts to the stats (kept in locals on the hot path)."""
        stats = self.stats
        stats.records[SAMPLES.name] += sent
        stats.bytes += nbytes
        stats.gpu_samples += gpus
        stats.until = t
        stats.seconds = time.perf_counter() - started

    def _nodes(self) -> list[tuple[int, int, Node, NodeWire, frozenset[int]]]:
        """A heap of (next sample time, order, node, its wire parts, the times of its samples
        that are lost: the same function the truth leaves them out by)."""
        seed, rate = self.sc.scenario.seed, self.sc.faults.sample_loss_rate
        nodes = []
        for i, node in enumerate(self.plan.estate.nodes):
            for d in node.devices:
                d.cursor = 0
                d.idle_json = gpu_json(d, None, 0)
            gone = lost_samples(seed, rate, node, self.window)
            nodes.append((first_sample(node), i, node, NodeWire(node), gone))
        heapq.heapify(nodes)
        return nodes

    def _schedule_events(self) -> None:
        f, rng, stats = self.sc.faults, self._rng, self.stats
        events = scheduler_events(self.plan, self.sc.scenario.start, self.window)
        for t, topic, key, val in encoded(events):
            delay = rng.randint(1, f.event_max_delay)
            late = rng.random() < f.event_late_rate
            self._later(t + delay if late else t, 0, (topic, key, val, t))
            stats.late[topic.name] += late
            if rng.random() < f.event_duplicate_rate:
                self._later(t + rng.randint(1, f.event_max_delay), 0, (topic, key, val, t))
                stats.duplicates[topic.name] += 1

    def _schedule_capacity(self) -> None:
        """Node capacity polls (capacity.py), in event time; duplicated at the samples' rate
        (a re-delivered poll changes no figure), never lost, late or malformed. Their draws
        come from a stream of their own: the other faults stay as they were."""
        meta, f = self.sc.scenario, self.sc.faults
        rng = random.Random(f"{meta.seed}/capacity-faults")
        for t, r in polls(self.plan, meta.start, meta.capacity_interval, self.window):
            msg = (NODE_CAPACITY, NODE_CAPACITY.key_for(r), encode(r), t)
            self._later(t, 0, msg)
            if f.sample_duplicate_rate and rng.random() < f.sample_duplicate_rate:
                self._later(t + rng.randint(1, f.sample_max_delay), 0, msg)
                self.stats.duplicates[NODE_CAPACITY.name] += 1

    async def _sample_fault(self, pub: Publisher, r: float, msg: Msg) -> None:
        f = self.sc.faults
        late = f.sample_late_rate
        if r < late + f.sample_duplicate_rate:  # held back, or delivered once more, later
            self._later(msg[3] + self._rng.randint(1, f.sample_max_delay), 1, msg)
            kind = self.stats.late if r < late else self.stats.duplicates
            kind[SAMPLES.name] += 1
        else:
            await self._malformed(pub, msg)

    def _lose(self, r: float) -> None:
        """Count a lost sample, and make the draws ``_sample_fault`` would have made for it
        (none if its draw ``r`` is no fault), sending nothing."""
        self.stats.lost[SAMPLES.name] += 1
        f = self.sc.faults
        delayed = f.sample_late_rate + f.sample_duplicate_rate
        if r < delayed:
            self._rng.randint(1, f.sample_max_delay)  # its delay
        elif r < delayed + f.malformed_rate:
            self._rng.randrange(4)  # _malformed's variant

    async def _pace(self, pub: Publisher, stop: asyncio.Event | None, due: float) -> None:
        """Wait until the wall clock reaches ``due`` (flushing first, so consumers see data)."""
        ahead = due - asyncio.get_running_loop().time()
        if ahead <= 0.002:
            return
        await pub.flush()
        if stop is None:
            await asyncio.sleep(ahead)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ahead)

    async def _deliver(self, pub: Publisher, msg: Msg) -> None:
        topic, key, val, t = msg
        await pub.send_encoded(topic, key, val, self.clock.origin_ms + t * 1000)
        self.stats.records[topic.name] += 1
        self.stats.bytes += len(val)
        if topic is NODE_CAPACITY:  # never malformed: no draw from the faults' stream
            return
        if topic is not SAMPLES and self._rng.random() < self.sc.faults.malformed_rate:
            await self._malformed(pub, msg)

    async def _malformed(self, pub: Publisher, msg: Msg) -> None:
        topic, key, val, t = msg
        variant, bad = malformed(topic.name, val, self._rng.randrange(4))
        await pub.send_raw(pub.topic_name(topic), key, bad, self.clock.origin_ms + t * 1000)
        self.stats.malformed[f"{topic.name}:{variant}"] += 1


def sample_json(entries: list[Any], t: int, wire: NodeWire, clock: Clock) -> bytes:
    """The node sample at ``t`` from its devices' states (see node_state)."""
    parts = []
    for e in entries:
        if e.__class__ is bytes:
            parts.append(e)
            continue
        cache, a, jitter, base, quantum, h = e
        if jitter:  # activity.value()'s arithmetic, inlined: this is the hot path
            a += jitter * NOISE[(base + t) & NOISE_MASK] // 1000
            if a <= 0:
                a = 0
            elif a >= 1000:
                a = 1000
            elif quantum != 1:
                a = (a + quantum // 2) // quantum * quantum
        frag = cache.get(a)
        if frag is None:
            frag = cache[a] = gpu_json(h.device, h, a)
        parts.append(frag)
    return b"".join((wire.head, clock.text(t), wire.mid, b",".join(parts), b"]}"))


def node_state(node: Node, t: int) -> tuple[list[Any], int]:
    """What each device of ``node`` does at sample time ``t``, and until when that holds:
    idle JSON bytes for a device nobody holds, else (cache, level, jitter, noise base,
    quantum, holding) of the activity phase in force. Recomputed only when a holding or a
    phase changes on some device of the node (minutes apart), not at every sample."""
    interval = node.interval
    out: list[Any] = []
    until = INF
    for d in node.devices:
        tl = d.timeline
        c = d.cursor
        while c < len(tl) and tl[c].end <= t:
            c += 1
        d.cursor = c
        if c >= len(tl) or tl[c].start > t:
            out.append(d.idle_json)
            if c < len(tl):
                until = min(until, tl[c].start)
            continue
        h = tl[c]
        until = min(until, h.end)
        if h.start > t - interval:  # the slot straddles the start: nothing happens in it
            out.append((h.cache, 0, 0, d.noise_base, d.quantum, h))
            until = min(until, h.start + interval)
            continue
        p = h.program
        k = bisect_right(p.starts2, 2 * t - interval) - 1
        level, jitter = (p.levels[k], p.jitters[k]) if k >= 0 else (0, 0)
        if not jitter:
            level = min(max(level, 0), 1000)
            if d.quantum != 1:
                level = (level + d.quantum // 2) // d.quantum * d.quantum
        out.append((h.cache, level, jitter, d.noise_base, d.quantum, h))
        if k + 1 < len(p.starts2):  # the first sample whose slot midpoint is in the next phase
            until = min(until, -(-(p.starts2[k + 1] + interval) // 2))
    return out, until
