"""Plain-text tables that fit a terminal: columns sized to their content, the widest text
columns shortened (with '...') until the table fits the width."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

GAP = "  "


@dataclass(frozen=True)
class Col:
    header: str
    right: bool = False  # numbers align right
    max: int | None = None  # never wider than this (text is cut)


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."[:width]


def table(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int = 100) -> list[str]:
    """Header, a rule, the rows; indented by two spaces; no line longer than ``width``."""
    widths = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
    widths = [min(w, c.max) if c.max else w for w, c in zip(widths, cols, strict=True)]
    room = width - len(GAP) - len(GAP) * (len(cols) - 1)
    while sum(widths) > room:
        # shorten the widest text column: names can lose their tails, numbers cannot
        text = [i for i, c in enumerate(cols) if not c.right and widths[i] > 6]
        if not text:
            break
        widths[max(text, key=lambda i: widths[i])] -= 1

    def line(cells: Sequence[str]) -> str:
        out = []
        for cell, w, c in zip(cells, widths, cols, strict=True):
            shown = cut(cell, w)
            out.append(shown.rjust(w) if c.right else shown.ljust(w))
        return (GAP + GAP.join(out)).rstrip()

    return [line([c.header for c in cols]), line(["-" * w for w in widths])] + [
        line(r) for r in rows
    ]


def plain(value: Any) -> Any:
    """A ClickHouse value as JSON can carry it (times as ISO-8601 with Z when UTC)."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def text(value: Any) -> str:
    """A value as a table cell."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def results(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Query results (``gpugap sql``) as a table, a JSON array of objects, or CSV."""
    if fmt == "json":
        return json.dumps([dict(zip(columns, map(plain, r), strict=True)) for r in rows], indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(columns)
        for r in rows:
            out.writerow([text(v) for v in r])
        return buf.getvalue().rstrip("\n")
    cells = [[text(v) for v in r] for r in rows]
    numbers = (int, float, Decimal)
    numeric = [
        bool(rows) and all(isinstance(r[i], numbers) for r in rows if r[i] is not None)
        for i in range(len(columns))
    ]
    cols = [Col(c, right=numeric[i], max=40) for i, c in enumerate(columns)]
    n = len(rows)
    return "\n".join([*table(cols, cells, width=10_000), f"({n} row{'s' if n != 1 else ''})"])
