"""The one loop every backfill source runs: chunks fetched in parallel, published in order.

A source says how to read one chunk of history (``fetch``, several chunks at once) and turn
it into the records the live producers would have published then, in event-time order
(``transform``, one chunk at a time in chunk order, for state that spans chunks). The runner
fetches up to ``concurrency`` chunks at once, publishes them strictly in chunk order (so
every partition gets its records in event time, as the worker's event-time merge expects),
flushes, then records the chunk in the checkpoint. Records carry their event time as the
Kafka timestamp (the publisher does that for every record).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.schemas import Record, Topic

from .plan import Checkpoint, Chunk, Progress, chunks
from .settings import BackfillSettings

log = logging.getLogger(__name__)

Published = Sequence[tuple[Topic[Any], Record]]


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Backfill(Producer):
    """A history source over ``[since, until)``; ``run()`` returns when the range is done."""

    name: ClassVar[str] = "backfill"
    #: the source's name in checkpoints and progress lines
    source: ClassVar[str]

    def __init__(
        self,
        settings: Settings,
        config: BackfillSettings,
        *,
        since: datetime,
        until: datetime,
        restart: bool = False,
    ) -> None:
        super().__init__(settings, config)
        self.cfg = config
        self.cluster = config.cluster or settings.cluster
        self.since_ms = round(since.timestamp() * 1000)
        self.until_ms = round(until.timestamp() * 1000)
        self.chunks = chunks(self.since_ms, self.until_ms, config.chunk_s * 1000)
        self.restart = restart
        self.published = 0

    def checkpoint_key(self) -> dict[str, str]:
        """What makes two runs the same backfill (a source adds what selects its data)."""
        return {"source": self.source, "cluster": self.cluster, "chunk_s": str(self.cfg.chunk_s)}

    @abstractmethod
    async def fetch(self, chunk: Chunk) -> Any:
        """Read one chunk of history: its records, in event-time order, or what
        ``transform`` makes them of. Runs for several chunks at once."""

    async def transform(self, chunk: Chunk, fetched: Any) -> Published:
        """What ``fetch`` read -> the chunk's records. Runs one chunk at a time, in chunk
        order (state that spans chunks lives here); default: ``fetch`` gave the records."""
        records: Published = fetched
        return records

    async def prepare(self) -> None:
        """Anything a source reads once before the chunks (default: nothing)."""

    def problem(self) -> str | None:
        """After the run: why it failed although nothing raised (the command then exits
        non-zero with this line), e.g. input of which nothing could be read. Default: None."""
        return None

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        assert self.publisher is not None
        cp = Checkpoint.open(self.cfg.checkpoint_dir, self.checkpoint_key(), restart=self.restart)
        progress = Progress(self.source, len(self.chunks), self.until_ms - self.since_ms)
        todo = []
        for c in self.chunks:
            if c in cp.done:
                progress.skip(c)
            else:
                todo.append(c)
        if not todo:
            log.warning(
                "backfill %s: %s to %s is already done (%s): nothing to publish; --restart "
                "publishes it again",
                self.source,
                _utc(self.since_ms),
                _utc(self.until_ms),
                cp.path,
            )
            return
        if len(todo) < len(self.chunks):
            log.warning(
                "backfill %s: resuming: %d of %d chunks were done (%s)",
                self.source,
                len(self.chunks) - len(todo),
                len(self.chunks),
                cp.path,
            )
        await self.prepare()
        window: list[tuple[Chunk, asyncio.Task[Any]]] = []
        try:
            for c in todo:  # at most `concurrency` fetches in flight, consumed in order
                window.append((c, asyncio.create_task(self.fetch(c))))
                if len(window) >= self.cfg.concurrency:
                    await self._publish(*window.pop(0), cp, progress)
                if stop.is_set():
                    return
            while window and not stop.is_set():
                await self._publish(*window.pop(0), cp, progress)
        finally:
            for _, task in window:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _publish(
        self, chunk: Chunk, task: asyncio.Task[Any], cp: Checkpoint, progress: Progress
    ) -> None:
        assert self.publisher is not None
        records = await self.transform(chunk, await task)
        for i, (topic, record) in enumerate(records):
            await self.publisher.send(topic, record)
            if i % 1024 == 1023:
                await asyncio.sleep(0)  # let the Kafka client's tasks and signals in
        await self.publisher.flush()  # only then is the chunk done
        cp.mark(chunk, len(records))
        self.published += len(records)
        progress.advance(chunk, len(records))
