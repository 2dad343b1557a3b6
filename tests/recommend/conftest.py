"""One warehouse holding the scenario week (tests/recommend/scenario.py) for the module, and
the ClickHouse sink run over a test's topics: the one way recommendations reach the
warehouse."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from gpugap.groundfloor.ratecard import validate_card, write_rate_card
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import Record
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from tests.recommend.scenario import RATE_CARD, records


def write(settings: ClickHouseSettings, rows: list[Record]) -> None:
    async def store() -> None:
        sink = ClickHouseSink(settings)
        await sink.start()
        await sink.write(rows)
        await sink.close()

    asyncio.run(store())


def run_sink(kafka: KafkaSettings, settings: ClickHouseSettings, idle_s: float = 4.0) -> int:
    """The ClickHouse sink over the test's topics, as ``gpugap sink clickhouse`` runs it (its
    consumer group, dead letters to the broker), until idle for ``idle_s``: records stored."""
    from gpugap.groundfloor.kafka.consume import DeadLetters
    from gpugap.groundfloor.kafka.publish import KafkaPublisher

    async def run() -> int:
        sink = ClickHouseSink(settings, max_age_s=0.5)
        async with KafkaPublisher(kafka) as dlq:
            await sink.run(
                kafka,
                DeadLetters(dlq, "sink-clickhouse", kafka.topic_prefix),
                group="gpugap-sink-clickhouse",
                idle_timeout_s=idle_s,
            )
        return sink.stored

    return asyncio.run(run())


@pytest.fixture(scope="module")
def week(clickhouse_server: ClickHouseSettings) -> Iterator[ClickHouseSettings]:
    """A database of this module's own with the scenario written through the sink."""
    from gpugap.warehouse.client import connect
    from gpugap.warehouse.migrate import migrate

    settings = clickhouse_server.model_copy(update={"database": f"r{uuid.uuid4().hex[:10]}"})
    migrate(settings)
    write(settings, records())
    client = connect(settings)
    try:
        write_rate_card(client, validate_card(RATE_CARD, "scenario"), "scenario")
    finally:
        client.close()
    yield settings
    admin = connect(settings, database=False)
    try:
        admin.command(f"DROP DATABASE IF EXISTS `{settings.database}`")
    finally:
        admin.close()
