"""`gpugap db migrate --cluster NAME`: every migration for a ClickHouse cluster, parsed by the
engine (no cluster here to run it on: docs/warehouse.md says what that leaves unverified)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.sqllex import mask
from gpugap.warehouse.cluster import cluster_statements, for_cluster
from gpugap.warehouse.embedded.engine import EngineProcess
from gpugap.warehouse.migrate import migrations


@pytest.fixture(scope="module")
def parse(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    engine = EngineProcess(tmp_path_factory.mktemp("parse"))
    conn = engine.connect()
    yield conn.normalize
    conn.close()
    engine.close()


def test_every_statement_parses_and_every_table_is_replicated_behind_a_distributed_one(
    parse,  # type: ignore[no-untyped-def]
) -> None:
    statements = [
        s for s in cluster_statements(migrations(), "gpu_estate") if not s.startswith("--")
    ]
    tables = {
        m.group(1)
        for mig in migrations()
        for s in mig.statements()
        if (m := re.match(r"\s*CREATE TABLE IF NOT EXISTS (\w+)", mask(s)))
    }
    assert {"gpu_minutes", "gpu_hours", "alerts", "idle_policy"} <= tables
    for statement in statements:
        text = parse(statement)  # raises on a syntax error
        assert "ON CLUSTER gpu_estate" in text or text.startswith("INSERT"), text[:80]
    for name in tables:
        local = [s for s in statements if f"EXISTS {name}_local ON CLUSTER" in s]
        front = [s for s in statements if f"EXISTS {name} ON CLUSTER" in s]
        assert len(local) == len(front) == 1, name
        assert "ENGINE = Replicated" in local[0] and f"/{name}_local', '{{replica}}'" in local[0]
        assert f"Distributed(gpu_estate, currentDatabase(), {name}_local, cityHash64(" in front[0]
    views = [s for s in statements if re.match(r"CREATE (OR REPLACE )?VIEW", s)]
    assert views and all(" ON CLUSTER gpu_estate AS" in v for v in views)


def test_the_sharding_key_is_the_sorting_key_so_merging_rows_share_a_shard() -> None:
    sql = (
        "CREATE TABLE IF NOT EXISTS t\n(a String, b UInt8, v UInt64)\n"
        "ENGINE = ReplacingMergeTree(v)\nPARTITION BY b\n"
        "ORDER BY (a, cityHash64(b)) -- why\nSETTINGS index_granularity = 8192"
    )
    local, front = for_cluster(sql, "c1")
    assert (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/t_local', "
        "'{replica}', v)" in local
    )
    assert local.rstrip().endswith("SETTINGS index_granularity = 8192")
    assert front.endswith(
        "Distributed(c1, currentDatabase(), t_local, cityHash64(a, cityHash64(b)))"
    )
    alter = for_cluster("ALTER TABLE t ADD COLUMN IF NOT EXISTS x UInt8", "c1")
    assert alter == [
        "ALTER TABLE t_local ON CLUSTER c1 ADD COLUMN IF NOT EXISTS x UInt8",
        "ALTER TABLE t ON CLUSTER c1 ADD COLUMN IF NOT EXISTS x UInt8",
    ]
    with pytest.raises(ValueError, match="cluster name"):
        cluster_statements([], "prod; DROP")


def test_the_command_prints_it_without_connecting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", "http://127.0.0.1:9")  # nothing listens there
    assert main(["db", "migrate", "--cluster", "prod"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("-- 001_tables\n") and "ReplicatedAggregatingMergeTree" in out
    assert out.count("ON CLUSTER prod") > 20
