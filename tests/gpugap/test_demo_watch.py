"""The demo's done-test asks the broker, not the worker: lag is what a group has not committed."""

from __future__ import annotations

import asyncio

from gpugap.demo_watch import Watch
from gpugap.settings import KafkaSettings
from tests.conftest import create_topics


async def _produce_and_commit(
    kafka: KafkaSettings, topic: str, n: int, commits: tuple[int, int] | None
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, str(i).encode(), partition=i % 2)
    finally:
        await producer.stop()
    if commits:
        c = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap, group_id="g-in", enable_auto_commit=False
        )
        await c.start()
        try:
            offsets = {
                TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in enumerate(commits)
            }
            c.assign(list(offsets))
            await c.commit(offsets)
        finally:
            await c.stop()


def test_lag_is_end_offsets_minus_the_groups_commits(kafka: KafkaSettings) -> None:
    asyncio.run(create_topics(kafka, ["in", "out"], partitions=2))
    asyncio.run(_produce_and_commit(kafka, kafka.topic_prefix + "in", 6, (3, 2)))
    asyncio.run(_produce_and_commit(kafka, kafka.topic_prefix + "out", 4, None))
    watch = Watch(kafka, {"g-in": ("in",), "g-out": ("out",), "g-none": ("missing",)})
    try:
        p = watch.progress()
        # in: 3 + 3 records, committed 3 and 2; out: 4 records, nothing committed by g-out;
        # a topic nobody created holds nothing to wait for
        assert p.lag == {"g-in": 1, "g-out": 4, "g-none": 0}
        assert not p.drained
        asyncio.run(_produce_and_commit(kafka, kafka.topic_prefix + "in", 0, (3, 3)))
        assert watch.progress().lag["g-in"] == 0
    finally:
        watch.close()
