"""One request on one engine connection of its own: the engine reads the statement, the checks
refuse host access, the settings are applied, a reader's connection is made read-only by the
engine, then the statement runs (or the INSERT streams its data into the engine)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpugap.groundfloor import sqllex
from gpugap.warehouse.embedded import allowed, body, native, policy
from gpugap.warehouse.embedded.connection import Connection, Insert, Outcome, literal, unliteral
from gpugap.warehouse.embedded.engine import EngineProcess
from gpugap.warehouse.embedded.errors import EngineError, too_large
from gpugap.warehouse.embedded.limits import EndpointLimits

T = TypeVar("T")


@dataclass
class Call:
    """What the HTTP layer hands over: who, what, and in which context."""

    readonly: bool
    url_query: str
    stream: AsyncIterator[bytes]
    database: str | None
    settings: Mapping[str, str]  # checked names, literal values
    filters: Mapping[str, str]  # the row filters among them, as the client wrote them
    params: Mapping[str, str]  # query parameters {name:Type}
    default_format: str | None
    revision: int  # the client's Native revision (client_protocol_version)
    marker: str  # the connection's log_comment: how a cancel finds its query
    workload: str  # the engine workload of the caller's role: its share of memory
    # called with the size of the answer before it leaves the engine process (the user's
    # bytes waiting to be sent: slots.Pending)
    admit: Callable[[int], None] | None = None
    conn: Connection | None = None  # a session's own connection, kept after the request
    transient: frozenset[str] = frozenset()  # settings of this request only, reset on ``conn``
    # a reader scoped to a team or a person (scopes.py): the warehouse's database, the only one
    # it may read (its row policies are written for it)
    scoped_to: str | None = None


@dataclass
class Result:
    outcome: Outcome
    fmt: str | None  # the output format, for statements that return rows
    set_settings: dict[str, str] | None = None  # what a SET changed, for the session
    settings: dict[str, str] = field(default_factory=dict)  # in force for it, as literals


class Execution:
    """``guarded=False`` turns every SQL-level check off (a test shows the engine process's
    confinement holds without them); nothing but a test passes it."""

    def __init__(
        self,
        engine: EngineProcess,
        limits: EndpointLimits,
        call: Call,
        *,
        guarded: bool = True,
        readings: policy.Readings | None = None,
    ) -> None:
        self.engine, self.limits, self.call, self.guarded = engine, limits, call, guarded
        self.readings = readings
        self._marked = False  # the caller's role and workload are set on the connection
        self._set_here: frozenset[str] = frozenset()  # what the endpoint set for this request
        self._lifted: dict[str, str] = {}  # a reader's filters from its SETTINGS clause
        self._conn: Connection | None = None
        self._running: asyncio.Future[Any] | None = None

    async def run(self) -> Result:
        kept = self.call.conn
        conn = kept if kept is not None else await self._thread(self.engine.connect)
        self._conn = conn
        try:
            return await self._route()
        finally:
            running = self._running
            if running is not None and not running.done():
                await asyncio.wait([running])  # the engine lets go of it first
                if not running.cancelled():
                    running.exception()  # (the request's own error is the one reported)
            if kept is None:
                await self._thread(conn.close)
            else:  # what this request alone set goes back to its default for the next one
                await self._thread(conn.reset, self.call.transient | self._set_here)

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Engine work in a worker thread; if the request is cancelled meanwhile (the client went
        away), the query is killed and the connection is closed only after it stopped."""
        self._running = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        try:
            return await asyncio.shield(self._running)
        except asyncio.CancelledError:
            await asyncio.get_running_loop().run_in_executor(
                None, self.engine.kill, self.call.marker
            )
            raise

    async def _route(self) -> Result:
        call, conn = self.call, self._conn
        assert conn is not None
        split = sqllex.insert_statement(call.url_query) if call.url_query else None
        if split is not None:  # statement in the URL, data in the body
            return await self._insert(split[0], split[1], b"", call.stream)
        first = await body.head(call.stream, self.limits.max_query_bytes + 1)
        raw = f"{call.url_query}\n".encode() + first if call.url_query and first else first
        raw = raw or call.url_query.encode()
        inline = sqllex.split_insert(raw)
        if inline is not None:  # 'INSERT ... FORMAT X' or 'VALUES', then the data
            return await self._insert(inline.statement, inline.fmt, inline.data, call.stream)
        text = raw.decode(errors="replace")
        if len(text.encode()) > self.limits.max_query_bytes:
            raise body.TooLarge("the query", self.limits.max_query_bytes)
        if not text.strip():
            raise EngineError("Empty query", 62, "SYNTAX_ERROR")
        stmt = await self._thread(self._inspect, text, call.params)
        if stmt.takes_data is not None:
            raise EngineError(
                "Cannot find where the INSERT's data starts: write `INSERT ... FORMAT <name>` "
                "or `INSERT ... VALUES` before the data",
                62,
                "SYNTAX_ERROR",
            )
        if stmt.is_set:
            return Result(Outcome(), None, await self._thread(self._set, text))
        if call.readonly and self.guarded:
            # (a read-only connection takes no SETTINGS clause: Grafana's ad hoc filters in
            # one are applied to the connection instead, checked like the others)
            unfiltered, lifted = policy.lift_filters(stmt.normalized)
            if lifted:
                text = unfiltered
                self._lifted = {k: literal(unliteral(v)) if v.startswith("'") else literal(v)
                                for k, v in lifted.items()}  # fmt: skip
        await self._thread(self._prepare)
        fmt = sqllex.trailing_format(stmt.normalized) or call.default_format or "TabSeparated"
        sql = sqllex.strip_trailing_semicolon(text)
        limit = self.limits.max_result_bytes
        if fmt == "Native" and stmt.returns_rows and call.revision > 0:
            out = await self._thread(self._native_framed, sqllex.strip_trailing_format(sql))
            return Result(out, fmt)
        out = await self._thread(conn.query, sql, fmt, call.params, limit, call.admit)
        if fmt == "Native" and stmt.returns_rows and not out.data:
            columns = await self._thread(_columns, conn, sql, call.params)
            out.data = native.header_block(columns)
        return Result(out, fmt if stmt.returns_rows else None)

    def _native_framed(self, sql: str) -> Outcome:
        """Native for a client's revision: the engine answers in Buffers (its blocks' sizes
        beside Native's serialized columns) and the blocks are framed from those sizes."""
        conn, call, limit = self._conn, self.call, self.limits.max_result_bytes
        assert conn is not None
        out = conn.query(sql, "Buffers", call.params, limit, call.admit)
        framed = native.frame(out.data, _columns(conn, sql, call.params), call.revision)
        if framed.size > limit:  # the bytes sent count (the framing adds a few)
            raise too_large(framed.size, limit)
        out.pieces, out.result_rows, out.data = framed.pieces, framed.rows, b""
        out.extra["result_bytes"] = framed.size
        return out

    def _inspect(self, text: str, params: Mapping[str, str] | None = None) -> policy.Statement:
        """The engine's reading of ``text`` (its syntax only: nothing of it runs), checked
        (unless the guards are off)."""
        conn = self._conn
        assert conn is not None
        if self.readings is not None:
            stmt = self.readings.read(conn, text, params)
        else:
            stmt = policy.read(conn, text, params)
        if self.guarded:
            if policy.has_filters(stmt):
                self._mark()  # the filters are read by the engine: as the caller
            off_host = policy.off_host(self.engine.table_functions)
            policy.check(
                conn, stmt, off_host, reader=self.call.readonly, scoped_to=self.call.scoped_to
            )
        return stmt

    def _mark(self) -> None:
        """From here on what runs on this connection is the caller's: the engine's row
        policies read the role from log_comment (engine_config.ROW_POLICIES), its workload holds the
        role's share of memory."""
        if not self._marked:
            assert self._conn is not None
            self._conn.apply(self._marks())
            self._marked = True

    def _marks(self) -> dict[str, str]:
        return {"log_comment": literal(self.call.marker), "workload": literal(self.call.workload)}

    def _prepare(self) -> None:
        """The request's database and settings, then (a reader) readonly: in one SET where
        no filter is to be checked first."""
        conn, call = self._conn, self.call
        assert conn is not None
        # (a fresh connection is in ``default`` already: clients send database=default often)
        if call.database and (call.conn is not None or call.database != "default"):
            conn.use(call.database)
        if self.guarded and call.filters:
            self._mark()
            off_host = policy.off_host(self.engine.table_functions)
            policy.check_filters(
                conn, call.filters, off_host, reader=call.readonly, scoped_to=call.scoped_to
            )
        settings = {**({} if self._marked else self._marks()), **call.settings, **self._lifted}
        if call.readonly:  # last: from here the engine refuses writes, DDL and setting changes
            settings["readonly"] = "1"
        conn.apply(settings)
        self._marked = True

    def _set(self, text: str) -> dict[str, str]:
        """Run the SET on a scratch connection and keep what it changed (checked): like
        ClickHouse, it lasts for the session, or for nothing outside one."""
        scratch = self.engine.connect()
        try:
            if self.call.readonly:  # settings may change, readonly may not: the engine says so
                scratch.query("SET readonly = 2")
            scratch.query(sqllex.strip_trailing_semicolon(text))
            changed = {
                k: v
                for k, v in scratch.changed_settings().items()
                if self.engine.baseline.get(k) != v and k != "readonly"
            }
        finally:
            scratch.close()
        if self.guarded:
            for name in changed:
                policy.check_setting(name, reader=self.call.readonly)
            filters = {k: v for k, v in changed.items() if k in allowed.FILTERS}
            assert self._conn is not None
            off_host = policy.off_host(self.engine.table_functions)
            policy.check_filters(
                self._conn,
                filters,
                off_host,
                reader=self.call.readonly,
                scoped_to=self.call.scoped_to,
            )
        return {k: literal(v) for k, v in changed.items()}

    async def _insert(
        self, statement: str, fmt: str, first: bytes, rest: AsyncIterator[bytes]
    ) -> Result:
        """Stream the data into the engine while it arrives: the next chunk is read and
        decompressed while the engine parses the previous one."""
        conn = self._conn
        assert conn is not None
        stmt = await self._thread(self._inspect, f"{statement} FORMAT {fmt}")
        if stmt.takes_data is None:
            raise EngineError(f"Not an INSERT that takes data: {statement}", 62, "SYNTAX_ERROR")
        await self._thread(self._prepare)
        if fmt == "Values" and not self.call.readonly:
            # clickhouse-java's batches send expressions in their Values rows
            # (fromUnixTimestamp64Nano(...)); everywhere else (format(), a reader) they stay
            # off, and what such an expression could reach is the engine process's
            # confinement's to refuse (the data is never the endpoint's to read as SQL)
            await self._thread(conn.apply, VALUES_EXPRESSIONS)
            self._set_here = frozenset(VALUES_EXPRESSIONS)
        if fmt.startswith(TEXT_FORMATS) and not fmt.startswith(
            ("JSONColumns", "JSONCompactColumns")
        ):
            rest = _lines_bounded(rest, first, self.limits.max_line_bytes)
        ins: Insert = await self._thread(conn.begin_insert, statement, fmt)
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[None] | None = None
        try:
            if first:
                pending = loop.run_in_executor(None, ins.append, first)
            async for chunk in rest:
                if pending is not None:
                    await pending
                pending = loop.run_in_executor(None, ins.append, chunk)
            if pending is not None:
                await pending
                pending = None
            return Result(await self._thread(ins.finish), None)
        except BaseException:
            # synchronous on purpose: even a cancelled request must hand the engine back
            # (cancel waits for an append still in flight)
            ins.cancel()
            if pending is not None:  # its error, if any, is this one's consequence
                pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise


VALUES_EXPRESSIONS = {
    "input_format_values_interpret_expressions": "1",
    "input_format_values_deduce_templates_of_expressions": "1",
}
# formats whose rows are lines (or, for Values, at least break somewhere)
TEXT_FORMATS = (
    "CSV", "TSV", "TabSeparated", "JSONEachRow", "JSONCompactEachRow", "JSONStringsEachRow",
    "JSONCompactStringsEachRow", "JSONLines", "NDJSON", "Values", "LineAsString", "Custom",
    "Template", "Regexp", "Raw", "JSONAsString", "JSONAsObject",
)  # fmt: skip


def _columns(conn: Connection, sql: str, params: Mapping[str, str]) -> list[tuple[str, str]]:
    """Names and types of a query's columns, as ClickHouse's Native header gives them. The
    engine describes the query without running it again (``DESCRIBE TABLE (query)``: the
    same user and settings; it also keeps a column's time zone, which chDB's revision-0
    Native drops); what it cannot describe (SHOW, a trailing comment) is run again as
    RowBinaryWithNamesAndTypes, whose header chDB does write."""
    query = sqllex.strip_trailing_format(sql)
    try:
        described = conn.query(f"DESCRIBE TABLE ({query}\n)", "JSONCompactEachRow", params)
        rows = [json.loads(line) for line in described.data.splitlines() if line]
        return [(row[0], row[1]) for row in rows]
    except (EngineError, ValueError):
        head = conn.query(query, "RowBinaryWithNamesAndTypes", params).data
        return _header_pairs(head)


def _header_pairs(head: bytes | bytearray) -> list[tuple[str, str]]:
    """(name, type) of each column from a RowBinaryWithNamesAndTypes header."""
    columns, pos = native.read_varint(head, 0)
    fields: list[str] = []
    for _ in range(2 * columns):  # the names, then the types
        length, start = native.read_varint(head, pos)
        fields.append(head[start : start + length].decode())
        pos = start + length
    return list(zip(fields[:columns], fields[columns:], strict=True))


async def _lines_bounded(
    stream: AsyncIterator[bytes], first: bytes, limit: int
) -> AsyncIterator[bytes]:
    """The stream, refused once a line runs past ``limit`` bytes (chDB would buffer it whole:
    1 GiB of zeros without a newline took 3.6 GiB). ``first`` counts as already sent."""
    run = _tail(first, 0, limit)
    async for chunk in stream:
        run = _tail(chunk, run, limit)
        yield chunk


def _tail(chunk: bytes, run: int, limit: int) -> int:
    # lines inside one chunk (<= 2 MiB) are shorter than the limit (>= 2 MiB): only the line
    # that runs over from earlier chunks needs counting
    first = chunk.find(b"\n")
    if first < 0:
        run += len(chunk)
    elif run + first > limit:
        run += first
    else:
        run = len(chunk) - chunk.rfind(b"\n") - 1
    if run > limit:
        raise EngineError(
            f"A line of the INSERT's data is longer than {limit} bytes (the endpoint's limit, "
            "GPUGAP_CLICKHOUSE_SERVE_MAX_LINE_BYTES)",
            27,
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
        )
    return run
