"""The ClickHouse engine in-process (chDB): a fresh connection for every request.

chDB 4 runs queries of different connections in parallel, and a connection's settings, current
database and temporary tables are its own. So each request gets a connection of its own (cheap
to open), with its settings applied and, for a reader, engine-level ``readonly=1`` set last;
it is closed after the request. Nothing one request sets can reach another, a slow query holds
only its own connection, and no reset can fail halfway. The engine's configuration (limits.py)
bounds every query and leaves host sources ungranted.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"\(([A-Z_]+)\)\s*$")
# the engine quotes our own wrapper query in its errors: not the client's business
_SCOPE = re.compile(r"(?::|\.)?\s*In scope SELECT formatQuerySingleLine\(.*\)\.", re.DOTALL)
# an exception the engine re-threw around its own ("Code: 164. DB::Exception: Code: 164.
# DB::Exception: <text> (NAME) (version V). (NAME)") reads as a server's single one
_NESTED = re.compile(
    r"^Code: (\d+)\. DB::Exception: Code: \1\. DB::Exception: (.*?)\.?(?: \([A-Z_]+\))?"
    r"(?: \(version [^)]*\))?\.?\s*(\([A-Z_]+\))?$",
    re.DOTALL,
)
# every engine connection is the engine's own user ``default`` (chDB authenticates no other):
# that name in front of a message is not the HTTP user who asked, so it is left out
_ENGINE_USER = re.compile(r"^(Code: \d+\. DB::Exception: )default: ")


class EngineError(Exception):
    """A ClickHouse exception: numeric code, name and ClickHouse's own message."""

    status: int | None = None  # an HTTP status other than ClickHouse's mapping of the code

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        message = _SCOPE.sub(".", message.strip())
        nested = _NESTED.match(message)
        if nested:
            code_, text, named_ = nested.groups()
            message = f"Code: {code_}. DB::Exception: {text}. {named_ or ''}".rstrip()
        message = _ENGINE_USER.sub(r"\1", message)
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
    def __init__(self, path: Path | None, config: Path | None = None) -> None:
        import chdb

        self._chdb = chdb
        self.path = path
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            if re.search(r"[?&#%]", str(path)):
                raise EngineError(f"the data path may not contain ?, &, # or %: {path}", 36)
        where = f"file:{path}" if path is not None else ":memory:"
        self._dsn = f"{where}?config-file={config}" if config is not None else where
        # the engine lives while one connection is open: this one, also used to cancel queries
        self._keeper = self.connect()
        self._keeper_lock = threading.Lock()
        self.version = self._keeper.query("SELECT version()").data.decode().strip()
        names = self._keeper.query("SELECT name FROM system.table_functions", "TSVRaw")
        self.table_functions = frozenset(names.data.decode().split())
        self.baseline = self._keeper.changed_settings()

    def connect(self) -> Connection:
        return Connection(self._chdb.connect(self._dsn))

    def kill(self, marker: str) -> None:
        """Cancel the query (on any connection) whose log_comment is ``marker``."""
        with self._keeper_lock, contextlib.suppress(EngineError):  # it may have ended meanwhile
            self._keeper.query(
                "KILL QUERY WHERE Settings['log_comment'] = {m:String} ASYNC",
                params={"m": marker},
            )

    def close(self) -> None:
        with self._keeper_lock:
            self._keeper.close()


class Connection:
    """One engine connection: settings, database and temporary tables of its own."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def query(
        self, sql: str, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None
    ) -> Outcome:
        started = time.perf_counter()
        try:
            res = self._conn._conn.query(sql, fmt, params=dict(params or {}))
        except Exception as exc:  # chDB raises RuntimeError/ChdbError carrying ClickHouse's text
            raise EngineError(_strip_wrapper(str(exc))) from None
        if res.has_error():
            raise EngineError(res.error_message())
        data = res.bytes() or b""
        # chDB's rows_read()/bytes_read() are the result's rows and bytes; what ClickHouse's
        # summary calls read_rows/read_bytes (from storage) is storage_rows_read()/...
        return Outcome(
            data=data,
            rows_read=res.storage_rows_read(),
            bytes_read=res.storage_bytes_read(),
            rows_written=getattr(res, "rows_written", lambda: 0)(),
            bytes_written=getattr(res, "bytes_written", lambda: 0)(),
            result_rows=res.rows_read(),
            elapsed_s=time.perf_counter() - started,
            extra={"result_bytes": res.bytes_read()},
        )

    def normalize(self, text: str) -> str:
        """The engine's one-line rendering of ``text`` (a second statement is a syntax error)."""
        one = self.query(
            "SELECT formatQuerySingleLine({q:String})", "TSVRaw", {"q": _escaped(text)}
        )
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
        out = self.query("SELECT name, value FROM system.settings WHERE changed", "TSVRaw")
        rows = (line.split("\t", 1) for line in out.data.decode().splitlines() if "\t" in line)
        return {name: value for name, value in rows}

    def begin_insert(self, statement: str, fmt: str) -> Insert:
        """Start ``INSERT INTO t (cols)`` with data in ``fmt``."""
        try:
            inserter = self._conn.send_insert(statement, fmt)
        except Exception as exc:
            raise EngineError(_strip_wrapper(str(exc))) from None
        return Insert(inserter)

    def close(self) -> None:
        self._conn.close()


class Insert:
    """One streaming INSERT: append chunks, then finish (all rows land) or cancel (none)."""

    def __init__(self, inserter: Any) -> None:
        self._inserter = inserter
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
            self._open = False
            try:
                result = self._inserter.finish()
            except Exception as exc:
                raise EngineError(_strip_wrapper(str(exc))) from None
        return Outcome(
            rows_written=result.rows_written,
            bytes_written=result.bytes_written,
            elapsed_s=time.perf_counter() - self._started,
        )

    def cancel(self) -> None:
        """Idempotent."""
        with self._mutex:
            if self._open:
                self._open = False
                self._inserter.cancel()


def _escaped(value: str) -> str:
    """A query parameter's value is read in ClickHouse's escaped (TSV) form."""
    return value.translate(_ESCAPES)


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"})


def _strip_wrapper(message: str) -> str:
    i = message.find("Code:")
    return message[i:] if i >= 0 else message


def literal(value: str) -> str:
    """A ClickHouse string literal (setting values are applied as ``SET name = literal``)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
