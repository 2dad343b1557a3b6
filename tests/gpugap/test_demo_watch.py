"""The demo's done-test asks the broker, not the worker: lag is what a group has not committed."""

from __future__ import annotations

import asyncio

from gpugap.demo_watch import Watch, against_truth
from gpugap.groundfloor.settings import KafkaSettings
from tests.harness.topics import create_topics


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


def test_against_truth_prints_each_class_beside_the_truth() -> None:
    from gpugap.report.models import Gap

    def gap(key: str, alloc: float, used: float) -> Gap:
        return Gap(
            key=key,
            allocated_gpu_h=alloc,
            measured_gpu_h=alloc,
            consumed_gpu_h=used,
            gap_gpu_h=alloc - used,
            gap_pct=None,
            unmeasured_gpu_h=0.0,
            idle_gpu_h=0.0,
        )

    truth = {
        "by_class": {
            "batch": {"allocated_gpu_s": 36_000.0, "consumed_gpu_s": 18_000.0},
            "service": {"allocated_gpu_s": 7_200.0, "consumed_gpu_s": 0.0},
        }
    }
    out = against_truth([gap("batch", 10.0, 4.5)], truth).splitlines()
    # batch: 10 h allocated = the truth's 36,000 s; 4.5 h consumed vs 5 h is -10 %
    assert out[1].split() == ["batch", "allocated", "10.00", "10.00", "+0.0000", "%"]
    assert out[2].split() == ["batch", "consumed", "4.50", "5.00", "-10.0000", "%"]
    # a class the report lacks counts as 0; a truth of 0 has no percentage
    assert out[3].split() == ["service", "allocated", "0.00", "2.00", "-100.0000", "%"]
    assert out[4].split() == ["service", "consumed", "0.00", "0.00", "-"]
