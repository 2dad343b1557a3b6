"""The ClickHouse sink with the real broker and the real endpoint: nothing lost, nothing doubled,
through outages, crashes and poison records."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import TOPICS, DeadLetter
from gpugap.schemas.examples import gpu_uuid, one_of_each
from gpugap.schemas.topics import ALERTS, DEAD_LETTER, K8S_PODS, MINUTES, SLURM_JOBS
from gpugap.services.kafka import free_port
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from gpugap.warehouse.migrate import migrate
from gpugap.warehouse.rows import minute_ms
from tests.harness.embedded_clickhouse import EmbeddedClickHouse
from tests.harness.topics import create_topics, read_topic

pytestmark = pytest.mark.kafka

START = datetime(2026, 11, 1, tzinfo=UTC)
GPUS = 1000
UUIDS = [gpu_uuid(f"n{g // 8:03d}", g % 8) for g in range(GPUS)]


def minute_bytes(i: int) -> tuple[bytes, bytes]:
    """The i-th GPU-minute as wire bytes (built directly: a million pydantic objects would
    only slow the test down; the sink decodes and validates every one of them)."""
    g, m = i % GPUS, i // GPUS
    node = f"n{g // 8:03d}"
    minute = (START + timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    allocated = (i * 7919) % 60_001 / 1000
    alloc = (
        f'"allocation_id":"slurm/c1/{g // 8}","scheduler":"slurm","workload_class":"batch",'
        f'"owner":"u{g % 5}","team":"t{g % 3}",'
        if i % 10
        else ""
    )
    value = (
        f'{{"cluster":"c1","node":"{node}","gpu_uuid":"{UUIDS[g]}","minute":"{minute}",'
        f'"allocated_s":{allocated if alloc else 0.0},"consumed_gpu_s":'
        f'{allocated / 2 if alloc else 0.5},"unallocated_s":{0.0 if alloc else 60.0},'
        f'{alloc}"sample_count":6,"no_samples":false,"activity_max":0.9,'
        f'"activity_metric":"sm_active","power_w_avg":312.5}}'
    )
    return f"c1/{node}".encode(), value.encode()


def expected(n: int) -> tuple[int, int, int]:
    """(rows, allocated ms, consumed ms) for the first n records, stored to the millisecond."""
    alloc_ms = consumed_ms = 0
    for i in range(n):
        if i % 10:
            a = (i * 7919) % 60_001
            alloc_ms += a
            consumed_ms += minute_ms(a / 1000 / 2)
        else:
            consumed_ms += 500
    return n, alloc_ms, consumed_ms


async def produce_minutes(kafka: KafkaSettings, n: int, first: int = 0) -> None:
    async with KafkaPublisher(kafka) as pub:
        topic = MINUTES.qualified(kafka.topic_prefix)
        for i in range(first, first + n):
            key, value = minute_bytes(i)
            await pub.send_raw(topic, key, value)


def totals(settings: ClickHouseSettings) -> tuple[int, int, int]:
    c = connect(settings)
    try:
        row = c.query(
            "SELECT count(), sum(allocated_ms), sum(consumed_ms) FROM gpu_minutes FINAL"
        ).result_rows[0]
        return int(row[0]), int(row[1]), int(row[2])
    finally:
        c.close()


async def run_sink(
    kafka: KafkaSettings, ch: ClickHouseSettings, idle_s: float = 6.0, **batching: float
) -> ClickHouseSink:
    sink = ClickHouseSink(ch, rollup_interval_s=0, **batching)  # type: ignore[arg-type]
    async with KafkaPublisher(kafka) as dlq:
        await sink.run(
            kafka, DeadLetters(dlq, "sink-test", kafka.topic_prefix), idle_timeout_s=idle_s
        )
    return sink


@pytest.fixture
def topics(kafka: KafkaSettings) -> KafkaSettings:
    asyncio.run(
        create_topics(
            kafka,
            [MINUTES.name, SLURM_JOBS.name, K8S_PODS.name, ALERTS.name, DEAD_LETTER.name],
            partitions=2,
        )
    )
    return kafka


def test_a_million_minutes_become_exactly_a_million_rows(
    topics: KafkaSettings, clickhouse: ClickHouseSettings
) -> None:
    n = 1_000_000
    asyncio.run(produce_minutes(topics, n))
    sink = asyncio.run(run_sink(topics, clickhouse))
    assert sink.stored == n
    assert totals(clickhouse) == expected(n)
    c = connect(clickhouse)
    try:  # both rollups and the views agree with the rows, to the millisecond
        hourly = c.query(
            "SELECT sum(allocated_gpu_h), sum(consumed_gpu_h) FROM v_capacity_gap"
        ).result_rows[0]
        daily = c.query(
            "SELECT sum(allocated_gpu_h), sum(consumed_gpu_h) FROM v_capacity_gap_daily"
        ).result_rows[0]
        unalloc = c.query(
            "SELECT sum(unallocated_gpu_h), sum(unattributed_gpu_h) FROM v_unallocated"
        ).result_rows[0]
        top = c.query("SELECT sum(gap_gpu_h), count() FROM v_top_waste").result_rows[0]
    finally:
        c.close()
    _, alloc_ms, consumed_ms = expected(n)
    unattributed_ms = 500 * (n // 10)
    for gap in (hourly, daily):
        assert gap[0] * 3_600_000 == pytest.approx(alloc_ms, abs=1)
        assert gap[1] * 3_600_000 == pytest.approx(consumed_ms - unattributed_ms, abs=1)
    assert top[0] * 3_600_000 == pytest.approx(alloc_ms - consumed_ms + unattributed_ms, abs=1)
    assert top[1] == GPUS // 8  # one allocation per node
    assert unalloc[0] * 3600 == pytest.approx(60 * n / 10, abs=1e-3)
    assert unalloc[1] * 3_600_000 == pytest.approx(unattributed_ms, abs=1)


def test_clickhouse_down_for_30s_loses_and_doubles_nothing(
    topics: KafkaSettings, tmp_path: Path
) -> None:
    server = EmbeddedClickHouse(tmp_path / "ch", free_port())
    server.start()
    ch = ClickHouseSettings(url=server.url, database="gpugap", password_file=server.password_file)
    migrate(ch)
    n = 150_000

    async def scenario() -> ClickHouseSink:
        await produce_minutes(topics, n)
        task = asyncio.create_task(
            run_sink(topics, ch, idle_s=10, max_records=5_000, max_age_s=0.2)
        )
        while await asyncio.to_thread(lambda: totals(ch)[0]) < 20_000:
            await asyncio.sleep(0.2)
        await asyncio.to_thread(server.stop)
        down_at = time.monotonic()
        await asyncio.sleep(30)
        await asyncio.to_thread(server.start)
        sink = await task
        assert time.monotonic() - down_at >= 30
        return sink

    try:
        sink = asyncio.run(scenario())
        assert sink.retries > 0, "the sink never noticed the outage"
        assert totals(ch) == expected(n)
    finally:
        server.stop()


def test_sink_killed_mid_batch_and_restarted_keeps_totals(
    topics: KafkaSettings, clickhouse: ClickHouseSettings
) -> None:
    n = 200_000
    asyncio.run(produce_minutes(topics, n))
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": topics.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": topics.topic_prefix,
        "GPUGAP_CLICKHOUSE_URL": clickhouse.url,
        "GPUGAP_CLICKHOUSE_DATABASE": clickhouse.database,
        "GPUGAP_CLICKHOUSE_PASSWORD": clickhouse.password.get_secret_value()  # type: ignore[union-attr]
        if clickhouse.password
        else "",
    }
    cmd = [
        sys.executable,
        "-m",
        "gpugap",
        "sink",
        "clickhouse",
        "--max-records",
        "20000",
        "--max-age",
        "0.5",
    ]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while totals(clickhouse)[0] < 40_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # no flush, no commit: a crash
    finally:
        first.wait(30)
    stored_at_kill = totals(clickhouse)[0]
    assert 0 < stored_at_kill < n
    second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while totals(clickhouse)[0] < n and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # anything re-delivered after the last row arrived is in by now
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err.decode()[-2000:]
    assert totals(clickhouse) == expected(n)


def test_poison_record_is_dead_lettered_and_the_rest_stored(
    topics: KafkaSettings, clickhouse: ClickHouseSettings
) -> None:
    _, poison = minute_bytes(5)
    poison = poison.replace(b'"minute":"2026-11-01', b'"minute":"2206-11-01')  # past DateTime
    examples = one_of_each()

    async def scenario() -> list[DeadLetter]:
        async with KafkaPublisher(topics) as pub:
            topic = MINUTES.qualified(topics.topic_prefix)
            for i in range(100):
                key, value = minute_bytes(i)
                await pub.send_raw(topic, key, poison if i == 50 else value)
            for name in (SLURM_JOBS.name, K8S_PODS.name, ALERTS.name):
                await pub.send(TOPICS[name], examples[name])
        await run_sink(topics, clickhouse, idle_s=4)
        return await read_topic(topics, DEAD_LETTER, 1, settle_s=1.0)

    dead = asyncio.run(scenario())
    assert len(dead) == 1
    d = dead[0]
    assert base64.b64decode(d.value_b64) == poison
    assert d.kind.value == "rejected" and "gpu_minutes" in d.reason
    assert d.offset is not None
    c = connect(clickhouse)
    try:
        assert c.query("SELECT count() FROM gpu_minutes FINAL").result_rows == [(99,)]
        assert c.query("SELECT count() FROM v_allocations").result_rows == [(2,)]
        assert c.query("SELECT count() FROM v_alerts_open").result_rows == [(1,)]
    finally:
        c.close()


@pytest.fixture(autouse=True)
def _quiet_clickhouse_connect_serialisation_logs() -> Iterator[None]:
    import logging

    logger = logging.getLogger("clickhouse_connect")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # the poison test makes it log a traceback on purpose
    yield
    logger.setLevel(level)
