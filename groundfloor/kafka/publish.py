"""Where records go: a Kafka topic, or JSON lines (a file or stdout) to try things without a
broker. Both write the same envelope, so `replay` can publish a JSONL capture unchanged."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from aiokafka.partitioner import DefaultPartitioner

from gpugap.groundfloor.kafka.admin import ensure_topics
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Record, Topic, decode, encode
from gpugap.schemas.errors import RecordsLost, RetriableError

log = logging.getLogger(__name__)

_PARTITIONER = DefaultPartitioner()


def event_time_ms(record: Record) -> int | None:
    """The record's event time as Kafka timestamp, so brokers and consumers see event time."""
    when = getattr(record, "time", None) or getattr(record, "minute", None)
    return int(when.timestamp() * 1000) if isinstance(when, datetime) else None


class Publisher(ABC):
    """Sends records to their topics. Use as ``async with``: close() flushes."""

    sent = 0

    async def start(self) -> None:
        pass

    @abstractmethod
    async def send(self, topic: Topic[Any], record: Record) -> None: ...

    def topic_name(self, topic: Topic[Any]) -> str:
        """What ``send_raw`` calls the topic here (Kafka adds the configured prefix)."""
        return topic.name

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        """A record already encoded, byte-identical to ``schemas.encode`` (fast paths)."""
        await self.send(topic, decode(topic, value))

    async def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        """Opaque bytes, valid or not (replaying captures, testing dead-letter paths);
        ``partition`` overrides the key's (the stream worker's per-shard state)."""
        raise NotImplementedError(f"{type(self).__name__} cannot send raw bytes")

    @abstractmethod
    async def flush(self) -> None:
        """Return once everything sent so far is durably written."""

    async def close(self) -> None:
        await self.flush()

    async def reopen(self) -> None:
        """Start again after ``RecordsLost``: what this publisher still held is dropped (the
        caller sends it again), and the next call sends."""
        with contextlib.suppress(Exception):
            await self.close()
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class KafkaPublisher(Publisher):
    """aiokafka producer: idempotent, acks=all, keyed per the topic registry.

    Records are appended to one batch per partition (aiokafka's per-message ``send()`` costs
    more than encoding the record); the partition comes from the same murmur2 partitioner as
    the Java client, so keys land where Faust and every other client expect them.

    Once the broker refused a batch, the publisher has lost records, whichever call noticed
    it first: that call and every later ``send_raw`` and ``flush`` raise ``RecordsLost``. A
    caller that stores a checkpoint after a flush must never see one succeed after records
    were lost (a second flush would otherwise find nothing left to fail on); it sends again
    from its checkpoint with a new publisher, or this one after ``reopen()``.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer: Any = None
        self._batches: dict[tuple[str, int], Any] = {}
        self._partitions: dict[str, list[int]] = {}
        self._partition_of: dict[tuple[str, bytes], int] = {}
        self._in_flight: list[asyncio.Future[Any]] = []
        self._round_robin = 0
        self._linger: asyncio.Task[None] | None = None
        self._ship_lock = asyncio.Lock()  # batches of a partition reach the broker in order
        #: the first refusal or failed hand-over: records were lost (see the class doc)
        self._lost: BaseException | None = None

    async def start(self) -> None:
        """Connect; a second call keeps the running producer (and what it has in flight)."""
        from aiokafka import AIOKafkaProducer

        if self._producer is not None:
            return
        s = self.settings
        self._producer = AIOKafkaProducer(
            **s.client_options(),
            acks="all",
            enable_idempotence=True,
            compression_type=None if s.compression == "none" else s.compression,
            linger_ms=s.linger_ms,
            max_batch_size=min(s.max_batch_bytes, 1_048_576),
        )
        try:
            await self._producer.start()
        except Exception as exc:
            await self._producer.stop()
            self._producer = None
            raise RetriableError(
                f"cannot reach Kafka at {s.bootstrap} ({exc}); start one with "
                "`gpugap services up` or set GPUGAP_KAFKA_BOOTSTRAP"
            ) from exc

    async def send(self, topic: Topic[Any], record: Record) -> None:
        await self.send_raw(
            topic.qualified(self.settings.topic_prefix),
            topic.key_for(record),
            encode(record),
            event_time_ms(record),
        )

    def topic_name(self, topic: Topic[Any]) -> str:
        return topic.qualified(self.settings.topic_prefix)

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        await self.send_raw(topic.qualified(self.settings.topic_prefix), key, value, timestamp_ms)

    async def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        self._raise_if_lost()
        partitions = self._partitions.get(topic) or await self._load_partitions(topic)
        if partition is not None:
            if partition not in partitions:
                raise ValueError(f"{topic} has no partition {partition}")
        elif key is None:
            self._round_robin += 1
            partition = partitions[self._round_robin % len(partitions)]
        else:
            # murmur2 is pure Python (~15 us a key) and keys repeat (one per node): remember
            partition = self._partition_of.get((topic, key), -1)
            if partition < 0:
                if len(self._partition_of) > 100_000:
                    self._partition_of.clear()
                partition = _PARTITIONER(key, partitions, partitions)
                self._partition_of[topic, key] = partition
        batch = self._batches.get((topic, partition))
        if batch is None:
            batch = self._batches[topic, partition] = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=timestamp_ms) is None:
            await self._ship(topic, partition)  # full: send it, start the next one
            batch = self._batches[topic, partition] = self._producer.create_batch()
            if batch.append(key=key, value=value, timestamp=timestamp_ms) is None:
                raise ValueError(f"a record of {len(value or b'')} bytes exceeds the batch size")
        self.sent += 1
        if self._linger is None or self._linger.done():
            # a record never waits in a half-full batch for longer than linger_ms (one a
            # linger-time send lost is raised by the next call: ``_raise_if_lost``)
            self._linger = asyncio.create_task(self._ship_after_linger())

    async def _ship_after_linger(self) -> None:
        await asyncio.sleep(self.settings.linger_ms / 1000)
        try:
            await self._ship_all()
        except Exception as exc:  # the next send or flush raises it (``_raise_if_lost``)
            self._lost = self._lost or exc

    async def _load_partitions(self, topic: str) -> list[int]:
        # created first where missing: auto-creation would log "not found" at ERROR
        await ensure_topics(self.settings, [topic])
        found = sorted(await self._producer.partitions_for(topic))
        self._partitions[topic] = found
        return found

    async def _ship(self, topic: str, partition: int) -> None:
        async with self._ship_lock:
            batch = self._batches.pop((topic, partition), None)
            if batch is not None and batch.record_count():
                try:
                    fut = await self._producer.send_batch(batch, topic, partition=partition)
                except Exception as exc:
                    error = RecordsLost(
                        f"{topic}[{partition}]: a batch of {batch.record_count()} record(s) "
                        f"could not be handed to Kafka ({type(exc).__name__}: {exc}); they "
                        "were not sent"
                    )
                    self._lost = self._lost or error
                    raise error from exc
                fut.add_done_callback(self._note_refusal)
                self._in_flight.append(fut)

    def _note_refusal(self, fut: asyncio.Future[Any]) -> None:
        # read here, the moment the broker answers: the publisher is marked at once (not
        # only when a flush reaches this future), and asyncio does not log the exception
        # of a future nobody awaited as "never retrieved"
        if not fut.cancelled() and (exc := fut.exception()) is not None:
            self._lost = self._lost or exc

    def _raise_if_lost(self) -> None:
        lost = self._lost
        if lost is None:
            return
        if isinstance(lost, RecordsLost):
            raise RecordsLost(f"{lost} (records this publisher took were lost)") from lost
        raise RecordsLost(
            f"Kafka refused a batch ({type(lost).__name__}: {lost}): records this publisher "
            "took were lost; send them again after reopen() or with a new publisher"
        ) from lost

    async def _ship_all(self) -> None:
        for topic, partition in list(self._batches):
            await self._ship(topic, partition)

    async def flush(self) -> None:
        if self._producer is None:
            return
        if self._linger is not None:
            # never cancel it: it may be mid-way through handing a batch to the broker
            linger, self._linger = self._linger, None
            await linger
        self._raise_if_lost()  # a linger-time send that failed
        await self._ship_all()
        in_flight, self._in_flight = self._in_flight, []
        if in_flight:
            # every answer, not only up to the first refusal (``_note_refusal`` has marked
            # the publisher by then)
            await asyncio.gather(*in_flight, return_exceptions=True)
        self._raise_if_lost()  # refused now, or earlier and noticed by no caller until now

    async def close(self) -> None:
        if self._producer is None:
            return
        try:
            await self.flush()
        finally:
            await self._producer.stop()
            self._producer = None
            self._batches.clear()
            self._in_flight.clear()
            self._lost = None  # a later start() is a new producer


class JsonlPublisher(Publisher):
    """One JSON object per line: ``{"topic": ..., "key": ..., "value": {record}}``.

    Bytes that are not a valid record (``send_raw``) keep the envelope but carry the exact
    bytes base64-encoded instead of ``value``: ``{"topic", "key", "value_b64"}``.
    """

    def __init__(self, out: str | Path) -> None:
        self.out = str(out)
        self._fh: IO[bytes] | None = None
        self._keys: dict[bytes, bytes] = {}  # key -> its JSON string (the fast path repeats keys)

    async def start(self) -> None:
        if self.out == "-":
            self._fh = sys.stdout.buffer
        else:
            path = Path(self.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            _drop_torn_last_line(path)
            self._fh = open(path, "ab")  # noqa: SIM115 - closed in close()

    async def send(self, topic: Topic[Any], record: Record) -> None:
        assert self._fh is not None, "start() the publisher first"
        key = json.dumps(topic.key_of(record)).encode()
        self._fh.write(
            b'{"topic":"'
            + topic.name.encode()
            + b'","key":'
            + key
            + b',"value":'
            + encode(record)
            + b"}\n"
        )
        self.sent += 1

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        assert self._fh is not None, "start() the publisher first"
        quoted = self._keys.get(key)
        if quoted is None:
            if len(self._keys) > 100_000:
                self._keys.clear()
            quoted = self._keys[key] = json.dumps(key.decode()).encode()
        head = b'{"topic":"' + topic.name.encode() + b'","key":' + quoted + b',"value":'
        self._fh.write(head + value + b"}\n")
        self.sent += 1

    async def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        assert self._fh is not None, "start() the publisher first"
        line = {
            "topic": topic,
            "key": None if key is None else key.decode(errors="replace"),
            "value_b64": base64.b64encode(value or b"").decode(),
        }
        self._fh.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        self.sent += 1

    async def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    async def close(self) -> None:
        await self.flush()
        if self._fh is not None and self._fh is not sys.stdout.buffer:
            self._fh.close()
        self._fh = None


def _drop_torn_last_line(path: Path) -> None:
    """Appending after a run that was killed mid-write would glue the next record onto the
    half-written one and spoil both lines. That half line was never flushed as a whole, so no
    checkpoint counts it (the backfill marks a chunk done only after a flush): cut it off."""
    try:
        fh = open(path, "r+b")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        keep, pos = 0, end
        while pos > 0:  # back to the last newline, 64 KiB at a time
            start = max(0, pos - 65536)
            fh.seek(start)
            nl = fh.read(pos - start).rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        fh.truncate(keep)
    log.warning(
        "%s ended in a half-written line (%d bytes, left by a run that was killed mid-write):"
        " removed it; its records are written again",
        path,
        end - keep,
    )


def open_publisher(out: str | None, settings: KafkaSettings) -> Publisher:
    """``--out FILE`` (or ``-``) writes JSON lines; otherwise records go to Kafka."""
    return JsonlPublisher(out) if out else KafkaPublisher(settings)
