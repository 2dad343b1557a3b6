"""Records through the real broker: nothing lost, nothing reordered, bad input dead-lettered."""

import asyncio
import base64
import json
import re
from collections import defaultdict
from collections.abc import Sequence

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage, consume
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import DeadLetter, NodeSample, Record, encode
from gpugap.schemas.examples import node_samples
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES
from tests.harness.topics import create_topics, read_topic

pytestmark = pytest.mark.kafka


async def _collect(
    kafka: KafkaSettings, group: str, expected: int, **kw: object
) -> list[tuple[RawMessage, Record]]:
    got: list[tuple[RawMessage, Record]] = []
    stop = asyncio.Event()

    async def handler(batch: Sequence[tuple[RawMessage, Record]]) -> bool:
        got.extend(batch)
        if len(got) >= expected:
            stop.set()
        return True

    async with KafkaPublisher(kafka) as dlq:
        await asyncio.wait_for(
            consume(
                kafka, group, handler, DeadLetters(dlq, group, kafka.topic_prefix), stop=stop, **kw
            ),
            timeout=120,
        )  # type: ignore[arg-type]
    return got


def test_ten_thousand_node_samples_round_trip_in_order(kafka: KafkaSettings) -> None:
    sent = list(node_samples(10_000, nodes=40, gpus=8))

    async def scenario() -> list[tuple[RawMessage, Record]]:
        await create_topics(kafka, [SAMPLES.name], partitions=4)
        async with KafkaPublisher(kafka) as pub:
            for record in sent:
                await pub.send(SAMPLES, record)
        return await _collect(kafka, "roundtrip", len(sent), topics=[SAMPLES.name])

    got = asyncio.run(scenario())
    assert len(got) == 10_000
    records = [r for _, r in got]
    assert all(isinstance(r, NodeSample) and len(r.gpus) == 8 for r in records)
    assert sorted(encode(r) for r in records) == sorted(encode(r) for r in sent)
    partitions_of_key: dict[bytes, set[int | None]] = defaultdict(set)
    per_key: dict[bytes, list[NodeSample]] = defaultdict(list)
    last_offset: dict[int | None, int] = {}
    for raw, record in got:
        assert raw.key is not None and raw.offset is not None
        partitions_of_key[raw.key].add(raw.partition)
        per_key[raw.key].append(record)  # type: ignore[arg-type]
        assert raw.offset > last_offset.get(raw.partition, -1)
        last_offset[raw.partition] = raw.offset
        assert raw.timestamp_ms == int(record.time.timestamp() * 1000)  # type: ignore[attr-defined]
    assert all(len(p) == 1 for p in partitions_of_key.values()), "a node's key spans partitions"
    assert len({p for ps in partitions_of_key.values() for p in ps}) == 4
    for key, records_of_node in per_key.items():
        expected = [r for r in sent if SAMPLES.key_for(r) == key]
        assert records_of_node == expected, f"{key!r} reordered"


def test_bad_records_go_to_dead_letter_with_reasons_and_good_ones_flow(
    kafka: KafkaSettings,
) -> None:
    good1, good2, base = list(node_samples(3))
    body = json.loads(encode(base))

    def variant(**gpu: object) -> bytes:
        d = json.loads(json.dumps(body))
        d["gpus"][0].update(gpu)
        return json.dumps(d).encode()

    naive = encode(base).replace(b'.000Z"', b'.000"')
    bad = {
        "malformed": b'{"cluster": "c", "node": ',
        "wrong type": variant(index="zero"),
        "out of range": variant(activity=1.7),
        "naive time": naive,
    }
    v1, v2 = kafka.topic_prefix + SAMPLES.name, kafka.topic_prefix + "gpu.samples.v2"

    async def scenario() -> tuple[list[tuple[RawMessage, Record]], list[DeadLetter]]:
        await create_topics(kafka, [SAMPLES.name, "gpu.samples.v2", DEAD_LETTER.name])
        async with KafkaPublisher(kafka) as pub:
            await pub.send(SAMPLES, good1)
            for value in bad.values():
                await pub.send_raw(v1, b"c/n", value)
            await pub.send_raw(v2, b"c/n", encode(base))
            await pub.send(SAMPLES, good2)
        pattern = re.escape(kafka.topic_prefix) + r"gpu\.samples\.v\d+"
        good = await _collect(kafka, "dlq-test", 2, pattern=pattern, idle_timeout_s=15)
        dead = await read_topic(kafka, DEAD_LETTER, 5)
        return good, dead

    good, dead = asyncio.run(scenario())
    assert [r for _, r in good] == [good1, good2]
    assert len(dead) == 5
    by_value = {base64.b64decode(d.value_b64): d for d in dead}
    reasons = {what: by_value[value].reason for what, value in bad.items()}
    assert (
        "not valid JSON" in reasons["malformed"] and by_value[bad["malformed"]].kind == "malformed"
    )
    assert "gpus.0.index" in reasons["wrong type"]
    assert "gpus.0.activity" in reasons["out of range"] and "1.7" in reasons["out of range"]
    assert "time:" in reasons["naive time"] and "timezone-aware" in reasons["naive time"]
    unknown = next(d for d in dead if d.source_topic == v2)
    assert unknown.kind == "unknown_topic" and "gpu.samples.v2" in unknown.reason
    for d in dead:
        assert d.partition == 0 and d.offset is not None and d.consumer == "dlq-test"
        assert d.key_b64 == base64.b64encode(b"c/n").decode()
    assert sorted(d.offset for d in dead if d.source_topic == v1) == [1, 2, 3, 4]


@pytest.mark.parametrize("then", ["send", "flush"])
def test_a_batch_the_linger_could_not_send_is_an_error_not_a_silent_loss(
    kafka: KafkaSettings, then: str
) -> None:
    # what aiokafka's send_batch raises when the partition's metadata or room in its
    # accumulator does not come in time (a broker down): once, in the linger-time send
    from aiokafka.errors import KafkaTimeoutError

    from gpugap.schemas.errors import RecordsLost, RetriableError

    sample = next(node_samples(1, nodes=1))

    async def scenario() -> None:
        await create_topics(kafka, [SAMPLES.name])
        pub = KafkaPublisher(kafka)
        await pub.start()
        real = pub._producer.send_batch
        calls = 0

        async def fails_once(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KafkaTimeoutError("no metadata within the request timeout")
            return await real(*args, **kwargs)

        pub._producer.send_batch = fails_once
        await pub.send(SAMPLES, sample)
        await asyncio.sleep(10 * kafka.linger_ms / 1000 + 0.05)  # the linger ran, failed
        assert calls == 1
        with pytest.raises(RetriableError, match=r"a batch of 1 record\(s\).*not sent"):
            if then == "send":
                await pub.send(SAMPLES, sample)
            else:
                await pub.flush()
        # and every later call, too: records were lost, and a checkpoint stored after a
        # later flush that passed would claim them written
        with pytest.raises(RecordsLost, match=r"a batch of 1 record\(s\).*were lost"):
            await pub.send(SAMPLES, sample)
        await pub.reopen()  # the caller sends again what was lost, with a new producer
        await pub.send(SAMPLES, sample)
        await pub.close()
        assert calls == 1  # sent by the new producer, not the one that failed
        async with KafkaPublisher(kafka) as fresh:  # a new one sends
            await fresh.send(SAMPLES, sample)

    asyncio.run(scenario())


def test_a_batch_the_broker_refused_fails_every_later_flush_not_only_the_first(
    kafka: KafkaSettings,
) -> None:
    # the worker's checkpoint is a flush, then the state: a tick that flushed after the
    # failing flush of a batch (and before the state was dropped) found nothing left to
    # fail on and stored state whose outputs were lost
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from gpugap.schemas.errors import RecordsLost

    topic = f"{kafka.topic_prefix}small-messages"
    sample = next(node_samples(1, nodes=1))

    async def scenario() -> None:
        await create_topics(kafka, [SAMPLES.name])
        admin = AIOKafkaAdminClient(**kafka.client_options())
        await admin.start()
        try:
            small = NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "64"})
            await admin.create_topics([small])
        finally:
            await admin.close()
        pub = KafkaPublisher(kafka)
        await pub.start()
        await pub.send_raw(topic, b"k", encode(sample))
        with pytest.raises(RecordsLost, match=r"MessageSizeTooLargeError.*were lost"):
            await pub.flush()
        for _ in range(2):
            with pytest.raises(RecordsLost, match=r"MessageSizeTooLargeError.*were lost"):
                await pub.flush()
        with pytest.raises(RecordsLost, match="were lost"):
            await pub.send(SAMPLES, sample)
        with pytest.raises(RecordsLost):
            await pub.close()  # says so at the close too, and still stops the producer
        assert pub._producer is None
        await pub.start()  # a new producer sends
        await pub.send(SAMPLES, sample)
        await pub.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("wait_s", [0.0, 0.5])
def test_seek_to_start_reads_from_the_first_offset_whatever_reset_ran(
    kafka: KafkaSettings, wait_s: float
) -> None:
    # a consumer without a group resets to the latest offset by default; aiokafka's
    # seek_to_beginning lost that race to an in-flight default reset on a 3-broker cluster
    # (the worker's side consumer then skipped the first Slurm job). Waited for or not, the
    # explicit positions hold.
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from gpugap.groundfloor.kafka.consume import seek_to_start

    sent = list(node_samples(5, nodes=1))

    async def scenario() -> int:
        await create_topics(kafka, [SAMPLES.name])
        async with KafkaPublisher(kafka) as pub:
            for r in sent:
                await pub.send(SAMPLES, r)
        consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(SAMPLES.qualified(kafka.topic_prefix), 0)
            consumer.assign([tp])
            await asyncio.sleep(wait_s)  # the default (latest) reset has run by now, or not
            assert await seek_to_start(consumer, [tp]) == {tp: 0}
            got = 0
            for _ in range(20):
                got += len((await consumer.getmany(tp, timeout_ms=200)).get(tp, []))
                if got >= len(sent):
                    break
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == len(sent)
