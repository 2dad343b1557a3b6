"""The worker runtime's rebalance bookkeeping: a Join holds the shards of one assignment."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.topics import SAMPLES
from gpugap.streams.app import AppOptions, FaustEngine
from gpugap.streams.runtime import WorkerRuntime


class Restores(BaseException):
    """Raised where the runner would restore shards (and reach Kafka). Not an Exception:
    the runtime's failure handling (``WorkerRuntime._failed``) must let it through."""


def runner(monkeypatch: pytest.MonkeyPatch) -> WorkerRuntime:
    app = faust.App("test-runner", broker="kafka://127.0.0.1:9", autodiscover=False)
    r = WorkerRuntime(FaustEngine(app), KafkaSettings(bootstrap="127.0.0.1:9"), AppOptions())

    async def restore() -> None:
        raise Restores

    monkeypatch.setattr(r, "_ready", restore)
    monkeypatch.setattr(r.engine, "recovered", lambda inputs: True)  # no rebalance going on
    return r


def batch(generation: int, partition: int = 4) -> list[Any]:
    tp = TP(SAMPLES.name, partition)
    message = SimpleNamespace(
        tp=tp, topic=tp.topic, partition=partition, offset=0, key=b"c1/n1", value=b"{}",
        generation_id=generation,
    )  # fmt: skip
    return [SimpleNamespace(message=message)]


def recovered(r: WorkerRuntime, monkeypatch: pytest.MonkeyPatch, value: list[bool]) -> None:
    """The engine's answer to "is the assignment settled", as the test says."""
    monkeypatch.setattr(r.engine, "recovered", lambda inputs: value[0])


def test_a_batch_that_waited_for_the_lock_through_a_revoke_restores_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race a clean-clone run hit: the revoke stores and forgets the state; a batch
    # taken before it and waiting for the lock then restored the old assignment's shards,
    # and the next assignment's partition was not among them.
    r = runner(monkeypatch)
    r.engine.app.consumer_generation_id = 2
    revokes = r.revokes  # the batch enters before the revoke
    asyncio.run(r.on_revoked({TP(SAMPLES.name, 0)}))
    asyncio.run(r._on_batch(batch(2), revokes))  # dropped: Faust delivers it again
    assert not r.ready
    with pytest.raises(Restores):  # a batch that entered after the revoke restores
        asyncio.run(r.on_batch(batch(2)))


def test_no_restore_while_the_next_assignment_is_not_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = runner(monkeypatch)
    settled = [False]
    recovered(r, monkeypatch, settled)
    r.engine.app.consumer_generation_id = 2
    asyncio.run(r.on_revoked({TP(SAMPLES.name, 0)}))
    asyncio.run(r.on_batch(batch(2)))  # mid-rebalance: what the consumer holds is not it
    assert not r.ready
    settled[0] = True
    with pytest.raises(Restores):
        asyncio.run(r.on_batch(batch(2)))


def test_revoked_and_handed_the_same_partitions_in_the_same_generation_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What hung the kill-and-restart test: a commit refused with IllegalGeneration makes
    # aiokafka rejoin; the group was stable, so the broker revoked and handed back the same
    # partitions in the same generation. Keyed by the revoked generation, every later batch
    # was dropped: the worker never caught up, and its group never stopped.
    r = runner(monkeypatch)
    r.engine.app.consumer_generation_id = 3
    asyncio.run(r.on_revoked({TP(SAMPLES.name, 4)}))
    r.ready, r.ready_generation = True, 3  # the tick restored the same generation's shards
    taken: list[int] = []

    async def ingest(tp: Any, raw: Any, handle: Any = None) -> None:
        taken.append(raw.offset)
        raise Restores  # far enough: the record reached the join

    async def positions(tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    async def ready() -> None:  # as the real one: nothing to do once restored
        assert r.ready

    monkeypatch.setattr(r, "_ready", ready)
    monkeypatch.setattr(r, "_positions", positions)
    monkeypatch.setattr(r.join, "ingest", ingest)
    with pytest.raises(Restores):
        asyncio.run(r.on_batch(batch(3)))
    assert taken == [0]


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
    from gpugap.schemas.errors import RetriableError

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


def test_a_tick_waiting_for_the_lock_never_stores_the_state_a_failed_batch_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What lost 22 minutes of one node in CI: the batch's outputs were refused and the lock
    # let go before the failure was handled; the tick waiting for it took it first, and its
    # checkpoint stored the state whose outputs were lost (and acked their input)
    from gpugap.schemas.errors import RetriableError

    r = runner(monkeypatch)
    r.ready, r.ready_generation = True, 3
    r.engine.app.consumer_generation_id = 3
    r.last_checkpoint -= 3600  # a checkpoint is due
    stored: list[Any] = []
    refuse = asyncio.Event()

    async def refused(*args: Any, **kwargs: Any) -> None:
        await refuse.wait()
        raise RetriableError("gpu.minutes.v1[0]: a batch of 9 record(s) could not be sent")

    async def store() -> dict[int, Any]:
        stored.append(r.join)
        return {}

    async def positions(tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    async def ready() -> None:
        assert r.ready, "not restored in this test"

    monkeypatch.setattr(r, "_ready", ready)
    monkeypatch.setattr(r, "_store", store)
    monkeypatch.setattr(r, "_positions", positions)
    monkeypatch.setattr(r.join, "ingest", refused)

    async def scenario() -> None:
        failing = asyncio.create_task(r.on_batch(batch(3)))
        await asyncio.sleep(0.01)  # the batch holds the lock
        ticking = asyncio.create_task(r.tick())
        await asyncio.sleep(0.01)  # the tick waits for it
        assert r.lock.locked() and not ticking.done()
        refuse.set()
        await asyncio.gather(failing, ticking)

    asyncio.run(scenario())
    assert stored == [] and not r.ready and r.join.stats.restores_after_failure == 1


def test_a_failing_restore_is_retried_and_logged_once_in_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpugap.schemas.errors import RetriableError

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
    monkeypatch.setattr("gpugap.streams.runtime.time.monotonic", lambda: clock[0])

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
    monkeypatch.setattr("gpugap.streams.runtime.time.monotonic", lambda: clock[0])
    r.join.stats.checkpoint_s, r.join.stats.snapshot_s = 30.0, 0.01
    r.last_checkpoint = clock[0]
    clock[0] += 9.9
    assert not r._checkpoint_due()
    clock[0] += 0.1
    assert r._checkpoint_due()
    r.join.stats.snapshot_s = 2.0  # a large state's own build still spaces them by 10x it
    assert not r._checkpoint_due()


class Undelivering:
    """An engine that has read the input and delivered nothing, over a real broker: the
    runtime's :class:`streams.runtime.Engine` for one assigned samples partition."""

    def __init__(self, kafka: KafkaSettings, tp: Any) -> None:
        self.kafka, self.tp = kafka, tp
        self.group_id = f"{kafka.topic_prefix}gpugap-worker"
        self.told: list[tuple[int, int]] = []  # offsets read elsewhere, as told
        self.dropped = 31  # the whole input

    def generation(self) -> int:
        return 1

    def assignment(self) -> set[Any]:
        return {self.tp}

    def recovered(self, inputs: set[str]) -> bool:
        return True

    def highwater(self, tp: Any) -> int | None:
        return None  # nothing fetched: the runtime asks the broker

    async def _ask(self, tps: Iterable[Any], end: bool) -> dict[Any, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(**self.kafka.client_options())
        await consumer.start()
        try:
            ktps = {TopicPartition(tp.topic, tp.partition): tp for tp in tps}
            ask = consumer.end_offsets if end else consumer.beginning_offsets
            return {ktps[k]: v for k, v in (await ask(list(ktps))).items()}
        finally:
            await consumer.stop()

    async def highwaters(self, tps: Iterable[Any]) -> dict[Any, int]:
        return await self._ask(tps, end=True)

    async def earliest_offsets(self, tps: Iterable[Any]) -> dict[Any, int]:
        return await self._ask(tps, end=False)

    async def read_elsewhere(self, tp: Any, start: int, end: int) -> None:
        self.told.append((start, end))

    def read_to(self, tp: Any) -> int | None:
        return self.dropped  # delivered, and dropped by the runtime (in a rebalance)

    async def commit(self) -> None:
        pass

    def stop(self) -> None:
        pass


def undelivered(kafka: KafkaSettings, dropped: int | None) -> tuple[WorkerRuntime, Undelivering]:
    """31 samples on the broker, an engine that has read ``dropped`` of them and delivered
    none, and the runtime's ticks for up to 4 s (until it has flushed)."""
    from gpugap.schemas import encode
    from gpugap.streams.app import _shards
    from gpugap.streams.core import CoreConfig
    from tests.harness.topics import create_topics
    from tests.streams.helpers import samples

    asyncio.run(create_topics(kafka, [SAMPLES.name]))
    topic = SAMPLES.qualified(kafka.topic_prefix)

    async def scenario() -> tuple[WorkerRuntime, Undelivering]:
        partitions = await _shards(kafka, "gpugap-worker")
        pub = KafkaPublisher(kafka)
        await pub.start()
        for s in samples("10:00:00", "10:05:00", {0: 0.0, 1: 0.9}):
            await pub.send_raw(topic, SAMPLES.key_for(s), encode(s), partition=0)
        await pub.close()
        engine = Undelivering(kafka, TP(topic, 0))
        engine.dropped = dropped
        opts = AppOptions(config=CoreConfig(), idle_flush_s=0.2, web=None, partitions=partitions)
        r = WorkerRuntime(engine, kafka, opts)
        try:
            for _ in range(40):
                await r.tick()
                if r.ready and r.flushed:
                    break
                await asyncio.sleep(0.1)
        finally:
            await r.close()
        return r, engine

    return asyncio.run(scenario())


@pytest.mark.kafka
def test_input_the_engine_read_and_never_delivers_is_read_to_its_end_and_flushed(
    kafka: KafkaSettings,
) -> None:
    # Records delivered in a rebalance and dropped by the runtime are not delivered again;
    # at the end of the input no later record shows the gap. The worker must read them
    # itself, or it is never caught up: no flush, and no stop with --idle-timeout.
    r, engine = undelivered(kafka, dropped=31)
    topic = SAMPLES.qualified(kafka.topic_prefix)
    assert r.ready and r.flushed, "never caught up: the undelivered records were not read"
    assert r.next[TP(topic, 0)] == 31  # 10:00:00 to 10:05:00, every 10 s
    assert r.join.stats.counts["gpu.minutes.v1"] > 0  # flushed: every minute closed
    assert engine.told == [(0, 31)]  # told once stored: the engine may commit past them


@pytest.mark.kafka
def test_input_the_engine_has_not_read_is_left_to_it(kafka: KafkaSettings) -> None:
    # a slow engine (a restore, a loaded machine) still delivers what it has not read: the
    # worker waits for it rather than reading its whole input a second way
    r, engine = undelivered(kafka, dropped=None)
    assert r.ready and not r.flushed and engine.told == [] and not r.next
