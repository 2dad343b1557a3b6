"""This side of one engine connection: each call a frame to the engine process and its
answer (wire.py). A connection's settings, current database and temporary tables are its own;
the requests on one connection go one at a time."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpugap.warehouse.embedded import wire
from gpugap.warehouse.embedded.errors import EngineError, strip_wrapper, too_large


@dataclass
class Outcome:
    data: bytes | bytearray = b""
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    result_rows: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    pieces: list[bytes | memoryview] | None = None  # the answer framed for the client, if so


class Connection:
    """One engine connection: settings, database and temporary tables of its own."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def call(
        self,
        head: dict[str, Any],
        payload: bytes | memoryview = b"",
        *,
        expect_answer: bool = True,
    ) -> tuple[dict[str, Any], bytearray]:
        """Send one request (none: read the greeting) and read its answer."""
        try:
            if head:
                wire.send(self._sock, head, payload)
            if not expect_answer:
                return {}, bytearray()
            answer, data = wire.receive(self._sock)
        except (OSError, wire.Closed, ValueError):
            raise EngineError(
                "Code: 1001. DB::Exception: the engine process stopped answering (see the "
                "endpoint's log). (STD_EXCEPTION)"
            ) from None
        if "error" in answer:
            raise EngineError(strip_wrapper(answer["error"]))
        if "too_large" in answer:
            raise too_large(answer["too_large"], answer["limit"])
        return answer, data

    def query(
        self,
        sql: str,
        fmt: str = "TabSeparated",
        params: Mapping[str, str] | None = None,
        limit: int | None = None,
        admit: Callable[[int], None] | None = None,
    ) -> Outcome:
        """Run ``sql``; ``limit``: the most bytes its answer may have (code 396 past it);
        ``admit``: called with the answer's size before it leaves the engine process (what it
        raises drops the answer there)."""
        started = time.perf_counter()
        head: dict[str, Any] = {"op": "query", "sql": sql, "fmt": fmt, "params": dict(params or {})}
        if limit is not None:
            head["limit"] = limit
        if admit is not None:
            head["admit"] = True
        answer, data = self.call(head)
        if "admit" in answer and admit is not None:
            try:
                admit(answer["admit"])
            except BaseException:
                self.call({"take": False}, expect_answer=False)
                raise
            _, data = self.call({"take": True})
        return Outcome(
            data=data,
            rows_read=answer["rows_read"],
            bytes_read=answer["bytes_read"],
            rows_written=answer["rows_written"],
            bytes_written=answer["bytes_written"],
            result_rows=answer["result_rows"],
            elapsed_s=time.perf_counter() - started,
            extra={"result_bytes": answer["result_bytes"]},
        )

    def normalize(self, text: str) -> str:
        """The engine's one-line rendering of ``text`` (a second statement is a syntax error)."""
        one = self.query("SELECT formatQuerySingleLine({q:String})", "TSVRaw", {"q": escaped(text)})
        return one.data.decode().rstrip("\n")

    def explain(self, normalized: str, params: Mapping[str, str] | None = None) -> str:
        """The engine's syntax tree of one normalized statement."""
        return self.query(f"EXPLAIN AST {normalized}", "TSVRaw", params).data.decode()

    def apply(self, settings: Mapping[str, str]) -> None:
        """SET each setting; values are literals (quoted by the caller)."""
        if settings:
            pairs = ", ".join(f"{_ident(k)} = {v}" for k, v in settings.items())
            self.query(f"SET {pairs}")

    def reset(self, names: frozenset[str]) -> None:
        """Each setting back to its default (the profile's)."""
        if names:
            self.query("SET " + ", ".join(f"{_ident(n)} = DEFAULT" for n in sorted(names)))

    def use(self, database: str) -> None:
        self.query(f"USE {_ident(database)}")

    def changed_settings(self) -> dict[str, str]:
        out = self.query(  # (a row filter in force would filter this query too)
            "SELECT name, value FROM system.settings WHERE changed SETTINGS "
            "additional_result_filter = '', additional_table_filters = {}",
            "TSVRaw",
        )
        rows = (line.split("\t", 1) for line in out.data.decode().splitlines() if "\t" in line)
        return {name: value for name, value in rows}

    def begin_insert(self, statement: str, fmt: str) -> Insert:
        """Start ``INSERT INTO t (cols)`` with data in ``fmt``."""
        self.call({"op": "insert", "statement": statement, "fmt": fmt})
        return Insert(self)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Insert:
    """One streaming INSERT: append chunks, then finish (all rows land) or cancel (none)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._started = time.perf_counter()
        self._open = True
        # append/finish/cancel may come from different threads: one at a time, so a cancel
        # after a dropped connection waits for the append in flight instead of racing it
        self._mutex = threading.Lock()

    def append(self, chunk: bytes | memoryview) -> None:
        with self._mutex:
            if not self._open:
                raise EngineError("the insert was already finished or cancelled")
            self._conn.call({"op": "append"}, chunk)

    def finish(self) -> Outcome:
        with self._mutex:
            self._open = False
            answer, _ = self._conn.call({"op": "finish"})
        return Outcome(
            rows_written=answer["rows_written"],
            bytes_written=answer["bytes_written"],
            elapsed_s=time.perf_counter() - self._started,
        )

    def cancel(self) -> None:
        """Idempotent."""
        with self._mutex:
            if self._open:
                self._open = False
                with contextlib.suppress(EngineError):
                    self._conn.call({"op": "cancel"})


def escaped(value: str) -> str:
    """A query parameter's value is read in ClickHouse's escaped (TSV) form."""
    return value.translate(_ESCAPES)


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"})


def literal(value: str) -> str:
    """A ClickHouse string literal (setting values are applied as ``SET name = literal``)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def unliteral(text: str) -> str:
    """The value ``literal`` quoted."""
    return re.sub(r"\\(.)", r"\1", text[1:-1], flags=re.DOTALL)


def _ident(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
