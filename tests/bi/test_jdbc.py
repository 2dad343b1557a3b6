"""ClickHouse JDBC (com.clickhouse:clickhouse-jdbc 0.9.9 `all` and 0.10.0), what DBeaver,
Metabase and Tableau load: once with default properties, once with the properties Metabase's
ClickHouse driver sets (metabase-clickhouse-driver, connection-details->spec*)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bi.conftest import TYPES, Account, Warehouse, built, ok, refused, run_json
from tests.harness import bi_drivers as drivers

pytestmark = pytest.mark.timeout(300)
METABASE_TABLE_TYPES = ",".join(
    ["TABLE", "VIEW", "FOREIGN TABLE", "REMOTE TABLE", "DICTIONARY", "MATERIALIZED VIEW",
     "MEMORY TABLE", "LOG TABLE"]
)  # fmt: skip


@pytest.fixture(params=drivers.JDBC_VERSIONS)
def classpath(request: pytest.FixtureRequest) -> str:
    """The driver version; run() builds (or reuses) it, so a failed build fails the test."""
    return str(request.param)


@pytest.fixture(params=["default", "metabase"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(classpath: str, mode: str, wh: Warehouse, account: Account,
        steps: list[list[str]]) -> list[dict[str, Any]]:  # fmt: skip
    cp = str(built(lambda: drivers.jdbc(classpath)))
    url = f"jdbc:clickhouse://{wh.host}:{wh.port}/{wh.database}"
    script = "".join("\t".join(s) + "\n" for s in steps)
    out = run_json(
        ["java", "-Xss4m", "-XX:TieredStopAtLevel=1", "-cp", cp, "BiCheck", mode, url,
         account.name, account.password],
        script, "the JDBC program",
    )  # fmt: skip
    assert len(out) == len(steps), out
    return out


def table(step: dict[str, Any]) -> list[dict[str, str | None]]:
    """A result set as dicts by column label."""
    ok(step)
    return [dict(zip(step["columns"], r, strict=True)) for r in step["rows"]]


def test_connect_and_product(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    conn, product, version = run(classpath, mode, warehouse, account, [
        ["connect"], ["meta.product"], ["statement", "SELECT version()"],
    ])  # fmt: skip
    ok(conn)
    assert conn["closed"] == "false"
    ok(product)
    assert product["product_name"] == "ClickHouse"
    assert int(product["major"]) >= 20
    [[v]] = ok(version)["rows"]
    assert product["product_version"] == v


def test_metadata_browsing(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    """The schema tree: getCatalogs/getSchemas, getTables (as Metabase asks: schema pattern,
    its table types; by default: the database as the catalog), getColumns."""
    db = warehouse.database
    where = ["", db]  # jdbc-v2 reports a database as a schema (getCatalogs is empty)
    types = METABASE_TABLE_TYPES if mode == "metabase" else ""
    cats, schemas, tables, cols = run(classpath, mode, warehouse, account, [
        ["meta.catalogs"], ["meta.schemas"],
        ["meta.tables", *where, "%", types],
        ["meta.columns", *where, "bi_types"],
    ])  # fmt: skip
    names = {r.get("TABLE_CAT") for r in table(cats)} | {
        r.get("TABLE_SCHEM") for r in table(schemas)
    }
    assert db in names
    kinds = {r["TABLE_NAME"]: r["TABLE_TYPE"] for r in table(tables) if r["TABLE_SCHEM"] == db}
    assert {v: "VIEW" for v in warehouse.views}.items() <= kinds.items()
    assert kinds.get("bi_types") == "TABLE" and kinds.get("gpu_minutes") == "TABLE"
    got = [(r["COLUMN_NAME"], r["TYPE_NAME"]) for r in table(cols)]
    assert got == list(TYPES.items())
    nullable = {r["COLUMN_NAME"]: r["IS_NULLABLE"] for r in table(cols)}
    assert nullable["n"] == "YES" and nullable["lc"] == "NO"


def test_prepared_statement(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    db = warehouse.database
    lit, where, view = run(classpath, mode, warehouse, account, [
        ["query", "SELECT ? AS s, ? AS n, ? AS t", "s:it's \\ ok", "i:42",
         "ts:2024-05-01 10:00:00"],
        ["query", f"SELECT lc, s FROM {db}.bi_types WHERE lc = ? AND s > ?", "s:b", "d:1.0"],
        ["query", f"SELECT count() AS c FROM {db}.v_capacity_gap WHERE cluster = ?", "s:x"],
    ])  # fmt: skip
    [[s, n, t]] = ok(lit)["rows"]
    assert (s, n) == ("it's \\ ok", "42")
    assert t.startswith("2024-05-01") and "10:00:00" in t
    assert ok(where)["rows"] == [["b", "4.0"]]
    assert ok(view)["rows"] == [["0"]] and view["types"] == ["UInt64"]


def test_every_view(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    """SELECT from every view the migrations create: the columns the server says it has."""
    db = warehouse.database
    steps = [["statement", f"SELECT * FROM {db}.{v} LIMIT 5"] for v in warehouse.views]
    results = run(classpath, mode, warehouse, account, steps)
    bad = {}
    for view, res in zip(warehouse.views, results, strict=True):
        expected = warehouse.columns(view)
        if res.get("error"):
            bad[view] = res["error"]
        elif list(zip(res["columns"], res["types"], strict=True)) != expected:
            bad[view] = (
                f"columns {list(zip(res['columns'], res['types'], strict=True))} != {expected}"
            )
    assert not bad, "\n".join(f"{v}: {e}" for v, e in bad.items())


def test_typed_reads(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    db = warehouse.database
    [res] = run(classpath, mode, warehouse, account, [
        ["statement", f"SELECT ts, lc, n, tags, s FROM {db}.bi_types ORDER BY ts"],
    ])  # fmt: skip
    ok(res)
    assert dict(zip(res["columns"], res["types"], strict=True)) == TYPES
    [a, b] = res["rows"]
    assert a[0].startswith("2024-05-01") and "10:00:00.25" in a[0]
    assert a[1:] == ["a", "1.5", "x|y", "2.5"]
    assert b[1:] == ["b", None, "", "4.0"]


def test_metabase_probes(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    """The statements Metabase's driver runs on its own (cloud check, timezone, version,
    can-connect?)."""
    cloud, tz, ver, exists = run(classpath, mode, warehouse, account, [
        ["statement", "SELECT value='1' FROM system.settings WHERE name='cloud_mode'"],
        ["statement", "SELECT timezone() AS tz"],
        ["statement", "WITH s AS (SELECT version() AS ver, splitByChar('.', ver) AS verSplit) "
                      "SELECT s.ver, toInt32(verSplit[1]), toInt32(verSplit[2]) FROM s"],
        ["query", "SELECT count(*) > 0 FROM system.databases WHERE name = ?",
         f"s:{warehouse.database}"],
    ])  # fmt: skip
    assert ok(cloud)["rows"] in ([], [["false"]], [["0"]])
    assert ok(tz)["rows"] in ([["UTC"]], [["Etc/UTC"]])
    [[v, major, minor]] = ok(ver)["rows"]
    assert v.startswith(f"{major}.{minor}.")
    assert ok(exists)["rows"] in ([["true"]], [["1"]])


def test_execute_batch(classpath: str, mode: str, warehouse: Warehouse, account: Account):
    db = warehouse.database
    _, *adds, done, back = run(classpath, mode, warehouse, account, [
        ["prepare", f"INSERT INTO {db}.bi_insert (id, name, at) VALUES (?, ?, ?)"],
        ["addbatch", "i:1", "s:one", "ts:2024-05-01 10:00:00"],
        ["addbatch", "i:2", "s:two's", "ts:2024-05-01 10:01:00"],
        ["addbatch", "i:3", "s:", "ts:2024-05-01 10:02:00"],
        ["executebatch"],
        ["statement", f"SELECT id, name FROM {db}.bi_insert ORDER BY id"],
    ])  # fmt: skip
    for a in adds:
        ok(a)
    if not account.writes:
        refused(done, "executeBatch as the reader")
        assert warehouse.count("bi_insert") == 0
        return
    ok(done)
    assert [int(c) for c in done["batch_counts"]] in ([1, 1, 1], [-2, -2, -2])
    assert ok(back)["rows"] == [["1", "one"], ["2", "two's"], ["3", ""]]
    assert warehouse.count("bi_insert") == 3
