"""Topics kept forever, for end-to-end tests and benchmarks (benchmarks/topics.py preloads
them): the records carry their event time as Kafka timestamp, often days in the past, which the
broker's default retention would delete."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Record, Topic, decode

M = TypeVar("M", bound=Record)


async def create_topics(kafka: KafkaSettings, names: Sequence[str], partitions: int = 1) -> None:
    """``partitions`` each, kept forever (records carry their event time as timestamp)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    kafka.topic_prefix + n, partitions, 1, topic_configs={"retention.ms": "-1"}
                )
                for n in names
            ]
        )
    finally:
        await admin.close()


async def read_topic(
    kafka: KafkaSettings, topic: Topic[M], expected: int, settle_s: float = 0.0
) -> list[M]:
    """Every record of one of the test's topics from the start: at least ``expected`` of them
    (and whatever else arrives within ``settle_s`` after, to catch extras)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic.qualified(kafka.topic_prefix),
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        # a topic a producer just auto-created may answer "leader not available" on the
        # first metadata request; the default refresh (5 min) would outlast the timeout
        metadata_max_age_ms=2000,
    )
    await consumer.start()
    out: list[M] = []
    try:
        async with asyncio.timeout(60 + settle_s):
            while len(out) < expected:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out += [decode(topic, m.value) for m in msgs]
            if settle_s:
                await asyncio.sleep(settle_s)
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out += [decode(topic, m.value) for m in msgs]
    finally:
        await consumer.stop()
    return out
