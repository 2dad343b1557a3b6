"""A preload of encoded messages, their event time as Kafka timestamp, into topics kept forever
(tests/harness/topics.py)."""

from __future__ import annotations

from collections.abc import Sequence

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import TOPICS
from tests.harness.capture import Msg
from tests.harness.topics import create_topics


async def preload(kafka: KafkaSettings, messages: Sequence[Msg], partitions: int = 1) -> None:
    await create_topics(kafka, list(TOPICS), partitions)
    async with KafkaPublisher(kafka) as pub:
        for topic, key, value, ts in messages:
            await pub.send_raw(kafka.topic_prefix + topic, key, value, ts)
