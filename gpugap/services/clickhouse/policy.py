"""What a request may do, decided on the engine's own reading of it.

Nothing here parses SQL: the engine parses a request (``formatQuerySingleLine``, which also
refuses a second statement) and dumps its syntax tree (``EXPLAIN AST`` of that normalized,
single statement); the checks below read those outputs. Privileges themselves are the engine's:
readonly per connection and the grants of limits.py. What the engine cannot refuse in chDB is
refused here: ``file()`` (chDB's scalar reads any path, grant or not), ``INTO OUTFILE`` and
``FROM INFILE`` (done by chDB's client layer, not by the server), table functions that reach
the host or the network, dictionaries (their sources may read files or other servers), ATTACH
(it may attach a directory from anywhere), and row filters (SQL inside a setting) that the
endpoint has not checked.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpugap.services.clickhouse import allowed
from gpugap.services.clickhouse.engine import Connection, EngineError

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

_FUNCTION = re.compile(r"^\s*Function(?:WithKeyValueArguments)?\s+(\S+)", re.MULTILINE)
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"")


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


def inspect(
    conn: Connection,
    text: str,
    off_host: frozenset[str],
    params: Mapping[str, str] | None = None,
) -> Statement:
    """The engine's reading of ``text``; refuses host access (code 497, or 564 for INTO
    OUTFILE) whoever asks, before anything of it runs."""
    normalized = conn.normalize(text)
    bare = _QUOTED.sub("''", normalized)
    if re.search(r"\bINTO\s+OUTFILE\b", bare):
        raise EngineError(
            "INTO OUTFILE is not allowed over HTTP (the file would be written on the server)",
            564,
            "INTO_OUTFILE_NOT_ALLOWED",
        )
    if re.search(r"\bFROM\s+INFILE\b", bare):
        raise _denied("FROM INFILE (it reads a file on the server); send the data in the body")
    ast = conn.explain(normalized, params)
    root = ast.split("\n", 1)[0].strip()
    for name in _FUNCTION.findall(ast):
        if name.lower() in off_host:
            raise _denied(f"{name}() reaches files, processes or other servers of the host")
    if "Dictionary definition" in ast:
        raise _denied("dictionaries (their sources read files or other servers)")
    if root.startswith("AttachQuery"):
        raise _denied("ATTACH (it may attach a directory from anywhere on the host)")
    for name in allowed.FILTERS:
        if re.search(rf"\b{name}\b", bare):
            raise EngineError(
                f"Setting {name} holds SQL that is checked before it is applied: send it as a "
                "URL parameter, not with SET, in a query's SETTINGS clause or a definition",
                452,
                "SETTING_CONSTRAINT_VIOLATION",
            )
    return Statement(normalized, root, ast)


def check_filters(conn: Connection, settings: Mapping[str, str], off_host: frozenset[str]) -> None:
    """The row filters among ``settings`` (name -> literal: ``additional_table_filters``'
    values, ``additional_result_filter``), each read by the engine and checked like a query
    before they are applied: a filter is SQL the engine runs beside the query, so ``file()``
    in one would read the host. (Read from the literals, not from the applied settings: a
    result filter would filter the query that reads it.)"""
    for name in sorted(set(settings) & allowed.FILTERS):
        value = settings[name]
        if name.endswith("s"):  # a map, in the engine's text form: read as Values data
            # (value is a string literal made by engine.literal)
            sql = f"SELECT arrayJoin(mapValues(m)) AS e FROM format(Values, 'm Map(String, String)', concat('(', {value}, ')'))"  # noqa: S608, E501
        else:
            sql = f"SELECT {value} AS e"
        # (a session's connection may hold filters already: not for this query)
        sql += " SETTINGS additional_result_filter = '', additional_table_filters = {}"
        out = conn.query(sql, "JSONEachRow").data.decode()
        for line in out.splitlines():
            expr = json.loads(line)["e"]
            if expr.strip():
                inspect(conn, f"SELECT ({expr}\n)", off_host)


def check_reader(stmt: Statement) -> None:
    """What engine-level readonly=1 lets through but a read-only user of a ClickHouse server
    could not do here: every engine connection is the engine's one user, so KILL QUERY would
    reach the queries of every HTTP user (a server asks the KILL QUERY grant for those)."""
    if stmt.kills:
        raise _denied("KILL QUERY for a read-only user (the queries of other users would match)")


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
