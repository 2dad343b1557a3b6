"""Who sees what, enforced by the engine (warehouse/embedded/scopes.py): BI users scoped to a
team or a person, and the X-Gpugap-Scope header that narrows any reader, against the
hand-computed estate of tests/harness/scoped_warehouse.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpugap.warehouse.client import connect
from tests.harness.scoped_warehouse import (
    JOBS,
    ScopedWarehouse,
    allocated_h,
    consumed_h,
    scoped_warehouse,
)

pytestmark = pytest.mark.timeout(300)


_KEPT: set[int] = set()


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScopedWarehouse]:
    with scoped_warehouse(tmp_path_factory.mktemp("scoped")) as found:
        _KEPT.add(found.pid)
        yield found


def module_children() -> set[int]:
    return _KEPT  # the module's endpoint


def rows(settings: Any, sql: str, scope: str | None = None) -> list[tuple[Any, ...]]:
    client = connect(settings)
    try:
        extra = {"transport_settings": {"X-Gpugap-Scope": scope}} if scope else {}
        return [tuple(r) for r in client.query(sql, **extra).result_rows]
    finally:
        client.close()


JOBS_SQL = (
    "SELECT allocation_id, round(sum(allocated_gpu_h), 6), round(sum(consumed_gpu_h), 6) "
    "FROM v_capacity_gap_daily WHERE allocation_id != '' GROUP BY allocation_id ORDER BY 1"
)


def expected(*owners: str) -> list[tuple[Any, ...]]:
    return [
        (f"slurm/c/{j.job_id}", round(allocated_h(j), 6), round(consumed_h(j), 6))
        for j in JOBS
        if j.owner in owners
    ]


def test_the_admin_and_the_reader_see_every_team(estate: ScopedWarehouse) -> None:
    everyone = expected("alice", "bob", "carol")
    assert rows(estate.admin, JOBS_SQL) == everyone
    assert rows(estate.reader, JOBS_SQL) == everyone


def test_a_teams_bi_user_sees_its_team_only_in_every_table_and_view(
    estate: ScopedWarehouse,
) -> None:
    vision = estate.as_user("vision-bi")
    assert rows(vision, JOBS_SQL) == expected("alice", "bob")
    assert rows(estate.as_user("nlp-bi"), JOBS_SQL) == expected("carol")
    for table in ("gpu_minutes", "gpu_hours", "gpu_days", "allocations"):
        teams = rows(vision, f"SELECT DISTINCT team FROM {table}")
        assert teams == [("vision",)], table
    # what is no team's: none of it (a raw record and a node's allocations, which the reader sees)
    admin = connect(estate.admin)
    try:
        admin.command("INSERT INTO dead_letters (reason) VALUES ('a bad record of nlp')")
        admin.command(
            "INSERT INTO node_capacity (node, allocation_ids) VALUES ('n3', ['slurm/c/201'])"
        )
    finally:
        admin.close()
    for table in ("node_capacity", "dead_letters"):
        assert rows(estate.reader, f"SELECT count() > 0 FROM {table}") == [(1,)]
        assert rows(vision, f"SELECT count() FROM {table}") == [(0,)]


def test_a_person_sees_their_own_jobs_and_their_teams_totals(estate: ScopedWarehouse) -> None:
    alice = estate.as_user("alice-bi")
    assert rows(alice, JOBS_SQL) == expected("alice")
    team = rows(
        alice,
        "SELECT team, round(sum(allocated_gpu_h), 6), round(sum(consumed_gpu_h), 6), "
        "sum(allocations) FROM v_team_daily GROUP BY team",
    )
    vision = [j for j in JOBS if j.team == "vision"]
    assert team == [
        (
            "vision",
            round(sum(allocated_h(j) for j in vision), 6),
            round(sum(consumed_h(j) for j in vision), 6),
            len(vision),
        )
    ]


def test_the_header_narrows_a_reader_and_never_widens_a_scoped_user(
    estate: ScopedWarehouse,
) -> None:
    assert rows(estate.reader, JOBS_SQL, "team=vision&user=bob") == expected("bob")
    assert rows(estate.reader, JOBS_SQL, "team=nlp") == expected("carol")
    # the admin's request too: scoped, it reads as a scoped reader
    assert rows(estate.admin, JOBS_SQL, "team=nlp") == expected("carol")
    assert rows(estate.as_user("alice-bi"), JOBS_SQL, "team=vision&user=alice") == expected("alice")
    with pytest.raises(DatabaseError, match="scoped to team 'vision'"):
        rows(estate.as_user("alice-bi"), JOBS_SQL, "team=nlp")
    with pytest.raises(DatabaseError, match="scoped to team 'vision'"):
        rows(estate.as_user("vision-bi"), JOBS_SQL, "team=vision&user=carol")
    with pytest.raises(DatabaseError, match="names one team"):
        rows(estate.reader, JOBS_SQL, "team=a&role=admin")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count() FROM {other}.gpu_days",
        "SELECT count() FROM merge('{other}', 'gpu_days')",
        "SELECT count() FROM loop('{other}', 'gpu_days') LIMIT 1",
        "SELECT count() FROM gpu_days WHERE allocation_id IN (SELECT allocation_id FROM "
        "{other}.gpu_days)",
        "USE {other}",
    ],
)
def test_a_scoped_reader_reads_no_other_database(estate: ScopedWarehouse, sql: str) -> None:
    admin = connect(estate.admin)
    other = f"{estate.admin.database}_copy"
    try:
        admin.command(f"CREATE DATABASE IF NOT EXISTS {other}")
        admin.command(
            f"CREATE TABLE IF NOT EXISTS {other}.gpu_days ENGINE = MergeTree ORDER BY tuple() "
            f"AS SELECT * FROM gpu_days"
        )
    finally:
        admin.close()
    assert rows(estate.reader, f"SELECT count() FROM {other}.gpu_days")[0][0] > 0
    with pytest.raises(DatabaseError, match="Not enough privileges"):
        rows(estate.as_user("vision-bi"), sql.format(other=other))


def test_a_scoped_reader_cannot_turn_its_scope_or_readonly_off(estate: ScopedWarehouse) -> None:
    vision = estate.as_user("vision-bi")
    for sql in (
        "SELECT count() FROM gpu_days SETTINGS log_comment = 'gpugap:admin:x'",
        "SET log_comment = 'gpugap:admin:x'",
        "INSERT INTO team_days (team) VALUES ('nlp')",
    ):
        with pytest.raises(DatabaseError):
            rows(vision, sql)
    client = connect(vision)
    try:
        with pytest.raises(DatabaseError):
            client.query("SELECT 1", settings={"readonly": 0})
        with pytest.raises(DatabaseError, match="database"):
            client.query("SELECT 1", settings={"database": "system"})
    finally:
        client.close()
    assert rows(vision, "SELECT DISTINCT team FROM gpu_days") == [("vision",)]


def test_every_table_of_the_warehouse_has_a_scope_policy(estate: ScopedWarehouse) -> None:
    from gpugap.warehouse.embedded.scopes import POLICIES, UNSCOPED

    tables = {
        name
        for (name,) in rows(
            estate.admin,
            "SELECT name FROM system.tables WHERE database = currentDatabase() "
            "AND engine NOT LIKE '%View'",
        )
    }
    assert tables - set(POLICIES) == set(), "tables with no row policy for scoped readers"
    # and the engine holds each: a table a scoped reader may not see reads empty to it
    vision = estate.as_user("vision-bi")
    for table, rule in sorted(POLICIES.items()):
        if table in tables and rows(estate.admin, f"SELECT count() FROM {table}")[0][0]:
            seen = rows(vision, f"SELECT count() FROM {table}")[0][0]
            assert (seen == 0) == (rule == UNSCOPED), table
