"""The one producer seam: subclass Producer, name it, give it a default topic, and either
override ``poll()`` (sampled/polled sources: one tick per interval) or ``run()`` (sources
that push events). The runner handles Kafka or JSONL output, --once, SIGTERM/SIGINT and the
final flush, so a producer file only talks to its source."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.groundfloor.settings import Settings
from gpugap.schemas import Record, Topic

log = logging.getLogger(__name__)


class Producer(ABC):
    #: registry name: ``gpugap produce <name>``
    name: ClassVar[str]
    #: seconds between ticks for polling producers
    interval_s: float = 10.0

    def __init__(self, settings: Settings, config: Any = None) -> None:
        # config: the producer's own settings (its plugin's class); subclasses type it
        self.settings = settings
        self.publisher: Publisher | None = None
        self.ticks = 0

    @classmethod
    @abstractmethod
    def default_topic(cls) -> Topic[Any]:
        """Where this producer's records go unless a record names another topic."""

    async def emit(self, record: Record, topic: Topic[Any] | None = None) -> None:
        assert self.publisher is not None, "emit() is only valid while the producer runs"
        await self.publisher.send(topic or self.default_topic(), record)

    async def poll(self) -> Iterable[Record]:
        """One tick's records. Polling producers override this."""
        raise NotImplementedError(f"{type(self).__name__} must override poll() or run()")

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; with ``once``, tick once."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = loop.time()
            for record in await self.poll():
                await self.emit(record)
            self.ticks += 1
            if once:
                return
            assert self.publisher is not None
            await self.publisher.flush()
            wait = max(0.0, self.interval_s - (loop.time() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def close(self) -> None:
        """Release the source (connections, handles). Called once, after run()."""


async def run_producer(
    producer: Producer,
    publisher: Publisher,
    *,
    once: bool = False,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until done, SIGTERM or SIGINT; always flush what was produced. Returns records sent."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with publisher:
            producer.publisher = publisher
            try:
                await producer.run(stop, once=once)
            finally:
                await producer.close()
                producer.publisher = None
        return publisher.sent
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
