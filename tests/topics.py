"""Topics kept forever, for end-to-end tests and benchmarks (benchmarks/topics.py preloads
them): the records carry their event time as Kafka timestamp, often days in the past, which the
broker's default retention would delete."""

from __future__ import annotations

from collections.abc import Sequence

from groundfloor.settings import KafkaSettings


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
