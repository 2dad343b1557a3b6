"""The asyncio worker: Kafka in, the pure core, Kafka out (``gpugap worker``).

Reads ``gpu.samples.v1``, ``slurm.jobs.v1`` and ``k8s.pods.v1`` in one consumer group and
merges them in **event time**: records are buffered and handed to the core in time order up
to the frontier (the oldest latest-timestamp among partitions that are not caught up), so a
fast samples partition cannot run ahead of the scheduler events and make them late. Emits
``gpu.allocations.v1`` (for other consumers), ``gpu.minutes.v1``, ``alerts.v1`` and
dead letters (bad bytes, late data, refused events, each with its reason).

Offsets are committed after the outputs they produced are acknowledged (at least once; the
minutes table and alert ids are idempotent downstream). The state (every node's core, gangs,
open alerts) is snapshotted at each commit into a compacted changelog topic
(``<prefix>gpugap-worker-state.<group>``, one record per node plus one for the rest, written
before the offsets are committed): a restarted worker restores it and resumes from the
offsets stored with it, so nothing is lost and nothing is counted twice (records read again
are duplicates the core ignores by event id and sample time).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpugap.consume import DeadLetters, RawMessage
from gpugap.errors import RetriableError
from gpugap.publish import Publisher
from gpugap.settings import KafkaSettings
from schemas import NodeSample, Record, encode
from schemas.topics import ALERTS, ALLOCATIONS, K8S_PODS, MINUTES, SAMPLES, SLURM_JOBS

from .core import CoreConfig, ms
from .process import Processor, Result

log = logging.getLogger(__name__)

INPUTS = (SAMPLES, SLURM_JOBS, K8S_PODS)


@dataclass
class WorkerStats:
    started: float = field(default_factory=time.monotonic)
    messages: int = 0
    processed: int = 0  # records handed to the core (in event-time order)
    gpu_samples: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # outputs by topic
    last_poll: float = field(default_factory=time.monotonic)
    buffered: int = 0
    open_minutes: int = 0
    core: dict[str, int] = field(default_factory=dict)

    def prometheus(self, dead: Counter[str]) -> str:
        up = time.monotonic() - self.started
        lines = [
            f"gpugap_worker_uptime_seconds {up:.1f}",
            f"gpugap_worker_messages_total {self.messages}",
            f"gpugap_worker_processed_total {self.processed}",
            f"gpugap_worker_gpu_samples_total {self.gpu_samples}",
            f"gpugap_worker_buffered_records {self.buffered}",
            f"gpugap_worker_open_minutes {self.open_minutes}",
            f"gpugap_worker_seconds_since_poll {time.monotonic() - self.last_poll:.1f}",
        ]
        lines += [f'gpugap_worker_output_total{{topic="{k}"}} {v}' for k, v in self.counts.items()]
        lines += [f'gpugap_worker_core_total{{what="{k}"}} {v}' for k, v in self.core.items()]
        lines += [f'gpugap_worker_dead_letters_total{{kind="{k}"}} {v}' for k, v in dead.items()]
        return "\n".join(lines) + "\n"


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
    ) -> None:
        self.kafka = kafka
        self.pub = publisher
        self.group = group
        self.proc = Processor(config)
        self.dl = DeadLetters(publisher, "worker", kafka.topic_prefix)
        self.idle_flush_s = idle_flush_s
        self.idle_timeout_s = idle_timeout_s
        self.max_records = max_records
        self.commit_interval_s = commit_interval_s
        self.stop = asyncio.Event()
        self.stats = WorkerStats()
        self._buf: list[tuple[int, int, Any, RawMessage, Record]] = []
        self._seq = 0
        self._latest: dict[Any, int] = {}  # partition -> latest event time fetched
        self._next: dict[Any, int] = {}  # partition -> offset after the last one fetched
        self._partitions: dict[str, list[int]] = {}  # input topic -> its partitions

    async def _publish(self, res: Result, raw: RawMessage | None) -> None:
        for a in res.allocations:
            await self.pub.send(ALLOCATIONS, a)
        for m in res.minutes:
            await self.pub.send(MINUTES, m)
        for al in res.alerts:
            await self.pub.send(ALERTS, al)
        for r in res.refused:
            src = raw if raw is not None and r.record is not None else None
            if src is None or encode(r.record) != src.value:
                topic = ALLOCATIONS.qualified(self.kafka.topic_prefix)
                src = RawMessage(topic, None, None, None, encode(r.record))
            await self.dl.route(src, r.reason, r.kind)
        c = self.stats.counts
        c[ALLOCATIONS.name] += len(res.allocations)
        c[MINUTES.name] += len(res.minutes)
        c[ALERTS.name] += len(res.alerts)

    async def _frontier(self, consumer: Any) -> float:
        lagging = []
        for tp in consumer.assignment():
            hw = consumer.highwater(tp)
            if hw is None or await consumer.position(tp) < hw:
                lagging.append(tp)
        if not lagging:
            return float("inf")
        return min(self._latest.get(tp, -1) for tp in lagging)

    async def _drain(self, frontier: float) -> None:
        buf = self._buf
        while buf and (buf[0][0] <= frontier or len(buf) > 500_000):
            _, _, _, raw, rec = heapq.heappop(buf)
            await self._publish(self.proc.handle(rec), raw)
            self.stats.processed += 1
        await self._publish(self.proc.advance(), None)

    def _committable(self) -> dict[Any, int]:
        low: dict[Any, int] = {}
        for _, _, tp, raw, _ in self._buf:
            if raw.offset is not None:
                low[tp] = min(low.get(tp, raw.offset), raw.offset)
        return {tp: low.get(tp, nxt) for tp, nxt in self._next.items()}

    @property
    def state_topic(self) -> str:
        return f"{self.kafka.topic_prefix}gpugap-worker-state.{self.group}"

    async def _ensure_state_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(**self.kafka.client_options())
        await admin.start()
        try:
            names = [t.qualified(self.kafka.topic_prefix) for t in INPUTS]
            for d in await admin.describe_topics(names):
                parts = sorted(p["partition"] for p in d.get("partitions") or ())
                if d.get("error_code") or not parts:
                    raise RetriableError(f"worker: input topic {d.get('topic')} is not there yet")
                self._partitions[d["topic"]] = parts
            if self.state_topic not in await admin.list_topics():
                topic = NewTopic(
                    self.state_topic, 1, 1, topic_configs={"cleanup.policy": "compact"}
                )
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics([topic])
        finally:
            await admin.close()

    async def _restore(self) -> dict[str, int] | None:
        """Load the latest snapshot; returns the input offsets stored with it."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        await self._ensure_state_topic()
        c = AIOKafkaConsumer(**self.kafka.client_options(), enable_auto_commit=False)
        await c.start()
        latest: dict[bytes, bytes] = {}
        try:
            tp = TopicPartition(self.state_topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            end = (await c.end_offsets([tp]))[tp]
            while await c.position(tp) < end:
                for msgs in (await c.getmany(tp, timeout_ms=1000)).values():
                    for m in msgs:
                        latest[m.key] = m.value
        finally:
            await c.stop()
        meta = latest.pop(b"meta", None)
        if meta is None:
            return None
        state = json.loads(zlib.decompress(meta))
        nodes = {k.decode()[5:]: json.loads(zlib.decompress(v)) for k, v in latest.items()}
        offsets: dict[str, int] = state.pop("offsets")
        keys = set(state.pop("node_keys"))
        state["nodes"] = {k: v for k, v in nodes.items() if k in keys}
        self.proc = Processor(self.proc.cfg, state=state)
        log.info("restored the state of %d node(s) at offsets %s", len(keys), offsets)
        return offsets

    async def _snapshot(self, offsets: dict[Any, int]) -> None:
        st = self.proc.state
        for key, node in st["nodes"].items():
            value = zlib.compress(json.dumps(node, separators=(",", ":")).encode(), 1)
            await self.pub.send_raw(self.state_topic, f"node:{key}".encode(), value)
        meta = {k: v for k, v in st.items() if k != "nodes"}
        meta["node_keys"] = sorted(st["nodes"])
        meta["offsets"] = {f"{tp.topic}:{tp.partition}": o for tp, o in offsets.items()}
        value = zlib.compress(json.dumps(meta, separators=(",", ":")).encode(), 1)
        await self.pub.send_raw(self.state_topic, b"meta", value)

    async def _assign(self, consumer: Any, restored: dict[str, int] | None) -> None:
        """Own every partition of the inputs (no group rebalances: one worker, or one per
        shard), positioned where the restored snapshot stops, else at the group's commit."""
        from aiokafka import TopicPartition

        tps = [TopicPartition(t, p) for t, parts in self._partitions.items() for p in parts]
        consumer.assign(tps)
        for tp in tps:
            key = f"{tp.topic}:{tp.partition}"
            offset = restored.get(key) if restored else await consumer.committed(tp)
            if offset is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
                self._next[tp] = offset
        log.info("assigned %d partition(s), restored: %s", len(tps), restored is not None)

    async def _ingest(self, batches: dict[Any, list[Any]]) -> None:
        for tp, messages in batches.items():
            for m in messages:
                raw = RawMessage.of(m)
                self._next[tp] = m.offset + 1
                self.stats.messages += 1
                rec = await self.dl.decode(raw)
                if rec is None:
                    continue
                t = ms(rec.time)  # type: ignore[attr-defined]
                self._latest[tp] = max(self._latest.get(tp, t), t)
                if isinstance(rec, NodeSample):
                    self.stats.gpu_samples += len(rec.gpus)
                self._seq += 1
                heapq.heappush(self._buf, (t, self._seq, tp, raw, rec))

    async def run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        restored = await self._restore()
        consumer = AIOKafkaConsumer(
            **self.kafka.client_options(),
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        await self._assign(consumer, restored)
        loop = asyncio.get_running_loop()
        idle_since = last_commit = loop.time()
        flushed = False  # a restored state may hold open minutes even if nothing new comes
        try:
            while not self.stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=self.max_records)
                self.stats.last_poll = time.monotonic()
                await self._ingest(batches)
                if batches:
                    idle_since, flushed = loop.time(), False
                await self._drain(await self._frontier(consumer))
                idle = loop.time() - idle_since
                if not flushed and self.idle_flush_s is not None and idle >= self.idle_flush_s:
                    await self._drain(float("inf"))
                    res = self.proc.advance(self.proc.cfg.lateness_ms)
                    await self._publish(res, None)
                    flushed = True
                    last_commit = 0.0
                if loop.time() - last_commit >= self.commit_interval_s:
                    await self._commit(consumer)
                    last_commit = loop.time()
                self.stats.buffered = len(self._buf)
                self.stats.open_minutes = self.proc.open_minutes()
                if self.idle_timeout_s is not None and idle >= self.idle_timeout_s and flushed:
                    break
            await self._commit(consumer)
        finally:
            await consumer.stop()

    async def _commit(self, consumer: Any) -> None:
        offsets = self._committable()
        await self.pub.flush()  # the outputs first: a stored snapshot implies its outputs are
        await self._snapshot(offsets)
        await self.pub.flush()
        if offsets:
            await consumer.commit(offsets)
            log.info("committed %s", {f"{tp.topic}:{tp.partition}": o for tp, o in offsets.items()})
        self.stats.core = self.proc.counts()


async def serve_http(worker: Worker, host: str, port: int) -> asyncio.AbstractServer:
    """Liveness (``/healthz``: 200 while the consumer polls) and Prometheus ``/metrics``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode(errors="replace")
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(" ")[1] if " " in line else "/"
            stale = time.monotonic() - worker.stats.last_poll > 60
            if path.startswith("/metrics"):
                status, body = "200 OK", worker.stats.prometheus(worker.dl.counts)
            elif path.startswith("/healthz"):
                status, body = (
                    ("503 Service Unavailable", "stalled\n")
                    if stale
                    else (
                        "200 OK",
                        "ok\n",
                    )
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
