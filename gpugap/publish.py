"""Where records go: a Kafka topic, or JSON lines (a file or stdout) to try things without a
broker. Both write the same envelope, so `replay` can publish a JSONL capture unchanged."""

from __future__ import annotations

import asyncio
import json
import sys
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from gpugap.errors import RetriableError
from gpugap.settings import KafkaSettings
from schemas import Record, Topic, encode


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

    @abstractmethod
    async def flush(self) -> None:
        """Return once everything sent so far is durably written."""

    async def close(self) -> None:
        await self.flush()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class KafkaPublisher(Publisher):
    """aiokafka producer: idempotent, acks=all, batched by linger, keyed per the topic registry."""

    def __init__(self, settings: KafkaSettings, *, max_in_flight: int = 50_000) -> None:
        self.settings = settings
        self.max_in_flight = max_in_flight
        self._pending: list[asyncio.Future[Any]] = []
        self._producer: Any = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

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

    async def send_raw(
        self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None = None
    ) -> None:
        fut = await self._producer.send(topic, value=value, key=key, timestamp_ms=timestamp_ms)
        self._pending.append(fut)
        self.sent += 1
        if len(self._pending) >= self.max_in_flight:
            await self.flush()

    async def flush(self) -> None:
        if self._producer is None:
            return
        pending, self._pending = self._pending, []
        if pending:
            await self._producer.flush()
            for fut in pending:
                fut.result()  # raises if the broker refused a record

    async def close(self) -> None:
        if self._producer is None:
            return
        try:
            await self.flush()
        finally:
            await self._producer.stop()
            self._producer = None


class JsonlPublisher(Publisher):
    """One JSON object per line: ``{"topic": ..., "key": ..., "value": {record}}``."""

    def __init__(self, out: str | Path) -> None:
        self.out = str(out)
        self._fh: IO[bytes] | None = None

    async def start(self) -> None:
        if self.out == "-":
            self._fh = sys.stdout.buffer
        else:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.out, "ab")  # noqa: SIM115 - closed in close()

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

    async def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    async def close(self) -> None:
        await self.flush()
        if self._fh is not None and self._fh is not sys.stdout.buffer:
            self._fh.close()
        self._fh = None


def open_publisher(out: str | None, settings: KafkaSettings) -> Publisher:
    """``--out FILE`` (or ``-``) writes JSON lines; otherwise records go to Kafka."""
    return JsonlPublisher(out) if out else KafkaPublisher(settings)
