"""The one sink seam: subclass BatchingSink, name its topics and implement ``write(batch)``.

The base buffers records until ``max_records`` or ``max_age_s``, writes, and only then lets
the consume loop commit offsets. A write that fails with a retriable error is retried with
backoff for as long as it takes while nothing more is consumed (backpressure); records the
destination refuses are isolated by bisection and dead-lettered with its reason, while the
rest are stored.
"""

from __future__ import annotations

import asyncio
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage, consume
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.schemas import Record, Topic
from gpugap.schemas.errors import InvalidRecord, RecordsLost, RetriableError
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)


class Rejected(InvalidRecord):
    """The destination refused these records for a reason retrying cannot fix."""


class BatchingSink(ABC):
    #: registry name: ``gpugap sink <name>``
    name: ClassVar[str]
    topics: ClassVar[tuple[Topic[Any], ...]]

    def __init__(
        self, *, max_records: int = 50_000, max_age_s: float = 1.0, max_backoff_s: float = 10.0
    ) -> None:
        self.max_records = max_records
        self.max_age_s = max_age_s
        self.max_backoff_s = max_backoff_s
        self.stored = 0
        self.retries = 0
        self._buffer: list[tuple[RawMessage, Record]] = []
        self._oldest: float | None = None
        self._dead_letters: DeadLetters | None = None
        self.stop = asyncio.Event()

    @classmethod
    def from_settings(cls, settings: Settings, config: Any, **batching: Any) -> BatchingSink:
        """The sink ``gpugap sink NAME`` runs: ``config`` is the plugin's own settings (None
        when it has none), ``batching`` the batch limits from the command line."""
        return cls(**batching)

    @abstractmethod
    async def write(self, batch: Sequence[Record]) -> None:
        """Store the batch, all or nothing. Raise RetriableError when the destination is
        unavailable, Rejected when it refuses the data itself."""

    async def start(self) -> None:
        """Connect; called once before the first write."""

    async def close(self) -> None:
        """Release connections; called once after the last write."""

    async def idle(self) -> None:
        """Called on every poll that leaves nothing buffered: deferred work (a rollup) that
        must not wait for the next record."""

    async def handle(self, records: Sequence[tuple[RawMessage, Record]]) -> bool:
        """Buffer a poll's records; write when the batch is full or old. True = all stored."""
        loop = asyncio.get_running_loop()
        if records and self._oldest is None:
            self._oldest = loop.time()
        self._buffer.extend(records)
        full = len(self._buffer) >= self.max_records
        old = self._oldest is not None and loop.time() - self._oldest >= self.max_age_s
        if self._buffer and (full or old):
            await self.flush()
        if not self._buffer:
            await self.idle()
        return not self._buffer

    async def flush(self) -> bool:
        batch, self._buffer, self._oldest = self._buffer, [], None
        await self._write_isolating(batch)
        return True

    async def _write_isolating(self, batch: list[tuple[RawMessage, Record]]) -> None:
        if not batch:
            return
        try:
            await self._write_retrying([r for _, r in batch])
            self.stored += len(batch)
        except Rejected as exc:
            if len(batch) == 1:
                assert self._dead_letters is not None
                await self._dead_letters.route(
                    batch[0][0], f"{self.name}: {exc.reason}", DeadLetterKind.REJECTED
                )
                return
            half = len(batch) // 2
            await self._write_isolating(batch[:half])
            await self._write_isolating(batch[half:])

    async def _write_retrying(self, records: list[Record]) -> None:
        delay = 0.2
        while True:
            try:
                await self.write(records)
                return
            except RetriableError as exc:
                if self.stop.is_set():
                    raise
                if isinstance(exc, RecordsLost) and self._dead_letters is not None:
                    # the dead letters or ledger records of this batch: the retry writes
                    # them again, with a producer that sends
                    await self._dead_letters.publisher.reopen()
                self.retries += 1
                log.warning(
                    "%s: %s; retrying in %.1fs (nothing is consumed meanwhile)",
                    self.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff_s)

    async def run(
        self,
        kafka: KafkaSettings,
        dead_letters: DeadLetters,
        *,
        group: str | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        """Consume the sink's topics until ``self.stop`` is set (and the clusters' own topics
        of the same kinds, when ``dead_letters`` maps them: docs/kafka-trust.md)."""
        self._dead_letters = dead_letters
        trust = dead_letters.trust
        own = trust.topics_for(self.topics) if trust is not None else []
        topics = [t.name for t in self.topics] + [t.removeprefix(kafka.topic_prefix) for t in own]
        await self.start()
        try:
            await consume(
                kafka,
                group or f"gpugap-sink-{self.name}",
                self.handle,
                dead_letters,
                topics=topics,
                stop=self.stop,
                max_records=min(self.max_records, 20_000),
                idle_timeout_s=idle_timeout_s,
                on_stop=self.flush,
                # an outage of the destination must not cost the group membership
                max_poll_interval_ms=24 * 3600 * 1000,
            )
        finally:
            await self.close()
