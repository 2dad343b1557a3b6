"""Every part creates the topics it uses (and waits for a fresh broker's group coordinator)
first, so runs that work print no ERROR: aiokafka logs a topic that auto-creation is still
making as "Topic ... not found in cluster metadata" and a fresh broker's first group request
as "Group Coordinator Request failed: ... GroupCoordinatorNotAvailableError", both at ERROR."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpugap.cli import main
from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings, Settings
from gpugap.schemas import Record, Topic
from gpugap.schemas.errors import GpugapError
from gpugap.schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    DEAD_LETTER,
    MINUTES,
    NODE_CAPACITY,
    SAMPLES,
)
from gpugap.services.kafka import LocalKafka
from gpugap.sinks.base import BatchingSink
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.streams.join import INPUTS as WORKER_INPUTS
from tests.harness.commands import run_worker
from tests.harness.services import unavailable

pytestmark = pytest.mark.kafka

INPUTS = [t.name for t in WORKER_INPUTS]


def loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What a user would call noise or trouble: any ERROR, and aiokafka's WARNINGs (a topic
    "not available during auto-create initialization")."""
    return [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR
        or (r.levelno >= logging.WARNING and r.name.startswith("aiokafka"))
    ]


async def topics(kafka: KafkaSettings) -> dict[str, Any]:
    """The prefix's topics on the broker: name (prefix removed) -> its metadata."""
    from aiokafka.admin import AIOKafkaAdminClient

    client = AIOKafkaAdminClient(**kafka.client_options())
    await client.start()
    try:
        names = [t for t in await client.list_topics() if t.startswith(kafka.topic_prefix)]
        described = await client.describe_topics(names) if names else []
        return {d["topic"][len(kafka.topic_prefix) :]: d for d in described}
    finally:
        await client.close()


def simulate(path: Path) -> None:
    args = ["simulate", "--scenario", "small", "--duration", "10m", "--as-fast-as-possible"]
    assert main([*args, "--out", str(path)]) == 0


async def replay(kafka: KafkaSettings, path: Path) -> None:
    from gpugap.producers.base import run_producer
    from gpugap.producers.replay.producer import Replay

    await run_producer(Replay(Settings(kafka=kafka), path), KafkaPublisher(kafka))


class MemorySink(BatchingSink):
    """The ClickHouse sink's topics and consume loop, stored in memory."""

    name = "memory"
    topics: ClassVar[tuple[Topic[Any], ...]] = ClickHouseSink.topics

    def __init__(self) -> None:
        super().__init__(max_age_s=0.1)
        self.got: list[Record] = []

    async def write(self, batch: Sequence[Record]) -> None:
        self.got.extend(batch)


async def sink(kafka: KafkaSettings) -> MemorySink:
    s = MemorySink()
    async with KafkaPublisher(kafka) as dlq:
        await s.run(kafka, DeadLetters(dlq, "sink-memory", kafka.topic_prefix), idle_timeout_s=1)
    return s


def test_replay_creates_its_topics_first(
    kafka: KafkaSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    simulate(tmp_path / "sim.jsonl")
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", kafka.topic_prefix)
    caplog.clear()
    assert main(["replay", str(tmp_path / "sim.jsonl")]) == 0
    assert loud(caplog) == []
    # the worker's inputs, and the node capacity polls the sink reads
    assert set(asyncio.run(topics(kafka))) == {*INPUTS, NODE_CAPACITY.name}


def test_worker_started_before_the_producers(kafka: KafkaSettings, tmp_path: Path) -> None:
    # the README's order: the worker first, on topics nobody has written to yet
    first = run_worker(kafka, idle_timeout_s=1)
    assert [ln for ln in first.stderr.splitlines() if "ERROR" in ln] == []
    found = asyncio.run(topics(kafka))
    state, episodes = "gpugap-worker-state-changelog", "gpugap-worker-idle-episodes"
    assert {*INPUTS, state, episodes} <= set(found)
    # one state partition per shard, and a shard per partition of the samples
    shards = len(found[SAMPLES.name]["partitions"])
    assert len(found[state]["partitions"]) == len(found[episodes]["partitions"]) == shards
    simulate(tmp_path / "sim.jsonl")
    asyncio.run(replay(kafka, tmp_path / "sim.jsonl"))
    second = run_worker(kafka, idle_timeout_s=1)
    assert second.counts[MINUTES.name] > 0
    assert [ln for ln in second.stderr.splitlines() if "ERROR" in ln] == []
    assert {MINUTES.name, ALLOCATIONS.name, ALERTS.name} <= set(asyncio.run(topics(kafka)))


def test_faust_worker_creates_its_outputs_first(kafka: KafkaSettings, tmp_path: Path) -> None:
    simulate(tmp_path / "sim.jsonl")
    asyncio.run(replay(kafka, tmp_path / "sim.jsonl"))
    cmd = [sys.executable, "-m", "gpugap", "worker", "--http", "", "--backfill"]
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
    }
    done = subprocess.run(
        [*cmd, "--idle-flush", "1", "--idle-timeout", "2"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [ln for ln in done.stderr.splitlines() if "ERROR" in ln]
    assert errors == [], done.stderr[-3000:]
    assert {MINUTES.name, ALLOCATIONS.name, ALERTS.name} <= set(asyncio.run(topics(kafka)))


def test_sink_creates_the_topics_it_reads_first(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    # nothing written yet, the dead-letter topic least of all (no bad record so far)
    asyncio.run(sink(kafka))
    assert loud(caplog) == []
    assert set(asyncio.run(topics(kafka))) == {t.name for t in ClickHouseSink.topics}


def test_a_fresh_broker_prints_no_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first consumer group of a broker's life: its offsets topic is made meanwhile."""
    broker = LocalKafka.ephemeral(ServicesSettings(), tmp_path / "kafka")
    try:
        try:
            broker.up()
        except GpugapError as exc:
            unavailable(f"could not start a local Kafka broker: {exc}")
        kafka = KafkaSettings(bootstrap=broker.bootstrap, topic_prefix="fresh.", linger_ms=5)
        simulate(tmp_path / "sim.jsonl")
        caplog.clear()
        asyncio.run(replay(kafka, tmp_path / "sim.jsonl"))
        stored = asyncio.run(sink(kafka))  # the broker's first group
        assert loud(caplog) == []
        assert {*INPUTS, DEAD_LETTER.name} <= set(asyncio.run(topics(kafka)))
        assert stored.got  # the replayed Slurm and Kubernetes events
    finally:
        broker.down()


# --- no broker: what a principal without the right to create topics sees -----------------


class _Denied:
    """An admin client of a cluster that lets nobody create topics."""

    created: ClassVar[list[list[tuple[str, int, int]]]] = []

    def __init__(self, **options: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return ["exists"]

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": 1}, {"node_id": 2}, {"node_id": 3}], "controller_id": 1}

    async def describe_configs(self, resources: Any) -> Any:
        from aiokafka.errors import ClusterAuthorizationFailedError

        raise ClusterAuthorizationFailedError()

    async def create_topics(self, new: list[Any]) -> Any:
        type(self).created.append([(t.name, t.num_partitions, t.replication_factor) for t in new])

        class Response:
            topic_errors = [(t.name, 29, "Authorization failed.") for t in new]

        return Response()


def test_no_right_to_create_topics_is_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import aiokafka.admin

    from gpugap.groundfloor.kafka import admin

    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", _Denied)
    monkeypatch.setattr(admin, "_settled", set())
    settings = KafkaSettings(bootstrap="denied:9092")
    for _ in range(2):
        assert asyncio.run(admin.ensure_topics(settings, ["exists", "a", "b"])) == []
    # asked once, with the fallback defaults (no right to read the broker's either)
    assert _Denied.created == [[("a", 1, 3), ("b", 1, 3)]]
    warnings = [r for r in caplog.records if r.name == "gpugap.groundfloor.kafka.admin"]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert "they must exist" in warnings[0].getMessage()
    assert "a, b" in warnings[0].getMessage()
