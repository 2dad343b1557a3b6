"""The demo's view of the pipeline: its topics, the worker's gauges, and how far it has got,
asked of the broker and the warehouse rather than the processes: a worker busy with a large
batch may not answer its /metrics for seconds, and a gauge read between two batches says
"nothing buffered" while most of the input is unread.

Done means: every input record is behind the worker's committed offsets, every output record
(minutes, alerts, dead letters, the scheduler events the sink keeps) is behind the sink's, the
worker holds no open minute, and no hour's rollup is older than the rows under it."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpugap.groundfloor.settings import KafkaSettings


@dataclass(frozen=True)
class Progress:
    #: per consumer group: records of its topics not yet behind its committed offsets
    lag: dict[str, int]

    @property
    def drained(self) -> bool:
        return not any(self.lag.values())


class Watch:
    """A broker client on its own event loop, for the demo's synchronous progress loop."""

    def __init__(self, kafka: KafkaSettings, groups: dict[str, tuple[str, ...]]) -> None:
        self.kafka = kafka
        self.groups = {g: tuple(kafka.topic_prefix + t for t in ts) for g, ts in groups.items()}
        self._loop = asyncio.new_event_loop()
        self._admin: Any = None
        self._consumer: Any = None
        self._partitions: dict[str, list[Any]] = {}

    def progress(self) -> Progress:
        return Progress(lag=self._loop.run_until_complete(self._lags()))

    async def _lags(self) -> dict[str, int]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        if self._admin is None:
            self._admin = AIOKafkaAdminClient(**self.kafka.client_options())
            await self._admin.start()
            self._consumer = AIOKafkaConsumer(**self.kafka.client_options())
            await self._consumer.start()
        out = {}
        for group, topics in self.groups.items():
            tps = [tp for t in topics for tp in await self._topic_partitions(t)]
            ends = await self._consumer.end_offsets(tps) if tps else {}
            committed = await self._admin.list_consumer_group_offsets(group, partitions=tps)
            lag = 0
            for tp in tps:
                done = committed.get(tp)
                at = done.offset if done is not None and done.offset >= 0 else 0
                lag += max(0, ends[tp] - at)
            out[group] = lag
        return out

    async def _topic_partitions(self, topic: str) -> list[Any]:
        from aiokafka import TopicPartition

        if topic not in self._partitions:
            (d,) = await self._admin.describe_topics([topic])
            parts = sorted(p["partition"] for p in d.get("partitions") or ())
            if d.get("error_code") or not parts:
                return []  # not created yet (nobody wrote to it): nothing to wait for
            self._partitions[topic] = [TopicPartition(topic, p) for p in parts]
        return self._partitions[topic]

    def close(self) -> None:
        async def stop() -> None:
            for client in (self._consumer, self._admin):
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close() if client is self._admin else await client.stop()

        self._loop.run_until_complete(stop())
        self._loop.close()


def stale_rollups(client: Any) -> int:
    """Hours and days whose rollup is older than the rows under them (the sink rolls up a
    moment after it stores): the report must not be read before this is 0."""
    from gpugap.warehouse.rows import STALE_DAYS, STALE_HOURS

    return sum(len(client.query(q).result_rows) for q in (STALE_HOURS, STALE_DAYS))


def worker_metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    url = f"http://127.0.0.1:{port}/metrics"
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def create_topics(kafka: KafkaSettings, group: str) -> None:
    """The inputs keep records forever: replayed records carry event times from the
    scenario's past, which time-based retention would delete under the worker."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    from gpugap.schemas import TOPICS

    async def create() -> None:
        admin = AIOKafkaAdminClient(**kafka.client_options())
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            new = [
                NewTopic(kafka.topic_prefix + n, 1, 1, topic_configs={"retention.ms": "-1"})
                for n in TOPICS
                if kafka.topic_prefix + n not in existing
            ]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(new)
            # a fresh broker creates its offsets topic on the first group request; until
            # then every consumer logs GroupCoordinatorNotAvailable at ERROR (and retries)
            for _ in range(100):
                try:
                    await admin.list_consumer_group_offsets(group)
                    break
                except KafkaError:
                    await asyncio.sleep(0.3)
        finally:
            await admin.close()

    asyncio.run(create())


def against_truth(breakdown: list[Any], truth: dict[str, Any]) -> str:
    """The report's GPU-hours per class beside the simulator's ground truth, as lines."""
    got = {g.key: g for g in breakdown}
    lines = ["Against the scenario's ground truth (GPU-hours; stored vs simulated)"]
    for cls, want in sorted(truth["by_class"].items()):
        g = got.get(cls)
        for kind in ("allocated", "consumed"):
            w = want[f"{kind}_gpu_s"] / 3600
            v = getattr(g, f"{kind}_gpu_h") if g is not None else 0.0
            dev = f"{(v - w) / w * 100:+.4f} %" if w else "-"
            lines.append(f"  {cls:12s} {kind:9s} {v:14,.2f} {w:14,.2f}  {dev}")
    return "\n".join(lines)
