"""Just enough ClickHouse SQL lexing for the endpoint to route a request, and for migrations to
split statements: comments, quotes, the leading keyword, a trailing
FORMAT clause and where INSERT data starts. It decides nothing about privileges: the engine
parses every statement that runs (policy.py), and INSERT data only ever reaches the engine's
format parsers, never its SQL parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FORMAT_AT_END = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*$", re.IGNORECASE)
_QUOTED_FORMAT_AT_END = re.compile(r"\bFORMAT\s+`( +)`\s*;?\s*$", re.IGNORECASE)
_INSERT_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)|\b(VALUES)\b", re.IGNORECASE)


def mask(sql: str) -> str:
    """The same text with comments and quoted literals blanked out (same length), so regexes
    and splits on it never match inside a string or a comment."""
    out = list(sql)
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        elif sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = " " * (j - i)
            i = j
        else:
            i += 1
    return "".join(out)


def first_keyword(sql: str) -> str:
    m = re.match(r"\s*\(*\s*([A-Za-z]+)", mask(sql))
    return m.group(1).upper() if m else ""


def trailing_format(sql: str) -> str | None:
    """The name after a trailing FORMAT, also when quoted as the engine writes a keyword
    (``FORMAT `Values```)."""
    m = _FORMAT_AT_END.search(mask(sql))
    if m:
        return m.group(1)
    quoted = _QUOTED_FORMAT_AT_END.search(mask(sql))
    if quoted:
        name = sql[quoted.start(1) : quoted.end(1)]
        return name if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) else None
    return None


def strip_trailing_format(sql: str) -> str:
    """``sql`` without its trailing ``FORMAT name`` (and semicolon), if it has one."""
    m = _FORMAT_AT_END.search(mask(sql))
    return sql[: m.start()].rstrip() if m else strip_trailing_semicolon(sql)


def strip_trailing_semicolon(sql: str) -> str:
    masked = mask(sql).rstrip()
    if masked.endswith(";"):
        return sql[: len(masked) - 1].rstrip()
    return sql.rstrip()


@dataclass(frozen=True)
class InsertWithData:
    statement: str  # 'INSERT INTO t (cols)' without the FORMAT clause
    fmt: str
    data: bytes  # everything after the format name's line


def split_insert(text: bytes) -> InsertWithData | None:
    """``INSERT ... FORMAT X\\n<data>`` or ``INSERT ... VALUES <data>`` in one body -> its
    parts; None for other statements."""
    head = text[:65536].decode("utf-8", errors="replace")
    if first_keyword(head) != "INSERT":
        return None
    m = _INSERT_FORMAT.search(mask(head))
    if m is None:
        return None
    if m.group(2):  # VALUES: the data starts right after the keyword
        data = text[len(head[: m.end()].encode()) :]
        return InsertWithData(head[: m.start()].strip(), "Values", data)
    # ClickHouse's rule: data starts after the first newline that follows the format name,
    # or, if data follows on the same line, at its first non-blank byte.
    pos = len(head[: m.end()].encode())
    while pos < len(text) and text[pos : pos + 1] in (b" ", b"\t", b"\r"):
        pos += 1
    if text[pos : pos + 1] == b"\n":
        pos += 1
    return InsertWithData(head[: m.start()].strip(), m.group(1), text[pos:])


def insert_statement(sql: str) -> tuple[str, str] | None:
    """An INSERT whose data comes separately (query in the URL, data in the body):
    (statement without FORMAT, format) or None."""
    if first_keyword(sql) != "INSERT":
        return None
    m = _INSERT_FORMAT.search(mask(sql))
    if m is None or sql[m.end() :].strip():
        return None
    return sql[: m.start()].strip(), m.group(1) or "Values"
