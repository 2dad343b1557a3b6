"""Grafana's ClickHouse datasource: clickhouse-go v2.47.0 over HTTP, opened as the plugin
opens it (pkg/plugin/driver.go: Protocol HTTP, gzip; LZ4 as the second mode), and the SQL the
plugin sends for its health check, its schema browser and a panel."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.bi.conftest import T_FROM, T_TO, TYPES, Account, Warehouse, built, ok, refused, run_json
from tests.harness import bi_drivers as drivers

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["gzip", "lz4"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(wh: Warehouse, account: Account, compression: str,
        steps: list[dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    script = {
        "addr": f"{wh.host}:{wh.port}", "user": account.name, "password": account.password,
        "database": "", "compression": compression, "steps": steps,
    }  # fmt: skip
    binary = str(built(drivers.clickhouse_go))
    out = run_json([binary], json.dumps(script), "the clickhouse-go program")
    assert len(out) == len(steps)
    return out


def rows(step: dict[str, Any]) -> list[list[str | None]]:
    return ok(step)["rows"]


def test_health_check(warehouse: Warehouse, account: Account, compression: str):
    """sqlds' CheckHealth: Connect (which pings: SELECT 1) then the plugin's version probe."""
    ping, version, tz = run(warehouse, account, compression, [
        {"op": "ping"},
        {"op": "query", "sql": "SELECT version()"},
        {"op": "query", "sql": "SELECT timezone()"},
    ])  # fmt: skip
    ok(ping)
    assert version["columns"] == ["version()"] and version["types"] == ["String"]
    [[v]] = rows(version)
    assert v and v.split(".")[0].isdigit() and len(v.split(".")) >= 3, v
    assert rows(tz) == [["UTC"]] or rows(tz)[0][0]


def test_schema_browsing(warehouse: Warehouse, account: Account, compression: str):
    """The query builder's database/table/column pickers (src/data/CHDatasource.ts)."""
    db = warehouse.database
    dbs, tables, desc, cols, funcs = run(warehouse, account, compression, [
        {"op": "query", "sql": "SHOW DATABASES"},
        {"op": "query", "sql": f'SHOW TABLES FROM "{db}"'},
        {"op": "query", "sql": f'DESC TABLE "{db}"."bi_types"'},
        {"op": "query", "sql": "SELECT name, type, table FROM system.columns "
                               f"WHERE database IN ('{db}') AND table = 'bi_types'"},
        {"op": "query", "sql": "\n      SELECT\n        name, is_aggregate, case_insensitive, "
         "alias_to, origin, description,\n        syntax, arguments, returned_value, examples, "
         "categories\n      FROM system.functions\n      LIMIT 10000\n    "},
    ])  # fmt: skip
    assert [db] in rows(dbs)
    names = {r[0] for r in rows(tables)}
    assert {"bi_types", "gpu_minutes", *warehouse.views} <= names
    assert desc["columns"][:2] == ["name", "type"]
    assert [(r[0], r[1]) for r in rows(desc)] == list(TYPES.items())
    assert sorted((r[0], r[1], r[2]) for r in rows(cols)) == sorted(
        (n, t, "bi_types") for n, t in TYPES.items()
    )
    fnames = {r[0] for r in rows(funcs)}
    assert {"toStartOfInterval", "sum", "toDateTime"} <= fnames


def test_panel_query(warehouse: Warehouse, account: Account, compression: str):
    """A time-series panel: $__timeInterval(ts) and $__timeFilter(ts) as the plugin expands
    them, over the test's table and over a warehouse view."""
    db = warehouse.database
    panel, view = run(warehouse, account, compression, [
        {"op": "query", "sql":
            f"SELECT toStartOfInterval(toDateTime(ts), INTERVAL 300 second) AS time, lc, "
            f"sum(s) AS total FROM \"{db}\".\"bi_types\" WHERE ts >= toDateTime({T_FROM}) AND "
            f"ts <= toDateTime({T_TO}) GROUP BY time, lc ORDER BY time"},
        {"op": "query", "sql":
            f"SELECT * FROM \"{db}\".\"v_capacity_gap\" WHERE hour >= toDateTime({T_FROM}) "
            f"AND hour <= toDateTime({T_TO}) LIMIT 100"},
    ])  # fmt: skip
    ok(panel), ok(view)
    # toDateTime of a DateTime64(3, 'UTC') keeps its zone, and a server names it in the Native
    # header at clickhouse-go's revision (the engine's revision-0 Native leaves zones out)
    assert panel["types"] == ["DateTime('UTC')", "LowCardinality(String)", "Float64"]
    assert rows(panel) == [
        ["2024-05-01T10:00:00Z", "a", "2.5"],
        ["2024-05-01T10:05:00Z", "b", "4"],
    ]
    assert view["columns"] == [c for c, _ in warehouse.columns("v_capacity_gap")]
    assert rows(view) == []


def test_parameters(warehouse: Warehouse, account: Account, compression: str):
    """clickhouse-go's client-side binding (? positional, @name named) and server-side
    parameters ({name:Type}, sent as param_name)."""
    db = warehouse.database
    pos, named, server = run(warehouse, account, compression, [
        {"op": "query", "sql": "SELECT ? AS s, ? AS n, ? AS t",
         "args": [{"kind": "string", "v": "it's \\ ok"}, {"kind": "int", "v": "42"},
                  {"kind": "time", "v": "2024-05-01T10:00:00Z"}]},
        {"op": "query", "sql": f'SELECT lc FROM "{db}"."bi_types" WHERE lc = @lc',
         "args": [{"kind": "string", "v": "b", "name": "lc"}]},
        {"op": "query", "sql": f'SELECT count() AS c FROM "{db}"."bi_types" '
                               "WHERE lc = {lc:String} AND s > {min:Float64}",
         "params": {"lc": "a", "min": "1"}},
    ])  # fmt: skip
    assert rows(pos) == [["it's \\ ok", "42", "2024-05-01T10:00:00Z"]]
    assert rows(named) == [["b"]]
    assert server["types"] == ["UInt64"] and rows(server) == [["1"]]


def test_typed_scans(warehouse: Warehouse, account: Account, compression: str):
    db = warehouse.database
    [typed] = run(warehouse, account, compression, [
        {"op": "query", "sql": f'SELECT ts, lc, n, tags, s FROM "{db}"."bi_types" ORDER BY ts'},
    ])  # fmt: skip
    ok(typed)
    assert dict(zip(typed["columns"] or [], typed["types"] or [], strict=True)) == TYPES, typed
    assert typed["scan_types"] == ["time.Time", "string", "*float64", "[]string", "float64"]
    assert rows(typed) == [
        ["2024-05-01T10:00:00.25Z", "a", "1.5", '["x","y"]', "2.5"],
        ["2024-05-01T10:05:00Z", "b", None, "[]", "4"],
    ]


def test_batch_insert(warehouse: Warehouse, account: Account, compression: str):
    """PrepareBatch / Append / Send into the test's table; refused for the read-only user."""
    db = warehouse.database
    batch, back = run(warehouse, account, compression, [
        {"op": "batch", "sql": f'INSERT INTO "{db}"."bi_insert"',
         "types": ["uint", "string", "time"],
         "rows": [["1", "one", "2024-05-01T10:00:00Z"], ["2", "two's", "2024-05-01T10:01:00Z"],
                  ["3", "", "2024-05-01T10:02:00Z"]]},
        {"op": "query", "sql": f'SELECT id, name, at FROM "{db}"."bi_insert" ORDER BY id'},
    ])  # fmt: skip
    if not account.writes:
        refused(batch, "PrepareBatch/Send as the reader")
        assert warehouse.count("bi_insert") == 0
        assert rows(back) == []
        return
    ok(batch)
    assert rows(back) == [
        ["1", "one", "2024-05-01T10:00:00Z"],
        ["2", "two's", "2024-05-01T10:01:00Z"],
        ["3", "", "2024-05-01T10:02:00Z"],
    ]
    assert warehouse.count("bi_insert") == 3
