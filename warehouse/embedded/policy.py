"""What a request may do, decided on the engine's own reading of it: a second line behind
the engine process's confinement (confine.py), which holds whatever passes here.

Nothing here parses SQL: the engine parses a request (``formatQuerySingleLine``, which also
refuses a second statement) and dumps its syntax tree (``EXPLAIN AST`` of that normalized,
single statement); the checks below read those outputs. Privileges themselves are the engine's:
readonly per connection and the grants of engine_config.py. What the engine cannot refuse in chDB is
refused here: ``file()`` (chDB's scalar reads any path, grant or not), ``INTO OUTFILE`` and
``FROM INFILE`` (done by chDB's client layer, not by the server), table functions that reach
the host, the network, a program (``executable``) or the process's Python objects
(``python``), dictionaries (their sources may read files or other servers), ATTACH (it may
attach a directory from anywhere), and, for a reader, the functions and tables that show the
server's paths or other queries. Row filters (Grafana's ad hoc filters) are SQL inside a
setting: each expression is read by the engine, never evaluated, and checked like a query,
wherever it comes from (a URL parameter, SET, a query's or a view's SETTINGS clause).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpugap.groundfloor import sqllex
from gpugap.warehouse.embedded import allowed, scopes
from gpugap.warehouse.embedded.connection import Connection, escaped
from gpugap.warehouse.embedded.errors import EngineError

# table functions that compute or read this server's own tables, nothing else
SAFE_TABLE_FUNCTIONS = frozenset(
    {
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "generate_series",
        "generateseries",
        "primes",
        "values",
        "sqlstandardvalues",
        "null",
        "view",
        "viewifpermitted",
        "viewexplain",
        "merge",
        "generaterandom",
        "input",
        "format",
        "loop",
    }
)
# scalar functions that read the host
HOST_FUNCTIONS = frozenset({"file", "catboostevaluate", "modelevaluate"})
# what a reader may not call: the server's own configuration (its paths among it)
READER_FUNCTIONS = frozenset({"getserversetting", "getmergetreesetting"})
MAX_FILTER_DEPTH = 4  # a filter's expression may hold a subquery with filters of its own

_FUNCTION = re.compile(r"^\s*Function(?:WithKeyValueArguments)?\s+(\S+)", re.MULTILINE)
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"")
# settings the engine lets the endpoint change per request, and no client
# (engine_config.PER_REQUEST)
ENDPOINT_OWNED = allowed.NEVER | {"log_comment", "workload"}
_SETTINGS_CLAUSE = re.compile(r"\bSETTINGS\s+", re.IGNORECASE)
_ASSIGNMENT = re.compile(
    r"\s*(?P<name>\w+)\s*=\s*"
    r"(?P<value>'[^']*'|\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|[\w.+-]+)\s*(?P<comma>,)?"
)
_FILTER_SETTING = re.compile(rf"\b({'|'.join(sorted(allowed.FILTERS))})\s*=\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    normalized: str  # the engine's one-line rendering of the single statement
    root: str  # the AST's root node: SelectWithUnionQuery, InsertQuery, Set, CreateQuery...
    ast: str

    @property
    def is_set(self) -> bool:
        return self.root == "Set"

    @property
    def returns_rows(self) -> bool:
        return not self.root.startswith(
            ("InsertQuery", "CreateQuery", "DropQuery", "AlterQuery", "Rename", "Set", "UseQuery",
             "TruncateQuery", "OptimizeQuery", "DeleteQuery", "DetachQuery", "KillQueryQuery",
             "SYSTEM", "Grant", "CreateSQLFunctionQuery")
        )  # fmt: skip

    @property
    def kills(self) -> bool:
        return self.root.startswith("KillQueryQuery")

    @property
    def takes_data(self) -> str | None:
        """For ``INSERT ... FORMAT X`` / ``VALUES`` whose data follows: X; else None."""
        if not self.root.startswith("InsertQuery") or "SelectWithUnionQuery" in self.ast:
            return None
        m = re.search(r"\bFORMAT\s+(\w+)$", _QUOTED.sub("''", self.normalized))
        return m.group(1) if m else None


@functools.lru_cache(maxsize=8)
def off_host(table_functions: frozenset[str]) -> frozenset[str]:
    """Lower-case names of the functions that reach the host: every table function off the
    safe list, and the scalar ones that read files. Computed once per engine (the engine's
    set of names is the cache key)."""
    return frozenset({f.lower() for f in table_functions} - SAFE_TABLE_FUNCTIONS | HOST_FUNCTIONS)


def read(conn: Connection, text: str, params: Mapping[str, str] | None = None) -> Statement:
    """The engine's reading of ``text``: one statement, normalized, and its syntax tree."""
    normalized = conn.normalize(text)
    ast = conn.explain(normalized, params)
    return Statement(normalized, ast.split("\n", 1)[0].strip(), ast)


class Readings:
    """The engine's readings of query texts seen lately (two engine queries each): clients
    send the same texts again and again (the sink's INSERTs, a dashboard's panels), and a
    text's reading is the same every time. Only texts up to ``max_text`` characters, at most
    ``max_bytes`` in all; thread-safe."""

    def __init__(self, max_text: int = 16 << 10, max_bytes: int = 8 << 20) -> None:
        self.max_text, self.max_bytes = max_text, max_bytes
        self._kept: OrderedDict[str, Statement] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def read(self, conn: Connection, text: str, params: Mapping[str, str] | None) -> Statement:
        with self._lock:
            found = self._kept.get(text)
            if found is not None:
                self._kept.move_to_end(text)
                return found
        stmt = read(conn, text, params)
        if len(text) <= self.max_text:
            with self._lock:
                if text not in self._kept:
                    self._kept[text] = stmt
                    self._size += _weight(text, stmt)
                while self._size > self.max_bytes and self._kept:
                    old, dropped = self._kept.popitem(last=False)
                    self._size -= _weight(old, dropped)
        return stmt


def _weight(text: str, stmt: Statement) -> int:
    return len(text) + len(stmt.normalized) + len(stmt.ast)


def has_filters(stmt: Statement) -> bool:
    """Whether the statement's SETTINGS clauses hold a row filter (checked on the engine)."""
    return bool(_FILTER_SETTING.search(sqllex.mask(stmt.normalized)))


def check(
    conn: Connection,
    stmt: Statement,
    off_host: frozenset[str],
    *,
    reader: bool,
    depth: int = 0,
    scoped_to: str | None = None,
) -> None:
    """``check_statement``, and the row filters the statement holds, each checked the same
    way; a reader scoped to a team or a person (``scoped_to``: the warehouse's database, the
    one its row policies are written for) names no table elsewhere (scopes.check_tables)."""
    check_statement(stmt, off_host, reader=reader)
    if scoped_to is not None:
        if stmt.root.startswith("UseQuery"):
            raise _denied("USE for a scoped reader (it reads its warehouse's database only)")
        scopes.check_tables(stmt.ast, scoped_to)
    for name, text in _filters_in(stmt.normalized):
        for expression in filter_expressions(conn, name, text, literal=True):
            check_expression(
                conn, expression, off_host, reader=reader, depth=depth + 1, scoped_to=scoped_to
            )


def check_statement(stmt: Statement, off_host: frozenset[str], *, reader: bool) -> None:
    """Refuse host access (code 497, or 564 for INTO OUTFILE) whoever asks, and for a reader
    what a read-only user of a server could not do or see, before anything of it runs."""
    bare = _QUOTED.sub("''", stmt.normalized)
    if re.search(r"\bINTO\s+OUTFILE\b", bare):
        raise EngineError(
            "INTO OUTFILE is not allowed over HTTP (the file would be written on the server)",
            564,
            "INTO_OUTFILE_NOT_ALLOWED",
        )
    if re.search(r"\bFROM\s+INFILE\b", bare):
        raise _denied("FROM INFILE (it reads a file on the server); send the data in the body")
    for name in _FUNCTION.findall(stmt.ast):
        if name.lower() in off_host:
            raise _denied(f"{name}() reaches files, programs or other servers of the host")
        if reader and name.lower() in READER_FUNCTIONS:
            raise _denied(f"{name}() for a read-only user (it shows the server's configuration)")
    if "Dictionary definition" in stmt.ast:
        raise _denied("dictionaries (their sources read files or other servers)")
    if stmt.root.startswith("AttachQuery"):
        raise _denied("ATTACH (it may attach a directory from anywhere on the host)")
    for name in assigned_settings(stmt.normalized) & ENDPOINT_OWNED:
        raise EngineError(
            f"Setting {name} is the endpoint's (it sets it for each request) and should not be "
            "changed",
            452,
            "SETTING_CONSTRAINT_VIOLATION",
        )
    if stmt.root.startswith(("CreateWorkload", "DropWorkload", "CreateResource", "DropResource")):
        raise _denied("workloads and resources (they hold each user to a share of memory)")
    if reader and stmt.kills:  # engine readonly lets it through, and every engine connection
        # is the one engine user: it would reach the queries of every HTTP user
        raise _denied("KILL QUERY for a read-only user (the queries of other users would match)")


def check_filters(
    conn: Connection,
    settings: Mapping[str, str],
    off_host: frozenset[str],
    *,
    reader: bool,
    scoped_to: str | None = None,
) -> None:
    """The row filters among ``settings`` (name -> the value as the client sent it), each
    expression read by the engine and checked like a query before the setting is applied."""
    for name in sorted(set(settings) & allowed.FILTERS):
        for expression in filter_expressions(conn, name, settings[name], literal=False):
            check_expression(conn, expression, off_host, reader=reader, scoped_to=scoped_to)


def check_expression(
    conn: Connection,
    expression: str,
    off_host: frozenset[str],
    *,
    reader: bool,
    depth: int = 1,
    scoped_to: str | None = None,
) -> None:
    if depth > MAX_FILTER_DEPTH:
        raise _denied(f"row filters nested more than {MAX_FILTER_DEPTH} deep")
    if expression.strip():
        stmt = read(conn, f"SELECT ({expression}\n)")
        check(conn, stmt, off_host, reader=reader, depth=depth, scoped_to=scoped_to)


def filter_expressions(conn: Connection, name: str, text: str, *, literal: bool) -> list[str]:
    """The SQL expressions a filter setting holds, read without evaluating anything:
    ``additional_table_filters`` is a map literal ``{'table':'expression',...}``;
    ``additional_result_filter`` an expression (``literal``: as a quoted string literal, the
    way a SETTINGS clause holds it). The engine's Values parser reads the literal with
    expression interpretation off, so ``map(...)`` or ``concat(...)`` is refused, not run."""
    if name == "additional_result_filter" and not literal:
        return [text]
    column = "e String" if name == "additional_result_filter" else "m Map(String, String)"
    rows = conn.query(
        f"SELECT * FROM format(Values, '{column}', {{row:String}}) SETTINGS "  # noqa: S608
        "input_format_values_interpret_expressions = 0, "
        "input_format_values_deduce_templates_of_expressions = 0, "
        # (a session's connection may hold filters already: not for this query)
        "additional_result_filter = '', additional_table_filters = {}",
        "JSONEachRow",
        {"row": escaped(f"({text})")},
    )
    found: list[str] = []
    for line in rows.data.decode().splitlines():
        value = json.loads(line)
        found += [value["e"]] if "e" in value else list(value["m"].values())
    return found


def assigned_settings(normalized: str) -> set[str]:
    """The names every SETTINGS clause of a statement (its own, a subquery's, a table's or a
    view's) assigns, as the engine rendered them (``SETTINGS a = 1, b = 'x'``)."""
    return {name for clause in _settings_clauses(normalized) for name, _, _ in clause.items}


def lift_filters(normalized: str) -> tuple[str, dict[str, str]]:
    """``normalized`` without the row filters its SETTINGS clauses assign, and those filters
    (name -> the literal's text): a read-only connection may change no setting, not even in
    a SETTINGS clause, so a reader's filters (Grafana appends its ad hoc filters to the query
    text) are applied to the connection before it is made read-only."""
    out, lifted, done = [], {}, 0
    for clause in _settings_clauses(normalized):
        kept = [
            f"{name} = {value}" for name, value, _ in clause.items if name not in allowed.FILTERS
        ]
        lifted.update({n: v for n, v, _ in clause.items if n in allowed.FILTERS})
        if len(kept) == len(clause.items):
            continue
        out.append(normalized[done : clause.start].rstrip())
        if kept:
            out.append(" SETTINGS " + ", ".join(kept))
        done = clause.end
    out.append(normalized[done:])
    return "".join(out), lifted


@dataclass(frozen=True)
class _Clause:
    start: int  # where SETTINGS starts
    end: int  # after its last assignment
    items: list[tuple[str, str, int]]  # name, value as written, where it starts


def _settings_clauses(normalized: str) -> list[_Clause]:
    masked = sqllex.mask(normalized)  # literals blanked: their content is never a name
    clauses = []
    for clause in _SETTINGS_CLAUSE.finditer(masked):
        pos, items, end = clause.end(), [], clause.end()
        while (m := _ASSIGNMENT.match(masked, pos)) is not None:
            value = normalized[m.start("value") : m.end("value")]
            items.append((m.group("name").lower(), value, m.start("name")))
            end, pos = m.end("value"), m.end()
            if m.group("comma") is None:
                break
        if items:
            clauses.append(_Clause(clause.start(), end, items))
    return clauses


def _filters_in(normalized: str) -> Iterator[tuple[str, str]]:
    """(setting, literal) for every filter setting a statement's SETTINGS clauses (its own, a
    subquery's, a view's definition) give, as the engine rendered them: a SETTINGS value is a
    literal (a map of string literals, or a string), never an expression."""
    masked = sqllex.mask(normalized)  # literals blanked: a match is the setting, not a string
    for match in _FILTER_SETTING.finditer(masked):
        name, start = match.group(1).lower(), match.end()
        opening, closing = ("{", "}") if name == "additional_table_filters" else ("'", "'")
        end = masked.find(closing, start + 1)
        if not masked.startswith(opening, start) or end < 0:
            raise EngineError(
                f"Setting {name} is SQL that is checked before it runs: give it as a literal "
                "(a map of strings, or a string)",
                452,
                "SETTING_CONSTRAINT_VIOLATION",
            )
        yield name, normalized[start : end + 1]


def _denied(what: str) -> EngineError:
    return EngineError(
        f"Not enough privileges: {what} is off in this endpoint", 497, "ACCESS_DENIED"
    )


# --- settings a URL parameter or SET may change ---------------------------------------------


def is_allowed(name: str) -> bool:
    """On the reviewed list (allowed.py): every other setting is constant in the engine."""
    return name in allowed.committed()


def check_setting(name: str, *, reader: bool) -> None:
    """ClickHouse's answers: a read-only user may not touch ``readonly`` (164); anything off
    the list is a constraint violation (452). The engine checks values and maxima itself."""
    if name == "readonly" and reader:
        raise EngineError("Cannot modify 'readonly' setting in readonly mode", 164, "READONLY")
    if is_allowed(name):
        return
    raise EngineError(
        f"Setting {name} should not be changed (the embedded endpoint allows only the settings "
        "that clients and BI tools use)",
        452,
        "SETTING_CONSTRAINT_VIOLATION",
    )
