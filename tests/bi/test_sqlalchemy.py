"""Superset's path: SQLAlchemy over clickhouse-connect's dialect (clickhousedb://): the
inspector calls its dataset editor makes, and pandas.read_sql on a warehouse view."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.bi.conftest import TYPES, Account, Warehouse

sqlalchemy = pytest.importorskip("sqlalchemy")  # in the test extra (pyproject.toml)
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def engine(warehouse: Warehouse, account: Account) -> Iterator[Any]:
    url = (f"clickhousedb://{quote(account.name)}:{quote(account.password, safe='')}@"
           f"{warehouse.host}:{warehouse.port}/{warehouse.database}")  # fmt: skip
    eng = sqlalchemy.create_engine(url)
    try:
        yield eng
    finally:
        eng.dispose()


def test_inspector(engine: Any, warehouse: Warehouse, account: Account):
    insp = sqlalchemy.inspect(engine)
    db = warehouse.database
    assert db in insp.get_schema_names()
    tables = set(insp.get_table_names(schema=db))
    assert {"bi_types", "bi_insert", "gpu_minutes", "gpu_hours"} <= tables
    assert set(insp.get_view_names(schema=db)) == set(warehouse.views)
    cols = insp.get_columns("bi_types", schema=db)
    assert [c["name"] for c in cols] == list(TYPES)
    assert {c["name"]: c["nullable"] for c in cols}["n"] is True
    assert {c["name"]: c["nullable"] for c in cols}["lc"] is False
    assert insp.has_table("v_capacity_gap", schema=db)
    view_cols = [c["name"] for c in insp.get_columns("v_capacity_gap", schema=db)]
    assert view_cols == [c for c, _ in warehouse.columns("v_capacity_gap")]


def test_read_sql_on_views(engine: Any, warehouse: Warehouse, account: Account):
    import pandas as pd

    bad = {}
    for view in warehouse.views:
        try:
            df = pd.read_sql(f"SELECT * FROM {view} LIMIT 10", engine)
        except Exception as exc:
            bad[view] = f"{type(exc).__name__}: {exc}"
            continue
        expected = [c for c, _ in warehouse.columns(view)]
        if list(df.columns) != expected:
            bad[view] = f"columns {list(df.columns)} != {expected}"
    assert not bad, "\n".join(f"{v}: {e}" for v, e in bad.items())


def test_read_sql_typed(engine: Any, warehouse: Warehouse, account: Account):
    import pandas as pd

    df = pd.read_sql(
        sqlalchemy.text("SELECT ts, lc, n, tags, s FROM bi_types WHERE s > :min ORDER BY ts"),
        engine, params={"min": 1.0},
    )  # fmt: skip
    assert list(df["lc"]) == ["a", "b"]
    assert str(df["ts"][0]).startswith("2024-05-01 10:00:00.25")
    assert df["n"][0] == 1.5 and pd.isna(df["n"][1])
    assert list(df["tags"][0]) == ["x", "y"] and list(df["s"]) == [2.5, 4.0]


def test_write(engine: Any, warehouse: Warehouse, account: Account):
    stmt = sqlalchemy.text(
        "INSERT INTO bi_insert (id, name, at) VALUES (1, 'one', '2024-05-01 10:00:00')"
    )
    if not account.writes:
        with (
            pytest.raises(sqlalchemy.exc.DBAPIError, match=r"\b164\b|READONLY|readonly"),
            engine.begin() as conn,
        ):
            conn.execute(stmt)
        assert warehouse.count("bi_insert") == 0
        return
    with engine.begin() as conn:
        conn.execute(stmt)
    assert warehouse.count("bi_insert") == 1
