"""``python -m benchmarks simulate``: how fast the ``scale`` estate (10,000 GPUs) is emitted as
fast as
possible, into nothing (the generator alone), into JSONL, and into Kafka.

Each run builds the plan afresh (not timed) so no run profits from another's warm caches;
the figure is the median of ``repeats`` runs, from the first record to the last one
acknowledged (Kafka) or flushed (JSONL).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gpugap.groundfloor.kafka.publish import JsonlPublisher, KafkaPublisher, Publisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.topics import K8S_PODS, SAMPLES, SLURM_JOBS
from gpugap.simulator import build, scenario
from gpugap.simulator.emit import Emitter, Stats
from tests.harness.capture import Capture


async def _run(sc: scenario.Scenario, window: int, publisher: Publisher) -> Stats:
    plan = build(sc, window)
    async with publisher:
        return await Emitter(sc, plan, window).run(publisher)


def _measure(
    sc: scenario.Scenario, window: int, make: Callable[[], Publisher], repeats: int
) -> list[Stats]:
    return [asyncio.run(_run(sc, window, make())) for _ in range(repeats)]


def _row(label: str, runs: list[Stats]) -> str:
    best = statistics.median(r.seconds for r in runs)
    r = runs[0]
    nodes = r.records[SAMPLES.name]
    return (
        f"{label:<28} {nodes / best:>12,.0f} {r.gpu_samples / best:>14,.0f} "
        f"{r.bytes / best / 1e6:>8,.1f}"
    )


async def _topics(kafka: KafkaSettings, prefix: str, create: bool) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        names = [prefix + t.name for t in (SAMPLES, SLURM_JOBS, K8S_PODS)]
        if create:
            await admin.create_topics([NewTopic(n, 4, 1) for n in names])
        else:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def _compression(data: bytes, repeats: int) -> list[str]:
    """What the Kafka client's codecs cost on these records (they run on the event loop)."""
    from aiokafka.codec import lz4_encode, zstd_encode

    out = []
    for name, fn in (("lz4 (aiokafka: level 9)", lz4_encode), ("zstd (level 3)", zstd_encode)):
        times = []
        for _ in range(max(3, repeats)):
            t = time.perf_counter()
            packed = fn(data)
            times.append(time.perf_counter() - t)
        rate = len(data) / statistics.median(times) / 1e6
        out.append(f"{name:<28} {rate:>8,.0f} MB/s, {len(data) / len(packed):.1f}x smaller")
    return out


def bench_simulate(samples: int, repeats: int, kafka: KafkaSettings | None) -> list[str]:
    """``kafka``: the broker to publish to (None: no Kafka row)."""
    sc = scenario.load("scale")
    interval = sc.scenario.sample_interval
    nodes = sum(g.count for c in sc.clusters for g in c.node_groups)
    window = max(1, -(-samples // nodes)) * interval
    first = _measure(sc, window, lambda: Capture(keep=False), repeats)
    r = first[0]
    lines = [
        f"simulate: scenario scale ({nodes:,} nodes, 10,000 GPUs), {window // 60} min simulated "
        f"= {r.records[SAMPLES.name]:,} node samples, {r.gpu_samples:,} GPU samples, "
        f"{r.bytes / 1e6:,.0f} MB; median of {repeats}",
        f"{'':<28} {'node-samples/s':>12} {'GPU-samples/s':>14} {'MB/s':>8}",
        _row("generate (no output)", first),
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpugap-bench-") as tmp:
        out = Path(tmp) / "scale.jsonl"

        def jsonl() -> Publisher:
            out.unlink(missing_ok=True)
            return JsonlPublisher(out)

        lines.append(_row("jsonl (local file)", _measure(sc, window, jsonl, repeats)))
        print(lines[-1], flush=True)
        with out.open("rb") as fh:
            sample = fh.read(1 << 20)  # about what one Kafka batch holds
    lines += _compression(sample, repeats)
    print("\n".join(lines[-2:]), flush=True)
    if kafka is not None:
        runs: list[Stats] = []
        compression = kafka.compression  # GPUGAP_KAFKA_COMPRESSION
        for _ in range(repeats):
            prefix = f"bench-{uuid.uuid4().hex[:8]}."
            asyncio.run(_topics(kafka, prefix, create=True))
            try:
                settings = kafka.model_copy(update={"topic_prefix": prefix})
                runs += _measure(sc, window, partial(KafkaPublisher, settings), 1)
            finally:
                asyncio.run(_topics(kafka, prefix, create=False))
        lines.append(_row(f"kafka ({compression}, 4 partitions)", runs))
        print(lines[-1], flush=True)
    return lines
