"""Query slots shared fairly: each user may run at most its share of the endpoint's queries
at once (``max_concurrent_queries_for_user``, by default the slots divided equally among the
users), so a reader that fills its share makes only its own next query wait, and the sink's
inserts and the admin's queries find theirs free. A request waits ``queue_wait_s`` at most
for a slot, then gets ClickHouse's code 202."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gpugap.services.clickhouse.engine import EngineError
from gpugap.services.clickhouse.limits import EndpointLimits


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
