"""``python -m benchmarks codec|kafka``: codec and broker throughput, each beside a plain baseline
in the same run.

Machines here are noisy: every figure is the median of several runs, and the ratio to its
baseline (measured in the same run on the same bytes) is the number to compare.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpugap.schemas import NodeSample, decode, encode
from gpugap.schemas.examples import node_samples
from gpugap.schemas.topics import SAMPLES

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import KafkaSettings


def _rate(n: int, fn: Callable[[], object], repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def _plain_access(payloads: list[bytes]) -> None:
    for b in payloads:
        d = json.loads(b)
        _ = d["cluster"], d["node"], d["time"]
        for g in d["gpus"]:
            _ = g["uuid"], g["activity"], g["memory_used_mib"], g["power_w"]


def _decode_all(payloads: list[bytes]) -> None:
    # Results are dropped as a stream drops them: keeping 20k models alive would measure the
    # garbage collector walking them, not the codec.
    for b in payloads:
        decode(SAMPLES, b)


def _row(label: str, ours: float, baseline: float, unit: str = "node-samples/s") -> str:
    return f"{label:<34} {ours:>12,.0f} {baseline:>12,.0f} {ours / baseline:>8.2f}x  {unit}"


def bench_codec(samples: int, repeats: int) -> list[str]:
    records = list(node_samples(samples))
    dicts = [r.model_dump(mode="json") for r in records]
    payloads = [encode(r) for r in records]
    enc = _rate(samples, lambda: [encode(r) for r in records], repeats)
    enc_plain = _rate(samples, lambda: [json.dumps(d).encode() for d in dicts], repeats)
    dec = _rate(samples, lambda: _decode_all(payloads), repeats)
    dec_plain = _rate(samples, lambda: _plain_access(payloads), repeats)
    size = statistics.median(len(b) for b in payloads)
    return [
        f"codec: {samples:,} node samples x 8 GPUs ({size:,.0f} B each), median of {repeats}",
        f"{'':<34} {'gpugap':>12} {'plain json':>12} {'ratio':>9}",
        _row("encode (model -> bytes)", enc, enc_plain),
        _row("decode+validate (bytes -> model)", dec, dec_plain),
    ]


async def _kafka_round(
    kafka: KafkaSettings, records: list[NodeSample], raw: bool
) -> tuple[float, float]:
    """(produce rate, consume rate) for one fresh topic; raw = pre-encoded bytes, no codec."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from gpugap.groundfloor.kafka.publish import KafkaPublisher

    topic = f"bench-{uuid.uuid4().hex[:8]}."
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic + SAMPLES.name, 4, 1)])
        settings = kafka.model_copy(update={"topic_prefix": topic})
        payloads = [(SAMPLES.key_for(r), encode(r)) for r in records] if raw else []
        t = time.perf_counter()
        async with KafkaPublisher(settings) as pub:
            if raw:
                for key, value in payloads:
                    await pub.send_raw(topic + SAMPLES.name, key, value)
            else:
                for r in records:
                    await pub.send(SAMPLES, r)
        produce = len(records) / (time.perf_counter() - t)

        consumer = AIOKafkaConsumer(
            topic + SAMPLES.name,
            **kafka.client_options(),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=topic + "g",
            max_partition_fetch_bytes=8 << 20,
        )
        await consumer.start()
        got = 0
        t = time.perf_counter()
        try:
            while got < len(records):
                for msgs in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                    for m in msgs:
                        if raw:
                            _ = m.value
                        else:
                            decode(SAMPLES, m.value)
                        got += 1
        finally:
            await consumer.stop()
        consume = got / (time.perf_counter() - t)
        return produce, consume
    finally:
        await admin.delete_topics([topic + SAMPLES.name])
        await admin.close()


def bench_kafka(samples: int, repeats: int, kafka: KafkaSettings) -> list[str]:
    records = list(node_samples(samples))
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(repeats):
        for raw in (False, True):
            runs[raw].append(asyncio.run(_kafka_round(kafka, records, raw)))

    def med(raw: bool, i: int) -> float:
        return statistics.median(r[i] for r in runs[raw])

    return [
        f"kafka: {samples:,} node samples via {kafka.bootstrap} "
        f"(zstd, linger 20 ms, 4 partitions), median of {repeats}",
        f"{'':<34} {'gpugap':>12} {'raw bytes':>12} {'ratio':>9}",
        _row("produce (encode+send+ack)", med(False, 0), med(True, 0)),
        _row("consume (fetch+decode)", med(False, 1), med(True, 1)),
    ]


def main(what: str, *, samples: int, repeats: int) -> int:
    # a fresh broker's first consumer group logs a transient coordinator error: not news here
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    lines: list[str] = []
    if what in ("codec", "all"):
        lines += bench_codec(samples, repeats)
        print("\n".join(lines), flush=True)
    if what in ("kafka", "all"):
        with _broker() as kafka:
            out = bench_kafka(samples, max(1, repeats // 2 + 1), kafka)
        print("\n".join(out), flush=True)
    if what == "simulate":  # prints as it goes: the scale estate into nothing, JSONL, Kafka
        from benchmarks.simulate import bench_simulate

        with _broker() as kafka:
            bench_simulate(samples, repeats, kafka)
    return 0


class _broker:
    """The configured broker (with its TLS/SASL settings) if it answers, else a throwaway
    local one (plaintext on loopback; stopped afterwards)."""

    def __enter__(self) -> KafkaSettings:
        from gpugap.groundfloor.settings import load
        from gpugap.services.kafka import LocalKafka, broker_ready

        settings = load()
        self.kafka: LocalKafka | None = None
        if broker_ready(settings.kafka):
            return settings.kafka
        self._tmp = tempfile.TemporaryDirectory(prefix="gpugap-bench-")
        self.kafka = LocalKafka.ephemeral(settings.services, Path(self._tmp.name))
        print(
            f"(no broker at {settings.kafka.bootstrap}: starting a throwaway local one)",
            file=sys.stderr,
            flush=True,
        )
        self.kafka.up()
        return settings.kafka.model_copy(
            update={
                "bootstrap": self.kafka.bootstrap,
                "security_protocol": "PLAINTEXT",
                "sasl_mechanism": None,
            }
        )

    def __exit__(self, *exc: object) -> None:
        if self.kafka is not None:
            self.kafka.down()
            self._tmp.cleanup()
