"""The ClickHouse engine in-process (chDB), one statement at a time.

chDB runs queries of one connection one after another anyway; the lock makes each request's
settings (``SET`` before, ``SET ... = DEFAULT`` after) and current database its own, so
concurrent requests never see each other's settings and every reader sees a table either
before or after an insert, never half of one (MergeTree inserts are atomic per part).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"\(([A-Z_]+)\)\s*$")


class EngineError(Exception):
    """A ClickHouse exception: numeric code, name and ClickHouse's own message."""

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        message = message.strip()
        found = _CODE.search(message)
        self.code = code if code is not None else int(found.group(1)) if found else 1001
        named = _NAME.search(message)
        self.name = name or (named.group(1) if named else "STD_EXCEPTION")
        if not message.startswith("Code:"):
            message = f"Code: {self.code}. DB::Exception: {message}. ({self.name})"
        super().__init__(message)
        self.message = message


@dataclass
class Outcome:
    data: bytes = b""
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    result_rows: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    def __init__(self, path: Path | None) -> None:
        import chdb

        self.path = path
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
        self._conn = chdb.connect(str(path) if path is not None else ":memory:")
        self._lock = threading.Lock()
        self.version = self._run("SELECT version()", "TabSeparated").data.decode().strip()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _run(self, sql: str, fmt: str, params: Mapping[str, str] | None = None) -> Outcome:
        started = time.perf_counter()
        try:
            res = self._conn._conn.query(sql, fmt, params=dict(params or {}))
        except Exception as exc:  # chDB raises RuntimeError/ChdbError carrying ClickHouse's text
            raise EngineError(str(exc)) from None
        if res.has_error():
            raise EngineError(res.error_message())
        data = res.bytes() or b""
        return Outcome(
            data=data,
            rows_read=res.rows_read(),
            bytes_read=res.bytes_read(),
            rows_written=getattr(res, "rows_written", lambda: 0)(),
            bytes_written=getattr(res, "bytes_written", lambda: 0)(),
            elapsed_s=time.perf_counter() - started,
        )

    def _with_context(self, database: str | None, settings: Mapping[str, str]) -> list[str]:
        applied: list[str] = []
        try:
            if database:
                self._run(f"USE {_ident(database)}", "TabSeparated")
            for name, value in settings.items():
                self._run(f"SET {_ident(name)} = {value}", "TabSeparated")
                applied.append(name)
        except BaseException:
            self._reset(database, applied)
            raise
        return applied

    def _reset(self, database: str | None, applied: list[str]) -> None:
        for name in applied:
            self._run(f"SET {_ident(name)} = DEFAULT", "TabSeparated")
        if database:
            self._run("USE default", "TabSeparated")

    def query(
        self,
        sql: str,
        fmt: str,
        *,
        database: str | None = None,
        settings: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Outcome:
        with self._lock:
            applied = self._with_context(database, settings or {})
            try:
                return self._run(sql, fmt, params)
            finally:
                self._reset(database, applied)

    def begin_insert(
        self,
        statement: str,
        fmt: str,
        *,
        database: str | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> Insert:
        """Start ``INSERT INTO t (cols)`` with data in ``fmt``; holds the engine until the
        returned Insert is finished or cancelled (from any thread)."""
        self._lock.acquire()
        try:
            applied = self._with_context(database, settings or {})
            try:
                inserter = self._conn.send_insert(statement, fmt)
            except Exception as exc:
                self._reset(database, applied)
                raise EngineError(_strip_wrapper(str(exc))) from None
        except BaseException:
            self._lock.release()
            raise
        return Insert(self, inserter, database, applied)


class Insert:
    """One streaming INSERT: append chunks, then finish (all rows land) or cancel (none)."""

    def __init__(
        self, engine: Engine, inserter: Any, database: str | None, applied: list[str]
    ) -> None:
        self._engine, self._inserter = engine, inserter
        self._database, self._applied = database, applied
        self._started = time.perf_counter()
        self._open = True
        # append/finish/cancel may come from different threads: one at a time, so a cancel
        # after a dropped connection waits for the append in flight instead of racing it
        self._mutex = threading.Lock()

    def append(self, chunk: bytes) -> None:
        with self._mutex:
            if not self._open:
                raise EngineError("the insert was already finished or cancelled")
            try:
                self._inserter.append(chunk)
            except Exception as exc:
                raise EngineError(_strip_wrapper(str(exc))) from None

    def finish(self) -> Outcome:
        with self._mutex:
            try:
                result = self._inserter.finish()
            except Exception as exc:
                raise EngineError(_strip_wrapper(str(exc))) from None
            finally:
                self._release()
        return Outcome(
            rows_written=result.rows_written,
            bytes_written=result.bytes_written,
            elapsed_s=time.perf_counter() - self._started,
        )

    def cancel(self) -> None:
        """Idempotent; always releases the engine, whatever state the insert is in."""
        with self._mutex:
            if not self._open:
                return
            try:
                self._inserter.cancel()
            finally:
                self._release()

    def _release(self) -> None:
        if self._open:
            self._open = False
            try:
                self._engine._reset(self._database, self._applied)
            finally:
                self._engine._lock.release()


def _strip_wrapper(message: str) -> str:
    i = message.find("Code:")
    return message[i:] if i >= 0 else message


def _ident(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
