"""The runner-independent half of a worker: decode, merge the inputs in event time, route
them to the shards this worker owns, publish what they produced, and checkpoint them.

The worker runtime (streams/runtime.py, run by the Faust app of ``gpugap worker``) owns one.
Records are buffered and handed to the core in event-time order up to the **frontier** (the
oldest latest-timestamp among input partitions that are not caught up), so a fast samples
partition cannot run ahead of the scheduler events and make them late during a replay or a
catch-up.

The state is split into shards, one per partition of ``gpu.samples.v1`` (keyed by node):

- shard ``p`` holds the nodes whose samples are on partition ``p``, the gangs whose
  ``cluster/gang`` key maps to ``p``, and the merged idle episodes of the allocations whose id
  maps to ``p`` (Kafka's murmur2, like every producer);
- scheduler events are few (one per job or pod change, against one per node every 10 s) and
  every shard needs them: every worker reads every partition of ``slurm.jobs.v1`` and
  ``k8s.pods.v1`` (a Kafka Streams GlobalKTable), and each shard keeps what is its own; the
  owner of a node publishes its allocation events on ``gpu.allocations.v1``;
- a node's idle alert goes to the shard that merges its allocation over
  ``<group>-idle-episodes`` (keyed by allocation, partitioned like the samples), even when
  this worker owns that shard: the merger's input is then a topic it restores its position
  in, so a worker killed between storing one shard and the next loses nothing (a direct
  hand-over would live only in the merger's state). Each shard also sends every merger its
  watermark (a **mark**) the same way, in order after its alerts, so a merger resolves an
  episode only once every shard has passed the point where a node could still join it.
  With no episodes topic (one process owning every shard) both are handed over directly.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage
from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.groundfloor.kafka.trust import ClusterTrust
from gpugap.schemas import Alert, K8sPodEvent, NodeSample, Record, SlurmJobEvent, decode, encode
from gpugap.schemas.clock import SECOND_MS, ms
from gpugap.schemas.errors import FatalError
from gpugap.schemas.topics import ALERTS, ALLOCATIONS, K8S_PODS, MINUTES, SAMPLES, SLURM_JOBS
from gpugap.schemas.types import AlertKind, DeadLetterKind
from gpugap.streams.checkpoint import Points
from gpugap.streams.core import CoreConfig
from gpugap.streams.process import Processor, Result
from gpugap.streams.shards import Shards, partition_for
from gpugap.streams.stats import WorkerStats

__all__ = [
    "GLOBAL_INPUTS",
    "INPUTS",
    "Join",
    "WorkerStats",
    "check_copartitioned",
    "input_topics",
    "partition_for",
    "tune_gc",
]

log = logging.getLogger(__name__)
INPUTS = (SAMPLES, SLURM_JOBS, K8S_PODS)
#: read by every worker, whole (the scheduler events)
GLOBAL_INPUTS = (SLURM_JOBS, K8S_PODS)
#: marks go over the episodes topic at most this often (direct ones on every drain)
MARK_INTERVAL_S = 0.2
#: a buffer this large is drained regardless of the frontier (bounded memory)
MAX_BUFFERED = 500_000


def input_topics(topic_prefix: str, trust: ClusterTrust | None) -> list[str]:
    """Every topic a worker reads (broker names): the shared inputs, then the clusters' own
    (``GPUGAP_KAFKA_CLUSTER_TOPICS``)."""
    names = [t.qualified(topic_prefix) for t in INPUTS]
    return names + (trust.topics_for(INPUTS) if trust is not None else [])


def check_copartitioned(counts: dict[str, int], topic_prefix: str) -> None:
    """The clusters' own samples topics must be partitioned like ``gpu.samples.v1``: a
    shard is a partition number of them all (``counts``: samples topic -> partitions)."""
    samples = SAMPLES.qualified(topic_prefix)
    want = counts.get(samples)
    bad = {t: n for t, n in counts.items() if want is not None and n != want}
    if bad:
        raise FatalError(
            f"worker: {samples} has {want} partition(s), but "
            + ", ".join(f"{t} has {n}" for t, n in sorted(bad.items()))
            + ": a cluster's own samples topic (GPUGAP_KAFKA_CLUSTER_TOPICS) is read as part "
            "of the same shards, so give it the same number of partitions"
        )


class Join(Shards):
    def __init__(
        self,
        publisher: Publisher,
        topic_prefix: str,
        config: CoreConfig | None = None,
        *,
        partitions: int = 1,
        episodes_topic: str | None = None,
        trust: ClusterTrust | None = None,
    ) -> None:
        self.pub = publisher
        self.prefix = topic_prefix
        self.cfg = config or CoreConfig()
        #: shards: the partitions of the samples topic
        self.partitions = partitions
        self.samples_topic = SAMPLES.qualified(topic_prefix)
        self.global_topics = {t.qualified(topic_prefix) for t in GLOBAL_INPUTS}
        #: the samples topic and the clusters' own (docs/kafka-trust.md), partitioned alike
        self.samples_topics = {self.samples_topic}
        if trust is not None:  # the clusters' own topics read beside the shared ones
            self.samples_topics.update(trust.topics_for([SAMPLES]))
            self.global_topics.update(trust.topics_for(GLOBAL_INPUTS))
        #: where idle alerts and marks for shards owned elsewhere go (None: all are here)
        self.episodes_topic = episodes_topic
        self.dl = DeadLetters(publisher, "worker", topic_prefix, trust)
        self.stats = WorkerStats()
        #: (event ms, arrival seq, partition, raw message, record, runner's handle)
        self._buf: list[tuple[int, int, Any, RawMessage, Record, Any]] = []
        self._seq = 0
        self.latest: dict[Any, int] = {}  # partition -> latest event time fetched
        #: handles (e.g. Faust events) of records the core has taken, for the runner to ack
        self.done: list[Any] = []
        #: offsets taken by the core above a partition's lowest buffered one (event-time
        #: order is not offset order): a restart must skip them too, not apply them twice
        self.taken: dict[Any, set[int]] = {}
        self._parts: dict[str, int] = {}
        self._marked: dict[tuple[int, int], tuple[int | None, bool]] = {}
        self._marked_at = 0.0
        #: flushed, and no data since: the marks stay final (they would flip back and forth
        #: between the workers of a group, each waking the others)
        self._quiet = False
        self.shards: dict[int, Processor] = {}
        self.skip: dict[int, Points] = {}  # shard -> the input its restored state holds
        self._unstored: dict[int, set[str]] = {}  # shard -> nodes changed since stored
        self.restore({}, () if episodes_topic is not None else None)

    async def ingest(self, tp: Any, raw: RawMessage, handle: Any = None) -> None:
        """Decode one message (bad bytes -> dead letter) and buffer it in event-time order.
        Records every shard here already holds are dropped; a merger's input is applied
        at once, in offset order (its marks must follow the alerts sent before them)."""
        self.stats.messages += 1
        rec: Record | None = None
        if raw.topic == self.episodes_topic:
            await self._episode(raw)
        elif raw.topic in self.global_topics:
            self._quiet = False
            if any(not self._has(s, raw) for s in self.shards):
                rec = await self.dl.decode(raw)
        else:
            self._quiet = False
            if not self._has(raw.partition or 0, raw):
                rec = await self.dl.decode(raw)
        t = 0 if rec is None else ms(rec.time)  # type: ignore[attr-defined]
        if rec is not None and (reason := self._outside_window(t)):
            await self.dl.route(raw, reason, DeadLetterKind.REJECTED)
            rec = None
        if rec is None:
            if handle is not None:
                self.done.append(handle)
            return
        self.latest[tp] = max(self.latest.get(tp, t), t)
        if isinstance(rec, NodeSample):
            self.stats.gpu_samples += len(rec.gpus)
        self._seq += 1
        heapq.heappush(self._buf, (t, self._seq, tp, raw, rec, handle))

    def _outside_window(self, t: int) -> str | None:
        cfg = self.cfg
        if cfg.max_future_ms is None and cfg.max_past_ms is None:
            return None
        now = int(time.time() * SECOND_MS)
        if cfg.max_future_ms is not None and t > now + cfg.max_future_ms:
            off_s, bound_s = (t - now) / SECOND_MS, cfg.max_future_ms / SECOND_MS
            return (
                f"event time {off_s:,.0f} s ahead of this worker's clock (more than "
                f"--max-future {bound_s:g} s): a producer's clock is wrong"
            )
        if cfg.max_past_ms is not None and t < now - cfg.max_past_ms:
            off_s, bound_s = (now - t) / SECOND_MS, cfg.max_past_ms / SECOND_MS
            return (
                f"event time {off_s:,.0f} s behind this worker's clock (more than "
                f"--max-past {bound_s:g} s): replay or backfill with --backfill"
            )
        return None

    def frontier(self, lagging: Iterable[Any]) -> float:
        """Event time up to which every input has been read (``lagging``: partitions with
        records left to fetch; with none, everything buffered may go)."""
        behind = [self.latest.get(tp, -1) for tp in lagging]
        return min(behind) if behind else float("inf")

    async def drain(self, frontier: float) -> None:
        buf, taken, done, stats = self._buf, self.taken, self.done, self.stats
        while buf and (buf[0][0] <= frontier or len(buf) > MAX_BUFFERED):
            _, _, tp, raw, rec, handle = heapq.heappop(buf)
            try:
                res = await self._step(raw, rec)
            except Exception as exc:
                # (an exception here at every restart was a crash loop: the record is kept,
                # with the reason, and the worker goes on)
                log.warning("dead-lettered a record the core could not process: %r", exc)
                await self.dl.route(
                    raw, f"processing failed: {type(exc).__name__}: {exc}", DeadLetterKind.REJECTED
                )
                res = None
            if res is not None and (res.minutes or res.alerts or res.allocations or res.refused):
                await self._deliver(res, raw)
            stats.processed += 1
            if raw.offset is not None:
                offsets = taken.get(tp)
                if offsets is None:
                    offsets = taken[tp] = set()
                offsets.add(raw.offset)
            if handle is not None:
                done.append(handle)
            if not stats.processed % 200:
                # let /metrics and /healthz answer while catching up: a liveness probe
                # must not see a worker draining a large backlog as dead
                await asyncio.sleep(0)
        await self._advance(0)
        self.stats.buffered = len(buf)
        self.stats.open_minutes = self.open_minutes()

    async def _step(self, raw: RawMessage, rec: Record) -> Result | None:
        if isinstance(rec, SlurmJobEvent | K8sPodEvent):
            out = Result()
            for s, proc in self.shards.items():
                if not self._has(s, raw):
                    out.add(proc.scheduler(rec, self._owns(s)))
            return out
        shard = (raw.partition or 0) if raw.topic in self.samples_topics else 0
        if isinstance(rec, NodeSample) and self.partitions > 1:
            key = f"{rec.cluster}/{rec.node}"
            if (want := self.part(key)) != shard:
                await self.dl.route(
                    raw,
                    f"key {key!r} belongs on partition {want} of {self.partitions} (Kafka's "
                    f"murmur2 partitioner) but was written to {shard}: the producer partitions "
                    "keys differently, and its node's state would be split; use a producer "
                    "with the default partitioner",
                    DeadLetterKind.REJECTED,
                )
                return None
        return self.shards[shard].step(rec)

    async def _deliver(self, res: Result, raw: RawMessage | None) -> None:
        """Publish a shard's output; a node's idle alert goes to its allocation's merger."""
        if any(a.kind is AlertKind.IDLE_GPU and a.allocation_id for a in res.alerts):
            alerts: list[Alert] = []
            for a in res.alerts:
                if a.kind is not AlertKind.IDLE_GPU or a.allocation_id is None:
                    alerts.append(a)
                    continue
                m = self.part(a.allocation_id)
                merger = self._direct(m)
                if merger is not None:
                    alerts += merger.merge(a)
                else:
                    await self._send_episode(m, a.allocation_id.encode(), encode(a))
            res.alerts = alerts
        await self.publish(res, raw)

    def _direct(self, shard: int) -> Processor | None:
        """The merger to hand over to directly: only with no episodes topic (see above)."""
        return self.shards.get(shard) if self.episodes_topic is None else None

    async def _send_episode(self, shard: int, key: bytes, value: bytes) -> None:
        if self.episodes_topic is None:
            raise RuntimeError(f"shard {shard} is not here and there is no episodes topic")
        await self.pub.send_raw(self.episodes_topic, key, value, None, partition=shard)

    async def _advance(self, extra_ms: int) -> None:
        for proc in self.shards.values():
            for part in proc.advancing(extra_ms):  # in parts: bounded memory
                await self._deliver(part, None)
        await self._marks(final=extra_ms > 0)

    async def _marks(self, *, final: bool) -> None:
        """Every shard here tells every merger where it is (over the topic now and then)."""
        if final:
            self._quiet = True
        elif self._quiet:
            return  # nothing new since the flush: its final marks stand
        now = time.monotonic()
        remote = final or now - self._marked_at >= MARK_INTERVAL_S
        extra = self.cfg.lateness_ms if final else 0
        n = self.partitions
        for s, proc in self.shards.items():
            wm = proc.watermark(extra)
            for t in range(n):
                merger = self._direct(t)
                if merger is not None:
                    if alerts := merger.mark(s, wm, final, n):
                        await self.publish(Result(alerts=alerts), None)
                elif remote and self._marked.get((s, t)) != (wm, final):
                    value = json.dumps({"mark": s, "watermark": wm, "final": final})
                    await self._send_episode(t, b"mark", value.encode())
                    self._marked[s, t] = (wm, final)
        if remote:
            self._marked_at = now

    async def _episode(self, raw: RawMessage) -> None:
        """A merger's input from the episodes topic: a node's idle alert, or a mark."""
        shard = raw.partition or 0
        proc = self.shards.get(shard)
        if proc is None or self._has(shard, raw):
            return
        try:
            if raw.key == b"mark":
                source, wm, final = self._read_mark(raw.value or b"")
                alerts = proc.mark(source, wm, final, self.partitions)
            else:
                alerts = proc.merge(decode(ALERTS, raw.value or b""))
        except Exception as exc:
            await self.dl.route(
                raw,
                f"not an idle episode or mark: {type(exc).__name__}: {exc}",
                DeadLetterKind.REJECTED,
            )
            return
        if alerts:
            await self.publish(Result(alerts=alerts), raw)

    def _read_mark(self, value: bytes) -> tuple[int, int | None, bool]:
        """A mark as a shard wrote it, or ValueError: a shard number this group does not
        have would count towards "every shard has said where it is"."""
        m = json.loads(value)
        source, wm, final = m["mark"], m["watermark"], m["final"]
        if type(source) is not int or not 0 <= source < self.partitions:
            raise ValueError(f"mark from shard {source!r}: this group has {self.partitions}")
        if wm is not None and type(wm) is not int:
            raise ValueError(f"watermark {wm!r} is not epoch milliseconds")
        if type(final) is not bool:
            raise ValueError(f"final {final!r} is not true or false")
        return source, wm, final

    async def flush_all(self) -> None:
        """Input is quiet: process everything buffered and close every minute seen."""
        await self.drain(float("inf"))
        await self._advance(self.cfg.lateness_ms)
        self.stats.open_minutes = self.open_minutes()

    async def publish(self, res: Result, raw: RawMessage | None) -> None:
        for a in res.allocations:
            await self.pub.send(ALLOCATIONS, a)
        send = self.pub.send_encoded
        for m in res.minutes:  # the bulk of the output: the key and timestamp directly
            await send(MINUTES, MINUTES.key_for(m), encode(m), ms(m.minute))
        for al in res.alerts:
            await self.pub.send(ALERTS, al)
        for r in res.refused:
            src = raw if raw is not None and r.record is not None else None
            if src is None or encode(r.record) != src.value:
                src = RawMessage(
                    ALLOCATIONS.qualified(self.prefix), None, None, None, encode(r.record)
                )
            await self.dl.route(src, r.reason, r.kind)
        c = self.stats.counts
        c[ALLOCATIONS.name] += len(res.allocations)
        c[MINUTES.name] += len(res.minutes)
        c[ALERTS.name] += len(res.alerts)


def tune_gc() -> None:
    """For a worker process: what is loaded so far is permanent (never scanned again), and
    young collections run every 100,000 allocations instead of 700. The core allocates a
    few small lists per GPU sample that live for minutes; with the default thresholds the
    collector's passes over them took as long as the core itself."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
