"""The ClickHouse engine (chDB) in a process of its own, and a fresh connection for every
request.

The engine process (enginehost.py) confines itself before it loads the engine: it can read and
write only its data directory and read its libraries, opens no network connection and starts no
program (confine.py); it inherits no secret. This side starts it, hands it a socket pair per
engine connection and speaks wire.py over it; if it stops, every call says so.

chDB runs queries of different connections in parallel, and a connection's settings, current
database and temporary tables are its own. So each request gets a connection of its own (cheap
to open), with its settings applied and, for a reader, engine-level ``readonly=1`` set last;
it is closed after the request. Nothing one request sets can reach another, a slow query holds
only its own connection, and no reset can fail halfway. The engine's configuration (limits.py)
bounds every query and leaves host sources ungranted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpugap.services.clickhouse import wire
from gpugap.services.clickhouse.confine import ConfinementError
from schemas.errors import ServiceError

log = logging.getLogger(__name__)
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
    data: bytes | bytearray = b""
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    result_rows: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    pieces: list[bytes | memoryview] | None = None  # the answer framed for the client, if so


# what the engine process inherits: no secret, nothing of the endpoint's configuration
_INHERITED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
START_TIMEOUT_S = 120.0


class Engine:
    """The engine process (enginehost.py), and this side of its connections.

    ``confine``: ``required`` (the process confines itself or does not start), ``best-effort``
    (what the kernel allows, the rest logged) or ``off``. ``startup``: statements the engine
    runs before it serves (the workloads). ``on_exit`` is called, from a thread, if the process
    ends while the endpoint still uses it."""

    def __init__(
        self,
        path: Path,
        config: Path | None = None,
        *,
        confine: str = "required",
        startup: Sequence[str] = (),
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if re.search(r"[?&#%]", str(path)):
            raise EngineError(f"the data path may not contain ?, &, # or %: {path}", 36)
        scratch = path / "tmp"  # the engine's temporary files stay in its data directory
        scratch.mkdir(exist_ok=True)
        self._control, theirs = socket.socketpair()
        their_fd = theirs.fileno()  # the same number in the engine process (pass_fds)
        env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        env["TMPDIR"] = str(scratch)
        env["PYTHONPATH"] = _code_roots(env.get("PYTHONPATH"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpugap.services.clickhouse.enginehost"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=path,
            pass_fds=(their_fd,),
        )
        theirs.close()
        self._stopping = False
        self._lines = _EngineLog(self.proc)
        job = {
            "control": their_fd,
            "parent": os.getpid(),
            "path": str(path.resolve()),
            "config": str(config.resolve()) if config is not None else None,
            "confine": confine,
            "startup": list(startup),
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode())
        self.proc.stdin.close()
        self._control.settimeout(START_TIMEOUT_S)
        try:
            ready, _ = wire.receive(self._control)
        except (OSError, wire.Closed):
            self.proc.kill()
            self.proc.wait()
            raise ServiceError(
                "the ClickHouse engine process did not start: "
                + (self._lines.tail() or "it said nothing")
            ) from None
        self._control.settimeout(None)
        if "error" in ready:
            self.proc.wait()
            if ready.get("confinement"):
                raise ConfinementError(ready["error"])
            raise ServiceError(f"the ClickHouse engine process did not start: {ready['error']}")
        self.confinement: dict[str, Any] = ready["confinement"]
        self._control_lock = threading.Lock()
        self.on_exit = on_exit
        threading.Thread(target=self._watch, name="engine-watch", daemon=True).start()
        self._keeper = self.connect()  # for KILL QUERY
        self._keeper_lock = threading.Lock()
        self.version = self._keeper.query("SELECT version()").data.decode().strip()
        names = self._keeper.query("SELECT name FROM system.table_functions", "TSVRaw")
        self.table_functions = frozenset(names.data.decode().split())
        self.baseline = self._keeper.changed_settings()

    def connect(self) -> Connection:
        """A new engine connection: a socket pair, one end handed to the engine process."""
        ours, theirs = socket.socketpair()
        try:
            with self._control_lock:
                socket.send_fds(self._control, [b"c"], [theirs.fileno()])
        except OSError:
            ours.close()
            raise EngineError("the engine process is not running", 1001) from None
        finally:
            theirs.close()
        conn = Connection(ours)
        conn.call({})  # its greeting: the engine opened the connection, or why not
        return conn

    def kill(self, marker: str) -> None:
        """Cancel the query (on any connection) whose log_comment is ``marker``."""
        with self._keeper_lock, contextlib.suppress(EngineError):  # it may have ended meanwhile
            self._keeper.query(
                "KILL QUERY WHERE Settings['log_comment'] = {m:String} ASYNC",
                params={"m": marker},
            )

    def close(self, timeout_s: float = 60.0) -> None:
        """Close the connections first (the caller's), then the engine: it finishes its
        writes and exits."""
        self._stopping = True
        with self._keeper_lock:
            self._keeper.close()
        self._control.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _watch(self) -> None:
        code = self.proc.wait()
        if not self._stopping:
            log.error("the ClickHouse engine process ended with %s: %s", code, self._lines.tail())
            if self.on_exit is not None:
                self.on_exit(code)


def _code_roots(inherited: str | None) -> str:
    """PYTHONPATH for the engine process: the directories this process found gpugap's
    packages in first, so that both run the same code (a checkout run as ``python -m
    gpugap`` from its root finds its own before an installed one)."""
    roots: list[str] = []
    for package in ("gpugap", "schemas"):
        spec = importlib.util.find_spec(package)
        for location in spec.submodule_search_locations or () if spec else ():
            root = str(Path(location).resolve().parent)
            if root not in roots:
                roots.append(root)
    return os.pathsep.join([*roots, *(inherited.split(os.pathsep) if inherited else [])])


class _EngineLog:
    """The engine process's output, a line at a time into this process's log: its own
    messages (with what a query put in them) never start a line of ours."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._recent: list[str] = []
        threading.Thread(target=self._pump, args=(proc,), name="engine-log", daemon=True).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue
            self._recent = [*self._recent[-19:], line]
            log.warning("engine: %s", line)

    def tail(self) -> str:
        return " | ".join(self._recent[-5:])


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
            raise EngineError(_strip_wrapper(answer["error"]))
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


def too_large(size: int, limit: int) -> EngineError:
    """ClickHouse's answer to a result over ``max_result_bytes``; here it counts the bytes
    the answer would send (the engine's own count is of its blocks in memory)."""
    return EngineError(
        f"Limit for result exceeded, max bytes: {limit}, current bytes: {size} (the endpoint's "
        "limit on an answer, GPUGAP_CLICKHOUSE_SERVE_MAX_RESULT_BYTES)",
        396,
        "TOO_MANY_ROWS_OR_BYTES",
    )


def escaped(value: str) -> str:
    """A query parameter's value is read in ClickHouse's escaped (TSV) form."""
    return value.translate(_ESCAPES)


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"})


def _strip_wrapper(message: str) -> str:
    i = message.find("Code:")
    return message[i:] if i >= 0 else message


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
