"""The frontend half of what Grafana does to a ClickHouse panel's SQL before the plugin's backend
sees it, ported (the backend half, the $__ macros, is tests/bi/go/macros.go):

1. the panel's interval: Grafana's rangeutil.calculateInterval (@grafana/data
   datetime/rangeutil.ts): the range over the panel's max data points (its width in pixels
   unless set), rounded by roundInterval, and never below the panel's "interval" (min
   interval);
2. CHDatasource.applyTemplateVariables (grafana/clickhouse-datasource v4.20.0,
   src/data/CHDatasource.ts): applyConditionalAll, then getTemplateSrv().replace(sql, scoped,
   this.format), where format joins a multi-value as 'a','b' and leaves a single value as it is.
   $__conditionalAll(phrase, $var) becomes 1=1 when the variable's value is "All" ($__all) or
   empty, else the phrase. templateSrv replaces $var, ${var}, ${var:fmt} and [[var]] of
   dashboard variables and of the panel's scoped variables ($__interval, $__interval_ms) and
   the range's $__from/$__to; any other $name is left alone, so $__timeFilter(...) and
   $__fromTime go through to the backend. "All" with no custom all value is every option's
   value (a custom all value is inserted as it is, unformatted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

ALL = "$__all"

# roundInterval's thresholds (ms): below the first number, the second
_ROUND = [
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
    (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000),
    (45000, 30000), (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000),
    (1050000, 900000), (1500000, 1200000), (2700000, 1800000), (5400000, 3600000),
    (9000000, 7200000), (16200000, 10800000), (32400000, 21600000), (86400000, 43200000),
    (172800000, 86400000), (604800000, 86400000), (1814400000, 604800000),
    (3628800000, 2592000000),
]  # fmt: skip
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000, "w": 604800000,
             "M": 2592000000, "y": 31536000000}  # fmt: skip


def round_interval(ms: float) -> int:
    for below, value in _ROUND:
        if ms < below:
            return value
    return 31536000000


def interval_ms(text: str) -> int:
    """Grafana's interval strings ("1h", "30s", ">5m"): describe_interval."""
    m = re.fullmatch(r">?(\d+(?:\.\d+)?)(ms|s|m|h|d|w|M|y)", text.strip())
    if not m:
        raise ValueError(f"not a Grafana interval: {text!r}")
    return int(float(m.group(1)) * _UNITS_MS[m.group(2)])


def calculate_interval(start: datetime, end: datetime, max_data_points: int,
                       min_interval: str | None) -> int:  # fmt: skip
    ms = round_interval((end - start).total_seconds() * 1000 / max_data_points)
    if min_interval:
        ms = max(ms, interval_ms(min_interval))
    return ms


def format_interval(ms: int) -> str:
    """What $__interval says (rangeutil.secondsToHms as Grafana uses it for the panel)."""
    for unit, size in (("y", 31536000000), ("d", 86400000), ("h", 3600000), ("m", 60000),
                       ("s", 1000)):  # fmt: skip
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass
class Variable:
    name: str
    options: list[str] = field(default_factory=list)  # the values its query returned
    current: list[str] | str = field(default_factory=lambda: [ALL])  # multi: a list
    all_value: str | None = None  # the variable's custom all value, if any

    def value(self) -> list[str] | str:
        cur = self.current
        if cur == ALL or (isinstance(cur, list) and ALL in cur):
            return self.all_value if self.all_value is not None else list(self.options)
        return cur


def _macro_args(sql: str, open_paren: int) -> list[str]:
    """CHDatasource.getMacroArgs: split at depth-1 commas, up to the closing parenthesis."""
    args, depth, last = [], 0, 1
    sub = sql[open_paren:]
    for m in re.finditer(r"\(|\)|,", sub):
        tok = m.group(0)
        depth += 1 if tok == "(" else -1 if tok == ")" else 0
        if tok == "," and depth == 1:
            args.append(sub[last : m.end() - 1])
            last = m.end()
        if depth == 0:
            args.append(sub[last : m.end() - 1])
            return args
    return []


def apply_conditional_all(sql: str, variables: dict[str, Variable]) -> str:
    macro = "$__conditionalAll("
    at = sql.rfind(macro)
    while at != -1:
        params = _macro_args(sql, at + len(macro) - 1)
        if len(params) != 2:
            return sql
        phrase = params[0]
        ref = re.search(r"(?<=\$\{)[\w\d]+(?=\})|(?<=\$)[\w\d]+", params[1].strip())
        if ref:
            var = variables.get(ref.group(0))  # unknown: the phrase stays (key?. is undefined)
            if var is not None:
                cur = var.current  # current.value.toString(): a list joins with ","
                if (",".join(cur) if isinstance(cur, list) else cur) in ("", ALL):
                    phrase = "1=1"
        sql = sql.replace(f"{macro}{params[0]},{params[1]})", phrase, 1)
        at = sql.rfind(macro)
    return sql


_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}"
)


def _format(value: list[str] | str) -> str:
    """CHDatasource.format."""
    if isinstance(value, list):
        return "'" + "','".join(value) + "'"
    return value


def replace(sql: str, variables: dict[str, Variable], scoped: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in scoped:
            return scoped[name]
        var = variables.get(name)
        if var is None:
            return m.group(0)
        if fmt:
            raise NotImplementedError(f"${{{name}:{fmt}}}: only the datasource's format is ported")
        value = var.value()
        if var.all_value is not None and value is var.all_value:
            return value
        return _format(value)

    return _VARIABLE.sub(one, sql)


def panel_sql(raw: str, variables: dict[str, Variable], start: datetime, end: datetime,
              interval: int) -> str:  # fmt: skip
    """The rawSql the frontend sends to the backend for this panel."""
    scoped = {
        "__interval": format_interval(interval),
        "__interval_ms": str(interval),
        "__from": str(int(start.timestamp() * 1000)),
        "__to": str(int(end.timestamp() * 1000)),
    }
    return replace(apply_conditional_all(raw, variables), variables, scoped)
