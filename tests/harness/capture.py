"""The one in-memory publisher: it keeps what it is given, as the bytes it would send (the
simulator's output or a worker's, in process, without Kafka), or, with ``keep=False``, only
counts it (what generating records alone costs: benchmarks/simulate.py)."""

from __future__ import annotations

from typing import Any

from gpugap.groundfloor.kafka.publish import Publisher, event_time_ms
from gpugap.schemas import Record, Topic, encode

Msg = tuple[str, bytes | None, bytes, int | None]  # topic (unprefixed), key, value, timestamp


class Capture(Publisher):
    """Keeps what is published as the bytes it would send (``keep=False``: counts it only)."""

    def __init__(self, keep: bool = True) -> None:
        self.messages: list[Msg] = []
        self.keep = keep

    def _take(self, message: Msg) -> None:
        self.sent += 1
        if self.keep:
            self.messages.append(message)

    async def send(self, topic: Topic[Any], record: Record) -> None:
        if not self.keep:
            self.sent += 1
            return
        key, ts = topic.key_for(record), event_time_ms(record)
        self._take((topic.name, key, encode(record), ts))

    async def send_encoded(
        self, topic: Topic[Any], key: bytes, value: bytes, timestamp_ms: int | None = None
    ) -> None:
        self._take((topic.name, key, value, timestamp_ms))

    async def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        self._take((topic, key, value or b"", timestamp_ms))

    async def flush(self) -> None:
        pass
