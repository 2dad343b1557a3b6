"""One partitioner for every producer of a keyed topic: the same key lands on the same
partition whichever client sent it (the scale-out promise: a node's samples and its
allocations meet in one partition, so in one worker). Each client sends the same keys to a
real 6-partition topic, and the partitions are read back from the broker:

- the Java client (``KafkaProducer`` from the broker's own kafka-clients jar, run as a
  single-file Java program), the reference;
- gpugap's ``KafkaPublisher`` (its own per-partition batches, partition chosen by murmur2);
- the Slurm hook's stdlib wire client (``producers/slurm/wire.py``);
- Faust's producer (what the Faust app's own sends use);
- a plain aiokafka producer with its default partitioner.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings
from gpugap.producers.slurm import wire
from tests.harness.topics import create_topics

pytestmark = pytest.mark.kafka

PARTITIONS = 6
KEYS = [f"hpc/gn{i:03d}" for i in range(60)] + [f"k8s/{i}-é/ü" for i in range(20)] + [""]

JAVA = """
import java.util.Properties;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class SendKeys {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("acks", "all");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(
                p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 2; i < args.length; i++) {
                byte[] key = java.util.HexFormat.of().parseHex(args[i]);
                producer.send(new ProducerRecord<>(args[1], key, "java".getBytes())).get();
            }
        }
    }
}
"""


def _java(kafka: KafkaSettings, topic: str, tmp: Path) -> None:
    from gpugap.services.kafka import jar_dir

    libs = jar_dir(ServicesSettings())
    if shutil.which("java") is None or not any(libs.glob("kafka-clients-*.jar")):
        pytest.fail(f"the Java client is needed: java on PATH and kafka-clients in {libs}")
    src = tmp / "SendKeys.java"
    src.write_text(JAVA)
    cmd = ["java", "-cp", f"{libs}/*", str(src), kafka.bootstrap, topic]
    proc = subprocess.run(
        [*cmd, *(k.encode().hex() for k in KEYS)], capture_output=True, text=True, timeout=180,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


async def _python_clients(kafka: KafkaSettings, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    async with KafkaPublisher(kafka) as pub:  # topic names are prefixed by the caller here
        for k in KEYS:
            await pub.send_raw(topic, k.encode(), b"publisher")
    now = int(time.time() * 1000)
    wire.send(kafka.bootstrap, [(topic, k.encode(), b"hook", now) for k in KEYS],
              deadline=time.monotonic() + 60)  # fmt: skip
    plain = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await plain.start()
    try:
        for k in KEYS:
            await plain.send_and_wait(topic, b"aiokafka", key=k.encode())
    finally:
        await plain.stop()


async def _faust(kafka: KafkaSettings, topic: str) -> None:
    import faust

    app = faust.App("gpugap-partitioner-test", broker=f"kafka://{kafka.bootstrap}")
    producer = app.producer
    await producer.start()
    try:
        for k in KEYS:
            fut = await producer.send(topic, k.encode(), b"faust", None, None, None)
            await fut
        await producer.flush()
    finally:
        await producer.stop()


async def _read(kafka: KafkaSettings, topic: str, expected: int) -> dict[str, dict[str, int]]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
        enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    seen: dict[str, dict[str, int]] = defaultdict(dict)
    n = 0
    try:
        async with asyncio.timeout(60):
            while n < expected:
                for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    for m in msgs:
                        seen[m.value.decode()][m.key.decode()] = tp.partition
                        n += 1
    finally:
        await consumer.stop()
    return seen


def test_every_client_puts_a_key_on_the_same_partition(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    topic = f"{kafka.topic_prefix}keys"
    asyncio.run(create_topics(kafka, ["keys"], PARTITIONS))
    _java(kafka, topic, tmp_path)
    asyncio.run(_python_clients(kafka, topic))
    asyncio.run(_faust(kafka, topic))
    seen = asyncio.run(_read(kafka, topic, 5 * len(KEYS)))
    assert set(seen) == {"java", "publisher", "hook", "aiokafka", "faust"}
    java = seen["java"]
    assert len(java) == len(KEYS) and len(set(java.values())) == PARTITIONS  # spread over all
    for client, placed in seen.items():
        assert placed == java, client
    # and the hook's murmur2 names them without a broker
    assert {k: wire.partition_for(k.encode(), PARTITIONS) for k in KEYS} == java
