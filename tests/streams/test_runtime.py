"""The worker runtime's rebalance bookkeeping: a Join holds the shards of one assignment."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from groundfloor.settings import KafkaSettings
from schemas.topics import SAMPLES
from streams.app import AppOptions, FaustEngine
from streams.runtime import WorkerRuntime


class Restores(BaseException):
    """Raised where the runner would restore shards (and reach Kafka). Not an Exception:
    the runtime's failure handling (``WorkerRuntime._failed``) must let it through."""


def runner(monkeypatch: pytest.MonkeyPatch) -> WorkerRuntime:
    app = faust.App("test-runner", broker="kafka://127.0.0.1:9", autodiscover=False)
    r = WorkerRuntime(FaustEngine(app), KafkaSettings(bootstrap="127.0.0.1:9"), AppOptions())

    async def restore() -> None:
        raise Restores

    monkeypatch.setattr(r, "_ready", restore)
    return r


def batch(generation: int, partition: int = 4) -> list[Any]:
    tp = TP(SAMPLES.name, partition)
    message = SimpleNamespace(
        tp=tp, topic=tp.topic, partition=partition, offset=0, key=b"c1/n1", value=b"{}",
        generation_id=generation,
    )  # fmt: skip
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


def test_a_batch_that_fails_outside_a_record_drops_the_state_unstored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # e.g. Kafka refused the outputs of records the state has taken: storing that state (or
    # acking its records) would lose those outputs for good
    from schemas.errors import RetriableError

    r = runner(monkeypatch)
    r.ready, r.ready_generation = True, 3
    r.engine.app.consumer_generation_id = 3
    old_join = r.join

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise RetriableError("gpu.minutes.v1[0]: a batch of 9 record(s) could not be sent")

    async def store() -> None:
        raise AssertionError("a state whose outputs may be lost is never stored")

    async def positions(tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    async def ready() -> None:  # as the real one: nothing to do once restored
        if not r.ready:
            raise Restores

    monkeypatch.setattr(r, "_ready", ready)
    monkeypatch.setattr(r, "_store", store)
    monkeypatch.setattr(r, "_positions", positions)
    monkeypatch.setattr(old_join, "ingest", refused)
    asyncio.run(r.on_batch(batch(3)))  # not raised: Faust would restart the agent on it
    assert r.join is not old_join and not r.ready and r.join.stats.restores_after_failure == 1
    # a fresh producer for the restored state, and what Faust delivered is read back
    assert r.join.pub is r.pub and r.join.dl.publisher is r.pub and r.pub is not old_join.pub
    assert r.refill == {TP(SAMPLES.name, 4): 1}
    assert "dropped unstored" in caplog.text and "a batch of 9 record(s)" in caplog.text
    with pytest.raises(Restores):  # the next batch restores the last checkpoint
        asyncio.run(r.on_batch(batch(3)))


def test_a_failing_restore_is_retried_and_logged_once_in_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from schemas.errors import RetriableError

    r = runner(monkeypatch)
    r.engine.app.consumer_generation_id = 1
    tries = 0

    async def unreadable() -> None:
        nonlocal tries
        tries += 1
        raise RetriableError("state topic: not read to its end within 120s")

    monkeypatch.setattr(r, "_ready", unreadable)
    for _ in range(5):
        asyncio.run(r.on_batch(batch(1)))
    assert tries == 5 and r.join.stats.restores_after_failure == 5 and not r.ready
    assert caplog.text.count("dropped unstored") == 1  # not a line for every retry


def test_checkpoints_take_at_most_a_tenth_of_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # catching up, a checkpoint rewrites every node and the worker takes no record while
    # the broker acknowledges it: its whole wall time, not the snapshot's, spaces them out
    r = runner(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr("streams.runtime.time.monotonic", lambda: clock[0])

    async def store() -> dict[int, Any]:
        clock[0] += 0.4  # flushing the outputs, the snapshot, its acknowledgement
        return {}

    monkeypatch.setattr(r, "_store", store)
    r.last_checkpoint = clock[0] - 1.0
    assert r._checkpoint_due()  # the interval (1 s) has passed, no checkpoint measured yet
    asyncio.run(r.checkpoint())
    assert r.join.stats.checkpoint_s == pytest.approx(0.4)
    assert "gpugap_worker_checkpoint_seconds 0.400" in r.join.stats.prometheus(Counter())
    clock[0] += 3.9
    assert not r._checkpoint_due()  # 10 x 0.4 s, not the 1 s interval
    clock[0] += 0.1
    assert r._checkpoint_due()


def test_a_checkpoint_slowed_by_the_broker_holds_the_next_one_back_10_s_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a leader killed mid-flush: the checkpoint waited 30 s for the broker. Spaced by ten
    # times that, the group's commits stalled for 5 minutes (the fault test caught it)
    r = runner(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr("streams.runtime.time.monotonic", lambda: clock[0])
    r.join.stats.checkpoint_s, r.join.stats.snapshot_s = 30.0, 0.01
    r.last_checkpoint = clock[0]
    clock[0] += 9.9
    assert not r._checkpoint_due()
    clock[0] += 0.1
    assert r._checkpoint_due()
    r.join.stats.snapshot_s = 2.0  # a large state's own build still spaces them by 10x it
    assert not r._checkpoint_due()
