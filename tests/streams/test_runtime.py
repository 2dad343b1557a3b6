"""The worker runtime's rebalance bookkeeping: a Join holds the shards of one assignment."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from groundfloor.settings import KafkaSettings
from schemas.topics import SAMPLES
from streams.app import AppOptions, FaustEngine
from streams.runtime import WorkerRuntime


class Restores(Exception):
    """Raised where the runner would restore shards (and reach Kafka)."""


def runner(monkeypatch: pytest.MonkeyPatch) -> WorkerRuntime:
    app = faust.App("test-runner", broker="kafka://127.0.0.1:9", autodiscover=False)
    r = WorkerRuntime(FaustEngine(app), KafkaSettings(bootstrap="127.0.0.1:9"), AppOptions())

    async def restore() -> None:
        raise Restores

    monkeypatch.setattr(r, "_ready", restore)
    return r


def batch(generation: int, partition: int = 4) -> list[Any]:
    tp = TP(SAMPLES.name, partition)
    message = SimpleNamespace(tp=tp, offset=0, generation_id=generation)
    return [SimpleNamespace(message=message)]


def test_a_batch_of_a_revoked_generation_restores_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race a clean-clone run hit: the revoke stores and forgets the state; a batch of
    # the same generation, taken before and waiting for the lock, then restored the old
    # assignment's shards, and the next assignment's partition was not among them.
    r = runner(monkeypatch)
    r.engine.app.consumer_generation_id = 2
    asyncio.run(r.on_revoked({TP(SAMPLES.name, 0)}))
    asyncio.run(r.on_batch(batch(2)))  # dropped: Faust delivers it again in generation 3
    assert not r.ready
    r.engine.app.consumer_generation_id = 3  # the new assignment: its batches restore
    with pytest.raises(Restores):
        asyncio.run(r.on_batch(batch(3)))


def test_shards_restored_in_another_generation_are_dropped_unstored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = runner(monkeypatch)
    old_join = r.join
    r.ready, r.ready_generation = True, 2
    r.engine.app.consumer_generation_id = 3  # no revoke reached this worker in between

    async def store() -> None:
        raise AssertionError("the shards may be another worker's now: never stored")

    monkeypatch.setattr(r, "_store", store)
    with pytest.raises(Restores):
        asyncio.run(r.on_batch(batch(3)))
    assert r.join is not old_join and not r.ready
