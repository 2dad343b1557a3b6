"""Topics for benchmarks and end-to-end tests: one partition each, kept forever, and a
preload of encoded messages with their event time as Kafka timestamp."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.worker_inproc import Msg
from groundfloor.kafka.publish import KafkaPublisher
from groundfloor.settings import KafkaSettings
from schemas import TOPICS


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


async def preload(kafka: KafkaSettings, messages: Sequence[Msg], partitions: int = 1) -> None:
    await create_topics(kafka, list(TOPICS), partitions)
    async with KafkaPublisher(kafka) as pub:
        for topic, key, value, ts in messages:
            await pub.send_raw(kafka.topic_prefix + topic, key, value, ts)
