"""The demo's warehouse without Kafka: what ``gpugap demo`` stores, produced in-process.

The demo publishes the ``demo`` scenario into Kafka, runs ``gpugap worker --backfill`` and
``gpugap sink clickhouse`` on it (about 77 s on 2 cores). Here the same three parts run in one
process, with nothing in between but lists:

- the simulator's Emitter publishes the scenario into a publisher that keeps each message as
  the bytes it would send to Kafka (faults included: late, duplicate, malformed);
- the worker's Join (streams/join.py, the code both runners wrap) ingests every message of the
  worker's input topics, drains in event time and flushes at the end, as the worker does once
  its input is quiet, publishing minutes, alerts and dead letters into a second such publisher;
- ClickHouseSink (with the default idle policy, as ``from_settings`` gives it) writes what the
  sink consumes: the worker's minutes, alerts and dead letters and the simulator's Slurm and
  Kubernetes events and node capacity polls, then rolls the hours and days up when it closes.

The differences from the demo are the ones Kafka makes: no partitions, offsets or retries, and
the scheduler events the sink could not decode are left out instead of dead-lettered by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.groundfloor.settings import ClickHouseSettings, IdleSettings
from gpugap.schemas import Record, by_name, decode
from gpugap.schemas.errors import InvalidRecord
from gpugap.schemas.topics import (
    ALERTS,
    DEAD_LETTER,
    K8S_PODS,
    MINUTES,
    NODE_CAPACITY,
    SAMPLES,
    SLURM_JOBS,
)
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.streams.core import CoreConfig
from gpugap.streams.join import Join
from tests.harness.capture import Capture, Msg

WORKER_INPUTS = {SAMPLES.name, SLURM_JOBS.name, K8S_PODS.name}
SINK_INPUTS = {
    MINUTES.name,
    SLURM_JOBS.name,
    K8S_PODS.name,
    ALERTS.name,
    DEAD_LETTER.name,
    NODE_CAPACITY.name,  # the simulator's node capacity polls: stranded GPUs
}
BATCH = 20_000  # records per sink write (the sink's own batches are of this order)


def simulate(scenario: str = "demo") -> list[Msg]:
    """What ``gpugap simulate --scenario NAME`` publishes, in publishing order."""
    from gpugap.simulator import scenario as scenarios

    return emitted(scenarios.load(scenario))


def emitted(sc: Any) -> list[Msg]:
    """What the simulator publishes for the scenario ``sc`` (a loaded, maybe edited, one)."""
    from gpugap.simulator import build
    from gpugap.simulator.emit import Emitter

    window = sc.scenario.duration
    cap = Capture()
    asyncio.run(Emitter(sc, build(sc, window), window).run(cap))
    return cap.messages


def edited(sc: Any, *, interval: int | None = None, loss: float | None = None) -> Any:
    """The scenario ``sc`` with every node sampled every ``interval`` seconds and/or
    ``loss`` of its node samples lost (None: as it is)."""
    if loss is not None:
        faults = sc.faults.model_copy(update={"sample_loss_rate": loss})
        sc = sc.model_copy(update={"faults": faults})
    if interval is not None:
        meta = sc.scenario.model_copy(update={"sample_interval": interval})
        clusters = [c.model_copy(update={"sample_interval": None}) for c in sc.clusters]
        sc = sc.model_copy(update={"scenario": meta, "clusters": clusters})
    return sc


def worked(inputs: Sequence[Msg]) -> list[Msg]:
    """What the worker publishes for ``inputs`` (its input topics' messages, in order)."""
    return asyncio.run(_work(inputs))


async def _work(inputs: Sequence[Msg]) -> list[Msg]:
    out = Capture()
    join = Join(out, "", CoreConfig(max_future_ms=None, max_past_ms=None))  # --backfill
    for offset, (topic, key, value, ts) in enumerate(inputs):
        if topic in WORKER_INPUTS:
            await join.ingest(topic, RawMessage(topic, 0, offset, key, value, ts))
    await join.flush_all()
    return out.messages


def decoded(messages: Sequence[Msg]) -> list[Record]:
    records = []
    for topic, _, value, _ in messages:
        if topic in SINK_INPUTS:
            try:
                records.append(decode(by_name(topic), value))
            except InvalidRecord:  # the simulator's malformed records
                continue
    return records


async def _store(settings: ClickHouseSettings, records: Sequence[Record]) -> None:
    sink = ClickHouseSink(settings, idle_policy=IdleSettings().policy(),
                          rollup_interval_s=3600.0)  # fmt: skip
    await sink.start()
    try:
        for i in range(0, len(records), BATCH):
            await sink.write(records[i : i + BATCH])
    finally:
        await sink.close()  # rolls every hour and day touched up


def load(settings: ClickHouseSettings, scenario: str = "demo") -> dict[str, Any]:
    """Store the scenario's warehouse in ``settings.database`` (migrated); returns counts and
    timings."""
    t0 = time.perf_counter()
    published = simulate(scenario)
    t1 = time.perf_counter()
    produced = asyncio.run(_work(published))
    t2 = time.perf_counter()
    scheduler = [
        m for m in published if m[0] in (SLURM_JOBS.name, K8S_PODS.name, NODE_CAPACITY.name)
    ]
    records = decoded(produced) + decoded(scheduler)
    asyncio.run(_store(settings, records))
    t3 = time.perf_counter()
    kinds: dict[str, int] = {}
    for r in records:
        kinds[type(r).__name__] = kinds.get(type(r).__name__, 0) + 1
    return {
        "published": len(published),
        "stored": kinds,
        "seconds": {"simulate": t1 - t0, "worker": t2 - t1, "sink": t3 - t2},
    }
