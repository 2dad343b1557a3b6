"""Reading topics: decode-or-dead-letter (the one helper every consumer uses) and an
at-least-once consume loop that commits offsets only after the handler has stored its batch."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpugap.groundfloor.kafka.admin import prepare
from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.groundfloor.kafka.trust import ClusterTrust
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import DeadLetter, Record, Topic, by_name, decode, utc_now
from gpugap.schemas.errors import InvalidRecord, RetriableError
from gpugap.schemas.topics import DEAD_LETTER
from gpugap.schemas.types import DeadLetterKind

M = TypeVar("M", bound=Record)

log = logging.getLogger(__name__)

#: a dead letter is logged at most once a minute per kind (the topic holds each one): a
#: producer that sends nothing but bad records must not flood the log, nor go unnoticed
WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A message as it came off the broker (aiokafka ConsumerRecord and Faust Message both fit)."""

    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None

    @classmethod
    def of(cls, msg: Any) -> RawMessage:
        return cls(
            msg.topic,
            msg.partition,
            msg.offset,
            msg.key,
            msg.value,
            getattr(msg, "timestamp", None),
        )


class DeadLetters:
    """Decodes messages by their topic; whatever fails goes to ``dead-letter.v1`` with the
    original bytes, where it came from and why, and the caller goes on."""

    def __init__(
        self,
        publisher: Publisher,
        consumer: str,
        topic_prefix: str = "",
        trust: ClusterTrust | None = None,
    ) -> None:
        self.publisher = publisher
        self.consumer = consumer
        self.topic_prefix = topic_prefix
        #: the clusters each topic's records may claim (GPUGAP_KAFKA_CLUSTER_TOPICS), if any
        self.trust = trust
        self.counts: Counter[str] = Counter()
        self._warned_at: dict[str, float] = {}
        self._unwarned: Counter[str] = Counter()

    async def decode(self, msg: RawMessage) -> Record | None:
        """The message's record, or None after dead-lettering it (also a record that claims a
        cluster its topic may not speak for, see ``groundfloor.kafka.trust``)."""
        trust = self.trust
        try:
            if trust is None:
                return decode(by_name(msg.topic, self.topic_prefix), msg.value)
            topic = trust.schema(msg.topic) or by_name(msg.topic, self.topic_prefix)
            record = decode(topic, msg.value)
        except InvalidRecord as exc:
            await self.route(msg, exc.reason, DeadLetterKind(exc.kind))
            return None
        if (reason := trust.refuse(msg.topic, topic, record)) is not None:
            await self.route(msg, reason, DeadLetterKind.UNTRUSTED)
            return None
        return record

    async def route(self, msg: RawMessage, reason: str, kind: DeadLetterKind) -> None:
        """Dead-letter a message; also for valid records a later step refuses (late, rejected)."""
        b64 = base64.b64encode
        record = DeadLetter(
            time=utc_now(),
            source_topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            key_b64=b64(msg.key).decode() if msg.key is not None else None,
            value_b64=b64(msg.value or b"").decode(),
            kind=kind,
            reason=reason[:4000],
            consumer=self.consumer,
        )
        self.counts[kind.value] += 1
        self._unwarned[kind.value] += 1
        now = time.monotonic()
        if now - self._warned_at.get(kind.value, -WARN_EVERY_S) >= WARN_EVERY_S:
            log.warning(
                "dead-lettered %d %s record(s) to %s%s (each with its reason), the latest "
                "%s[%s]@%s: %r",
                self._unwarned[kind.value],
                kind.value,
                self.topic_prefix,
                DEAD_LETTER.name,
                msg.topic,
                msg.partition,
                msg.offset,
                reason[:300],
            )
            self._warned_at[kind.value] = now
            self._unwarned[kind.value] = 0
        await self.publisher.send(DEAD_LETTER, record)


#: Gets the good records of one poll; returns True once everything it was given so far is
#: stored (the loop then commits), False while it still buffers.
Handler = Callable[[Sequence[tuple[RawMessage, Record]]], Awaitable[bool]]


async def consume(
    settings: KafkaSettings,
    group: str,
    handler: Handler,
    dead_letters: DeadLetters,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    stop: asyncio.Event | None = None,
    max_records: int = 5000,
    idle_timeout_s: float | None = None,
    max_poll_interval_ms: int = 300_000,
    on_stop: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """Consume until ``stop`` is set (or nothing arrives for ``idle_timeout_s``).

    Each poll: decode (bad records are dead-lettered), hand good ones to ``handler`` (also
    on empty polls, so a buffering handler can flush by age), and when it says everything is
    stored, flush the dead-letter publisher and commit. A crash before the commit means the
    records are delivered again, so handlers must be idempotent: nothing is lost. On a clean
    stop ``on_stop`` gets a last chance to store what it buffered (True = commit).
    """
    from aiokafka import AIOKafkaConsumer

    names = [] if pattern else [settings.topic_prefix + t for t in topics]
    await prepare(settings, names, group)
    consumer = AIOKafkaConsumer(
        *names,
        **settings.client_options(),
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=2000 if pattern else 300_000,
        max_poll_interval_ms=max_poll_interval_ms,
    )
    if pattern:
        consumer.subscribe(pattern=pattern)
    await consumer.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    idle_since = loop.time()
    uncommitted = False
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=max_records)
            good: list[tuple[RawMessage, Record]] = []
            for messages in batches.values():
                for m in messages:
                    raw = RawMessage.of(m)
                    record = await dead_letters.decode(raw)
                    if record is not None:
                        good.append((raw, record))
            uncommitted = uncommitted or bool(batches)
            if await handler(good) and uncommitted:
                await dead_letters.publisher.flush()
                await consumer.commit()
                uncommitted = False
            if batches:
                idle_since = loop.time()
            elif idle_timeout_s is not None and loop.time() - idle_since > idle_timeout_s:
                break
        if on_stop is not None and await on_stop() and uncommitted:
            await dead_letters.publisher.flush()
            await consumer.commit()
    finally:
        await consumer.stop()


async def read_topic(
    settings: KafkaSettings,
    topic: Topic[M],
    *,
    keep: Callable[[M], bool] | None = None,
    timeout_s: float = 60.0,
) -> list[M]:
    """Every record ``topic`` holds now, from the beginning of each partition to its end
    (no consumer group, nothing committed): a log read back as state at start-up. A record
    that does not decode is skipped (gpugap wrote the topic; a foreign record is not state);
    a topic not read to its end in ``timeout_s`` is a RetriableError. ``keep``: only the
    records it accepts are held (the rest of a shared log is read and dropped)."""
    from aiokafka import AIOKafkaConsumer

    name = settings.topic_prefix + topic.name
    await prepare(settings, [name], None)
    # subscribed without a group: every partition is assigned once the metadata is in
    consumer = AIOKafkaConsumer(
        name,
        **settings.client_options(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=2000,
    )
    await consumer.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    out: list[M] = []
    try:
        while not (parts := sorted(consumer.assignment())):
            if loop.time() > deadline:
                raise RetriableError(f"{name}: no partitions assigned within {timeout_s:.0f}s")
            await asyncio.sleep(0.05)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        left = {tp for tp in parts if end[tp] > 0}
        while left:
            if loop.time() > deadline:
                raise RetriableError(f"{name}: not read to its end within {timeout_s:.0f}s")
            batches = await consumer.getmany(*left, timeout_ms=500)
            for messages in batches.values():
                for m in messages:
                    try:
                        record = decode(topic, m.value)
                    except InvalidRecord:
                        continue
                    if keep is None or keep(record):
                        out.append(record)
            for tp in list(left):
                if await consumer.position(tp) >= end[tp]:
                    left.discard(tp)
    finally:
        await consumer.stop()
    return out


async def seek_to_start(consumer: Any, tps: list[Any]) -> dict[Any, int]:
    """Position ``tps`` (assigned) at their first offsets, explicitly; returns them.

    Not aiokafka's ``seek_to_beginning``: right after ``assign()`` the fetcher may already be
    asking for its default reset (the latest offset, for a consumer without a group), and
    that answer, arriving after ``seek_to_beginning``'s, wins: the partition is then read from
    its end and everything before it skipped (on a 3-broker cluster, 1 run in 20; a worker
    lost the first Slurm job so). An explicit position is never overwritten by a reset."""
    begin = await consumer.beginning_offsets(tps)
    for tp in tps:
        consumer.seek(tp, begin[tp])
    return dict(begin)


async def read_latest(
    settings: KafkaSettings, topic: str, partitions: Iterable[int], timeout_s: float = 120.0
) -> dict[bytes, bytes]:
    """The latest value of every key in ``partitions`` of a compacted topic (a broker name),
    read from the start to the end offsets of now: state written and acknowledged before
    the call is in it. Not read to its end in ``timeout_s``: a RetriableError."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in sorted(set(partitions))]
    latest: dict[bytes, bytes] = {}
    if not tps:
        return latest
    consumer = AIOKafkaConsumer(
        **settings.client_options(), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        consumer.assign(tps)
        await seek_to_start(consumer, tps)
        end = await consumer.end_offsets(tps)
        left = {tp for tp in tps if end[tp] > 0}
        while left:
            if loop.time() > deadline:
                raise RetriableError(f"{topic}: not read to its end within {timeout_s:.0f}s")
            for msgs in (await consumer.getmany(*left, timeout_ms=500)).values():
                for m in msgs:
                    if m.key is None:
                        continue
                    if m.value is None:
                        latest.pop(m.key, None)  # a tombstone
                    else:
                        latest[m.key] = m.value
            for tp in list(left):
                if await consumer.position(tp) >= end[tp]:
                    left.discard(tp)
    finally:
        await consumer.stop()
    return latest
