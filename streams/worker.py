"""The plain aiokafka runner (``gpugap worker --engine asyncio``): Kafka in, the pure core,
Kafka out, with no framework. The Faust app (streams/app.py) is the default runner; this one
never rebalances (it owns every input partition) and is kept for single-process sites and as
the reference the Faust app is tested against.

Offsets are committed after the outputs they produced are acknowledged (at least once; the
minutes table and alert ids are idempotent downstream). The state (every node's core, gangs,
open alerts) is snapshotted at each commit into a compacted changelog topic
(``<prefix>gpugap-worker-state.<group>``, one record per node plus one for the rest, written
before the offsets are committed): a restarted worker restores it and resumes from the
offsets stored with it, so nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from groundfloor.kafka.admin import ensure_topics, wait_for_coordinator
from groundfloor.kafka.consume import RawMessage, read_latest
from groundfloor.kafka.publish import Publisher
from groundfloor.kafka.trust import ClusterTrust
from groundfloor.settings import KafkaSettings
from schemas.errors import RetriableError
from schemas.topics import SAMPLES
from streams.checkpoint import Points, start_offset
from streams.core import CoreConfig
from streams.join import Join, WorkerStats, check_copartitioned, input_topics

log = logging.getLogger(__name__)

__all__ = ["Worker", "WorkerStats", "serve_http"]


class Worker:
    def __init__(
        self,
        kafka: KafkaSettings,
        publisher: Publisher,
        *,
        group: str = "gpugap-worker",
        config: CoreConfig | None = None,
        idle_flush_s: float | None = None,
        idle_timeout_s: float | None = None,
        max_records: int = 5000,
        commit_interval_s: float = 1.0,
        healthz_stale_s: float = 60.0,
    ) -> None:
        self.kafka = kafka
        self.pub = publisher
        self.group = group
        self.config = config
        #: the clusters each topic may speak for (docs/kafka-trust.md), None: not mapped
        self.trust = ClusterTrust.from_settings(kafka)
        self.join = Join(publisher, kafka.topic_prefix, config, trust=self.trust)
        self.join.stats.stale_after_s = healthz_stale_s
        self.idle_flush_s = idle_flush_s
        self.idle_timeout_s = idle_timeout_s
        self.max_records = max_records
        self.commit_interval_s = commit_interval_s
        self.stop = asyncio.Event()
        self._next: dict[Any, int] = {}  # partition -> offset after the last one fetched
        self._consumer: Any = None
        self._partitions: dict[str, list[int]] = {}  # input topic -> its partitions

    @property
    def stats(self) -> WorkerStats:
        return self.join.stats

    @property
    def dl(self) -> Any:
        return self.join.dl

    @property
    def state_topic(self) -> str:
        return f"{self.kafka.topic_prefix}gpugap-worker-state.{self.group}"

    async def _lagging(self, consumer: Any) -> list[Any]:
        # by what was handed to us, not the fetch position: aiokafka prefetches, so a
        # partition whose records all sit in its buffer would look read (a full demo day
        # then drained the samples ahead of the scheduler events: most of them came late)
        lagging = []
        for tp in consumer.assignment():
            hw = consumer.highwater(tp)
            if hw is None or self._next.get(tp, 0) < hw:
                lagging.append(tp)
        return lagging

    def lag(self) -> dict[str, int]:
        """Per input partition: records the broker holds beyond what was handed to us."""
        c = self._consumer
        if c is None:
            return {}
        return {
            f"{tp.topic}:{tp.partition}": max(0, (c.highwater(tp) or 0) - self._next.get(tp, 0))
            for tp in c.assignment()
        }

    def _committable(self) -> dict[Any, int]:
        low = self.join.lowest_buffered()
        return {tp: low.get(tp, nxt) for tp, nxt in self._next.items()}

    async def _ensure_state_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        names = input_topics(self.kafka.topic_prefix, self.trust)
        await ensure_topics(self.kafka, names)  # a worker started before its producers
        await ensure_topics(
            self.kafka, [self.state_topic], partitions=1, configs={"cleanup.policy": "compact"}
        )
        admin = AIOKafkaAdminClient(**self.kafka.client_options())
        await admin.start()
        try:
            for d in await admin.describe_topics(names):
                parts = sorted(p["partition"] for p in d.get("partitions") or ())
                if d.get("error_code") or not parts:
                    raise RetriableError(f"worker: input topic {d.get('topic')} is not there yet")
                self._partitions[d["topic"]] = parts
        finally:
            await admin.close()
        samples = self.join.samples_topics
        check_copartitioned(
            {t: len(p) for t, p in self._partitions.items() if t in samples},
            self.kafka.topic_prefix,
        )

    async def _restore(self) -> dict[int, Points]:
        """Load the latest snapshot of every shard; returns the resume points stored."""
        await self._ensure_state_topic()
        latest = await read_latest(self.kafka, self.state_topic, [0])
        # one shard per partition of the samples (this engine owns them all)
        stats = self.join.stats
        shards = len(self._partitions[SAMPLES.qualified(self.kafka.topic_prefix)])
        self.join = Join(
            self.pub, self.kafka.topic_prefix, self.config, partitions=shards, trust=self.trust
        )
        self.join.stats = stats
        restored = self.join.restore(latest)
        if restored:
            log.info("restored %d shard(s) at offsets %s", len(restored), restored)
        return restored

    async def _assign(self, consumer: Any, restored: dict[int, Points]) -> None:
        """Own every partition of the inputs (no group rebalances: one worker, or one per
        shard), positioned where the restored snapshot stops, else at the group's commit."""
        from aiokafka import TopicPartition

        tps = [TopicPartition(t, p) for t, parts in self._partitions.items() for p in parts]
        consumer.assign(tps)
        glob = self.join.global_topics
        for tp in tps:
            readers = self.join.shards if tp.topic in glob else [tp.partition]
            offset = start_offset(restored, f"{tp.topic}:{tp.partition}", readers)
            if not restored:
                offset = await consumer.committed(tp)
            if offset is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
                self._next[tp] = offset
        log.info("assigned %d partition(s), restored: %s", len(tps), restored is not None)

    async def run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        restored = await self._restore()
        await wait_for_coordinator(self.kafka, self.group)  # its commits need the coordinator
        consumer = AIOKafkaConsumer(
            **self.kafka.client_options(),
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        self._consumer = consumer
        await self._assign(consumer, restored)
        loop = asyncio.get_running_loop()
        idle_since = last_commit = loop.time()
        flushed = False  # a restored state may hold open minutes even if nothing new comes
        try:
            while not self.stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=self.max_records)
                self.stats.last_poll = time.monotonic()
                for tp, messages in batches.items():
                    for m in messages:
                        self._next[tp] = m.offset + 1
                        await self.join.ingest(tp, RawMessage.of(m))
                if batches:
                    idle_since, flushed = loop.time(), False
                lagging = await self._lagging(consumer)
                await self.join.drain(self.join.frontier(lagging))
                idle = loop.time() - idle_since
                # quiet input, not a slow fetch: closing every minute while a partition still
                # has records to read would make all of them late
                if (
                    not flushed
                    and not lagging
                    and self.idle_flush_s is not None
                    and idle >= self.idle_flush_s
                ):
                    await self.join.flush_all()
                    flushed = True
                    last_commit = 0.0
                if self.join.checkpoint_due(loop.time() - last_commit, self.commit_interval_s):
                    await self._commit(consumer)
                    last_commit = loop.time()
                if self.idle_timeout_s is not None and idle >= self.idle_timeout_s and flushed:
                    break
            await self._commit(consumer)
        finally:
            await consumer.stop()

    async def _commit(self, consumer: Any) -> None:
        offsets = self._committable()
        await self.pub.flush()  # the outputs first: a stored snapshot implies its outputs are
        keyed = self.join.resume_points(self._next)
        for _, key, value in self.join.snapshot(keyed):
            await self.pub.send_raw(self.state_topic, key, value)
        await self.pub.flush()
        self.join.snapshot_stored()
        if offsets:
            await consumer.commit(offsets)
            log.info("committed %s", keyed)


async def serve_http(worker: Worker, host: str, port: int) -> asyncio.AbstractServer:
    """Liveness (``/healthz``: 200 while the consumer polls) and Prometheus ``/metrics``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode(errors="replace")
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(" ")[1] if " " in line else "/"
            stale = worker.stats.stale()
            if path.startswith("/metrics"):
                status, body = "200 OK", worker.stats.prometheus(worker.dl.counts, worker.lag())
            elif path.startswith("/healthz"):
                status, body = (
                    ("503 Service Unavailable", "stalled\n") if stale else ("200 OK", "ok\n")
                )
            else:
                status, body = "404 Not Found", "not found\n"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
