"""HTTP sessions (``session_id``), ClickHouse's way: a session belongs to one user, keeps what
``SET`` changed and, for a user who may write, one engine connection of its own, so its
temporary tables and current database last from one request to the next until it has been idle
for its timeout. One request at a time per session (a second one meanwhile: code 373); a user
keeps a bounded number of sessions (the idle oldest of that user's ends first), so no user can
end another's."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from gpugap.warehouse.embedded.connection import Connection
from gpugap.warehouse.embedded.engine import EngineProcess
from gpugap.warehouse.embedded.errors import EngineError

MAX_SETTINGS_BYTES = 64 << 10  # what SET may keep for a session, names and values


@dataclass
class Session:
    sid: str
    timeout_s: float
    settings: dict[str, str] = field(default_factory=dict)  # what SET changed, as literals
    conn: Connection | None = None  # a writer's own connection: its temporary tables
    busy: bool = False
    used: float = field(default_factory=time.monotonic)

    def expired(self, now: float) -> bool:
        return not self.busy and now - self.used >= self.timeout_s

    def keep(self, changed: dict[str, str]) -> None:
        """What a SET changed, for the session's later requests: bounded in size, since every
        later request applies it on a fresh engine connection."""
        merged = {**self.settings, **changed}
        size = sum(len(k) + len(v) for k, v in merged.items())
        if size > MAX_SETTINGS_BYTES:
            raise EngineError(
                f"The settings of session {self.sid} would hold {size} bytes, more than the "
                f"embedded endpoint keeps for a session ({MAX_SETTINGS_BYTES})",
                452,
                "SETTING_CONSTRAINT_VIOLATION",
            )
        self.settings = merged


class Sessions:
    def __init__(self, engine: EngineProcess, per_user: int, timeout_s: float) -> None:
        self.engine, self.per_user, self.timeout_s = engine, per_user, timeout_s
        self._by_user: dict[str, OrderedDict[str, Session]] = {}

    def acquire(self, user: str, sid: str, *, check: bool, timeout: str | None) -> Session:
        """The user's session ``sid``, new unless it exists (``session_check=1``: it must),
        marked busy until release()."""
        now = time.monotonic()
        for sessions in self._by_user.values():  # every user's: idle ones let go of their
            for old in [s for s in sessions.values() if s.expired(now)]:  # connections
                self._end(sessions, old)
        own = self._by_user.setdefault(user, OrderedDict())
        session = own.get(sid)
        if session is None:
            if check:
                raise EngineError(f"Session {sid} not found", 372, "SESSION_NOT_FOUND")
            idle = [s for s in own.values() if not s.busy]
            if len(own) >= self.per_user and idle:
                self._end(own, idle[0])  # the least recently used of this user's
            if len(own) >= self.per_user:
                raise EngineError(
                    f"Too many sessions for user {user}: {len(own)} are in use (at most "
                    f"{self.per_user}, GPUGAP_CLICKHOUSE_SERVE_MAX_SESSIONS)",
                    202,
                    "TOO_MANY_SIMULTANEOUS_QUERIES",
                )
            session = own[sid] = Session(sid, self.timeout_s)
        elif session.busy:
            raise EngineError(
                f"Session {sid} is locked by a concurrent client", 373, "SESSION_IS_LOCKED"
            )
        if timeout is not None:
            session.timeout_s = _timeout(timeout, self.timeout_s)
        own.move_to_end(sid)
        session.busy, session.used = True, now
        return session

    async def connection(self, session: Session) -> Connection:
        if session.conn is None:
            session.conn = await asyncio.get_running_loop().run_in_executor(
                None, self.engine.connect
            )
        return session.conn

    def release(self, session: Session, *, broken: bool = False) -> None:
        session.busy, session.used = False, time.monotonic()
        if broken and session.conn is not None:  # its state is unknown: the next one starts anew
            conn, session.conn = session.conn, None
            _close_later(conn)

    def _end(self, own: OrderedDict[str, Session], session: Session) -> None:
        own.pop(session.sid, None)
        if session.conn is not None:
            _close_later(session.conn)
            session.conn = None

    def close(self) -> None:
        for own in self._by_user.values():
            for session in list(own.values()):
                if session.conn is not None:
                    session.conn.close()
                    session.conn = None
            own.clear()


def _close_later(conn: Connection) -> None:
    asyncio.get_running_loop().run_in_executor(None, conn.close)


def _timeout(value: str, most: float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise EngineError(
            f"Cannot parse string '{value}' as UInt64 (session_timeout)", 6, "CANNOT_PARSE_TEXT"
        ) from None
    if not 0 < seconds <= most:
        raise EngineError(
            f"Session timeout {value} is out of range (0, {most:g}], the endpoint's "
            "GPUGAP_CLICKHOUSE_SERVE_SESSION_TIMEOUT_S",
            159,
            "TIMEOUT_EXCEEDED",
        )
    return seconds
