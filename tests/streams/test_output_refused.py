"""The worker's outputs refused by Kafka for a while, mid-run: nothing is lost, nothing doubled.

The broker refuses every batch written to the minutes topic once its ``max.message.bytes``
is lowered below a batch's size (a real misconfiguration, and what a quota or a topic at its
limit looks like to a producer). The worker must not store the state whose outputs were
lost, nor ack its input: it restores its last checkpoint, reads again what it had taken
since, and once the topic takes batches again its totals and alerts equal the truth.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import TOPICS
from gpugap.schemas.topics import MINUTES
from gpugap.services.kafka import free_port
from tests.harness.topics import create_topics
from tests.streams.test_end_to_end import env_for, processed, store, verify

pytestmark = pytest.mark.kafka

GPUGAP = [sys.executable, "-m", "gpugap"]
TOTAL = 1971  # messages the small scenario publishes to the worker (+484 capacity polls)


def metric(port: int, name: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return 0


async def set_max_message_bytes(kafka: KafkaSettings, topic: str, value: str | None) -> None:
    """Set (or with None remove) the topic's override, as ``kafka-configs --alter`` does."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        # the broker's default is 1 MiB (+ overhead); the project's batches stay under it
        configs = {"max.message.bytes": value if value is not None else "1048588"}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


def test_outputs_refused_mid_run_are_written_once_the_topic_takes_them(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    asyncio.run(create_topics(kafka, list(TOPICS)))
    env = env_for(kafka)
    truth = tmp_path / "truth.json"
    sim = [*GPUGAP, "simulate", "--scenario", "small", "--as-fast-as-possible"]
    subprocess.run([*sim, "--truth", str(truth)], env=env, timeout=120, check=True)
    minutes = MINUTES.qualified(kafka.topic_prefix)
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                *GPUGAP, "worker", "--backfill", "--http", f"127.0.0.1:{port}",
                "--max-records", "50", "--commit-interval", "0.1",
                "--idle-flush", "1", "--idle-timeout", "3",
            ],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and processed(port) < 300:
                assert worker.poll() is None, log.read_text()[-3000:]
                time.sleep(0.01)
            seen = processed(port)
            # every batch refused from here on: 64 bytes is less than a batch's own header
            asyncio.run(set_max_message_bytes(kafka, minutes, "64"))
            assert seen < TOTAL, f"the worker was done before the fault ({seen} processed)"
            deadline = time.monotonic() + 60
            metric_name = "gpugap_worker_restores_after_failure_total"
            while time.monotonic() < deadline and metric(port, metric_name) < 2:
                assert worker.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            failed = metric(port, metric_name)
            assert failed >= 2, f"the refusals were not seen as failures: {failed}"
            asyncio.run(set_max_message_bytes(kafka, minutes, None))
            assert worker.wait(timeout=180) == 0, log.read_text()[-3000:]
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    said = log.read_text()
    assert "dropped unstored" in said, said[-3000:]
    print(f"refused after {seen} records processed; restores after failure: {failed}")
    asyncio.run(store(kafka, clickhouse))
    verify(clickhouse, json.loads(truth.read_text()), alerts_exactly_once=True)
