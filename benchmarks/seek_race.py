"""aiokafka's seek_to_beginning against the fetcher's own reset, on a 3-broker cluster.

``python -m benchmarks seek-race [--tries N]``: three one-partition topics of 5 records each
(one replica: each may lead on another broker);
per try a fresh consumer without a group (its default reset: the latest offset) is positioned
at the start of all three, then read. Printed per way of positioning: in how many tries a
topic was read short (from its end). The ways: what the worker did before (assign, then per
partition ``seek_to_beginning`` + ``await beginning_offsets``), what its side consumer does
now (first offsets asked first, then assign and seek with no await between), and
``groundfloor.kafka.consume.seek_to_start`` after assign on a consumer that resets to latest.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpugap.groundfloor.kafka.consume import seek_to_start
from tests.harness.kafka_cluster import KafkaCluster

RECORDS = 5


async def _before(consumer: Any, tps: list[Any]) -> None:
    consumer.assign(tps)
    for tp in tps:
        await consumer.seek_to_beginning(tp)
        await consumer.beginning_offsets([tp])


async def _side_consumer(consumer: Any, tps: list[Any]) -> None:
    first = await consumer.beginning_offsets(tps)
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, first[tp])


async def _helper(consumer: Any, tps: list[Any]) -> None:
    consumer.assign(tps)
    await seek_to_start(consumer, tps)


WAYS = {
    "seek_to_beginning per partition (before)": _before,
    "first offsets, then assign + seek (the worker now)": _side_consumer,
    "seek_to_start after assign": _helper,
}


async def run(bootstrap: str, tries: int) -> dict[str, int]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    prefix = uuid.uuid4().hex[:8]
    names = [f"{prefix}.{n}" for n in ("a", "b", "c")]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 1, 1) for n in names])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n in names:
            for _ in range(RECORDS):
                await producer.send_and_wait(n, b"x")
    finally:
        await producer.stop()
    short = dict.fromkeys(WAYS, 0)
    for _ in range(tries):
        for way, position in WAYS.items():
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
            await consumer.start()
            try:
                tps = [TopicPartition(n, 0) for n in names]
                await position(consumer, tps)
                got: dict[Any, int] = {}
                for _ in range(10):
                    for tp, msgs in (await consumer.getmany(timeout_ms=100)).items():
                        got[tp] = got.get(tp, 0) + len(msgs)
                short[way] += any(got.get(tp, 0) < RECORDS for tp in tps)
            finally:
                await consumer.stop()
    return short


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks seek-race", description=__doc__)
    p.add_argument("--tries", type=int, default=40)
    args = p.parse_args(argv)
    cluster = KafkaCluster(Path(tempfile.mkdtemp(prefix="gpugap-seek-race-")))
    cluster.start()
    try:
        short = asyncio.run(run(cluster.bootstrap, args.tries))
    finally:
        cluster.stop()
    print(f"3 brokers, 3 topics of {RECORDS} records, {args.tries} tries per way")
    for way, n in short.items():
        print(f"  {way:<52} a topic read short in {n:>3} of {args.tries}")
    return 0
