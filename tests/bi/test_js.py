"""@clickhouse/client (npm 1.23.1), the official Node client: ping, JSONEachRow queries,
query_params (server-side {name:Type}), insert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.bi.conftest import Account, Warehouse, built, ok, refused, run_json
from tests.harness import bi_drivers as drivers

pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).parent / "js" / "bicheck.cjs"


def run(wh: Warehouse, account: Account,
        steps: list[dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    node = shutil.which("node")
    if not node:
        pytest.fail("node is not installed")
    node_modules = built(drivers.js_client) / "node_modules"
    script = {"url": wh.url, "username": account.name, "password": account.password,
              "database": wh.database, "steps": steps}  # fmt: skip
    out = run_json(
        [node, str(SCRIPT)],
        json.dumps(script),
        "the @clickhouse/client program",
        env={"NODE_PATH": str(node_modules)},
    )
    assert len(out) == len(steps), out
    return out


def test_ping(warehouse: Warehouse, account: Account):
    [ping] = run(warehouse, account, [{"op": "ping"}])
    assert ok(ping)["success"] is True


def test_query_json_each_row(warehouse: Warehouse, account: Account):
    typed, view = run(warehouse, account, [
        {"op": "query", "query": "SELECT ts, lc, n, tags, s FROM bi_types ORDER BY ts"},
        {"op": "query", "query": "SELECT * FROM v_capacity_gap LIMIT 10"},
    ])  # fmt: skip
    assert ok(typed)["rows"] == [
        {"ts": "2024-05-01 10:00:00.250", "lc": "a", "n": 1.5, "tags": ["x", "y"], "s": 2.5},
        {"ts": "2024-05-01 10:05:00.000", "lc": "b", "n": None, "tags": [], "s": 4},
    ]
    assert ok(view)["rows"] == []


def test_query_params(warehouse: Warehouse, account: Account):
    [res] = run(warehouse, account, [
        {"op": "query", "query": "SELECT lc, {label:String} AS label, {when:DateTime} AS w "
         "FROM bi_types WHERE lc = {lc:String} AND s >= {min:Float64}",
         "query_params": {"lc": "b", "min": 3.5, "label": "it's \\ ok\t!",
                          "when": "2024-05-01 10:00:00"}},
    ])  # fmt: skip
    assert ok(res)["rows"] == [{"lc": "b", "label": "it's \\ ok\t!", "w": "2024-05-01 10:00:00"}]


def test_insert(warehouse: Warehouse, account: Account):
    ins, back = run(warehouse, account, [
        {"op": "insert", "table": "bi_insert", "values": [
            {"id": 1, "name": "one", "at": "2024-05-01 10:00:00"},
            {"id": 2, "name": "two's", "at": "2024-05-01 10:01:00"}]},
        {"op": "query", "query": "SELECT id, name, at FROM bi_insert ORDER BY id"},
    ])  # fmt: skip
    if not account.writes:
        refused(ins, "insert as the reader")
        assert ok(back)["rows"] == []
        return
    assert ok(ins)["executed"] is True
    assert ins["summary"] and ins["summary"]["written_rows"] == "2"
    assert ok(back)["rows"] == [
        {"id": 1, "name": "one", "at": "2024-05-01 10:00:00"},
        {"id": 2, "name": "two's", "at": "2024-05-01 10:01:00"},
    ]
