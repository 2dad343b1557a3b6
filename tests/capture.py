"""A publisher that keeps what it is given, as the bytes it would send: the simulator's output
or a worker's, in process, without Kafka (tests, and benchmarks/worker_inproc.py)."""

from __future__ import annotations

from typing import Any

from groundfloor.kafka.publish import Publisher, event_time_ms
from schemas import Record, Topic, encode

Msg = tuple[str, bytes | None, bytes, int | None]  # topic (unprefixed), key, value, timestamp


class Capture(Publisher):
    """Keeps what the simulator publishes, as the bytes it would send."""

    def __init__(self) -> None:
        self.messages: list[Msg] = []

    async def send(self, topic: Topic[Any], record: Record) -> None:
        key, ts = topic.key_for(record), event_time_ms(record)
        self.messages.append((topic.name, key, encode(record), ts))

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        self.messages.append((topic.name, key, value, timestamp_ms))

    async def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        self.messages.append((topic, key, value or b"", timestamp_ms))

    async def flush(self) -> None:
        pass
