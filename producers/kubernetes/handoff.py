"""Watcher threads -> the event loop: batches of records through a bounded queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpugap.schemas import DeadLetter, K8sPodEvent


class Stopped(Exception):
    """The producer is shutting down."""


@dataclass
class Batch:
    """What one watcher hands over: records in order, how far it has read, and the dead
    letters of what it read but could not turn into records."""

    namespace: str
    records: list[K8sPodEvent]
    resource_version: str | None
    synced: bool = False  # a full list has been handed over (``--once`` ends after it)
    error: BaseException | None = None
    dead: list[DeadLetter] = field(default_factory=list)


class Handoff:
    """Thread -> event loop. A bounded queue gives backpressure: a watcher blocks (and keeps
    checking for stop) while the publisher is behind. The loop is woken at most once per
    drain, not once per batch."""

    def __init__(self, wake: Callable[[], None], maxsize: int = 256) -> None:
        self.q: queue.Queue[Batch] = queue.Queue(maxsize)
        self._wake = wake
        self._pending = threading.Event()

    def put(self, batch: Batch, stop: threading.Event) -> None:
        while True:
            try:
                self.q.put(batch, timeout=0.1)
                break
            except queue.Full:
                if stop.is_set():
                    raise Stopped from None
        if not self._pending.is_set():
            self._pending.set()
            self._wake()

    def drain(self) -> list[Batch]:
        self._pending.clear()
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out
