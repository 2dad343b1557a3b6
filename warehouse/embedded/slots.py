"""Query slots and answer bytes shared fairly.

Slots: each user may run at most its share of the endpoint's queries
at once (``max_concurrent_queries_for_user``, by default the slots divided equally among the
users), so a reader that fills its share makes only its own next query wait, and the sink's
inserts and the admin's queries find theirs free. A request waits ``queue_wait_s`` at most
for a slot, then gets ClickHouse's code 202."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gpugap.warehouse.embedded.errors import EngineError
from gpugap.warehouse.embedded.limits import EndpointLimits


class Slots:
    def __init__(self, limits: EndpointLimits, users: Mapping[str, Any]) -> None:
        self.total, self.wait_s = limits.max_concurrent_queries, limits.queue_wait_s
        self.per_user = limits.max_concurrent_queries_for_user or max(
            1, self.total // max(1, len(users))
        )
        self._all = asyncio.Semaphore(self.total)
        self._users = {name: asyncio.Semaphore(self.per_user) for name in users}

    @contextlib.asynccontextmanager
    async def held(self, user: str) -> AsyncIterator[None]:
        own = self._users.setdefault(user, asyncio.Semaphore(self.per_user))
        deadline = time.monotonic() + self.wait_s
        await self._take(own, deadline, f"user {user}'s {self.per_user}")
        try:
            await self._take(self._all, deadline, f"all {self.total}")
            try:
                yield
            finally:
                self._all.release()
        finally:
            own.release()

    async def _take(self, sem: asyncio.Semaphore, deadline: float, which: str) -> None:
        try:
            await asyncio.wait_for(sem.acquire(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise EngineError(
                f"Too many simultaneous queries: {which} slots stayed busy for {self.wait_s:g} s",
                202,
                "TOO_MANY_SIMULTANEOUS_QUERIES",
            ) from None


class Pending:
    """The bytes of each user's answers that wait to be sent, bounded per user: an answer is
    admitted before it leaves the engine process, and given back once it is sent (or its
    client gone). A user's answer waits ``wait_s`` at most for its user's earlier ones to go
    out, then gets code 241; other users' answers never wait for it. Used from the engine
    calls' worker threads."""

    def __init__(self, per_user: int, wait_s: float) -> None:
        self.per_user, self.wait_s = per_user, wait_s
        self._held: dict[str, int] = {}
        self._changed = threading.Condition()

    def take(self, user: str, size: int) -> None:
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            # (one answer always fits once the user has nothing waiting: MAX_RESULT_BYTES is at
            # most the budget)
            while self._held.get(user, 0) and self._held[user] + size > self.per_user:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(
                        f"Memory limit (for user) exceeded: user {user}'s answers waiting to be "
                        f"sent hold {self._held[user]} bytes, and this one's {size} would pass "
                        f"{self.per_user} (GPUGAP_CLICKHOUSE_SERVE_MAX_PENDING_BYTES_FOR_USER); "
                        "read the answers already asked for",
                        241,
                        "MEMORY_LIMIT_EXCEEDED",
                    )
                self._changed.wait(left)
            self._held[user] = self._held.get(user, 0) + size

    def give(self, user: str, size: int) -> None:
        with self._changed:
            self._held[user] = max(0, self._held.get(user, 0) - size)
            self._changed.notify_all()

    def held(self, user: str) -> int:
        return self._held.get(user, 0)
