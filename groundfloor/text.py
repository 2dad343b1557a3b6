"""Untrusted text from records made harmless for people and for SQL: one line, bounded, no
control or invisible characters. The sinks' messages and the application's digest both use it."""

from __future__ import annotations

import re
import unicodedata

NAME_MAX = 64

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: format (bidi, zero-width), surrogate, private-use and line/paragraph separator characters
_HIDDEN = frozenset({"Cf", "Cs", "Co", "Zl", "Zp"})


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: longer ones end in "…"."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def clean(text: str | None, limit: int = NAME_MAX) -> str:
    """An untrusted value as one harmless line of at most ``limit`` characters."""
    if not text:
        return ""
    out = []
    for ch in text[: limit * 4]:  # enough to fill the bound after dropping characters
        if _CONTROL.match(ch) or unicodedata.category(ch) in _HIDDEN:
            out.append(" ")
        else:
            out.append(ch)
    line = " ".join("".join(out).split())  # one line, single spaces
    return cut(line.replace("://", "[:]//"), limit)


def sql_string(value: str) -> str:
    """A ClickHouse string literal for exactly ``value``, on one harmless line: backslash and
    quote escaped, control and format characters (and the ``:`` of ``://``) as ``\\xHH``
    bytes of their UTF-8."""
    out = []
    for ch in value:
        if ch in "\\'":
            out.append("\\" + ch)
        elif _CONTROL.match(ch) or unicodedata.category(ch) in _HIDDEN:
            out.append("".join(f"\\x{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "'" + "".join(out).replace("://", "\\x3A//") + "'"
