"""deploy/clickhouse/row-policies.sql, the roles and row policies for a real ClickHouse server,
means what the embedded endpoint enforces (warehouse/embedded/scopes.py).

Filled in for one team and one person, every statement parses with the engine's own parser
(chDB's ``formatQuerySingleLine``, which parses without running: chDB keeps no roles); every
table of ``scopes.POLICIES`` has exactly one policy for the unscoped, one for a team's role and
one for a person's; and each policy's condition, run by the admin as a WHERE over a loaded
estate, keeps exactly the rows the endpoint shows the BI user of that scope
(tests/harness/scoped_warehouse.py). No ClickHouse server runs here, so what a server does
with the roles themselves is not tested.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from gpugap.warehouse.client import connect
from gpugap.warehouse.embedded.scopes import POLICIES, UNSCOPED
from tests.harness.scoped_warehouse import ScopedWarehouse, scoped_warehouse

SQL = Path(__file__).resolve().parents[2] / "deploy" / "clickhouse" / "row-policies.sql"
PLACEHOLDERS = ("{team}", "{user}", "{team_password}", "{user_password}")
_POLICY = re.compile(r"^CREATE ROW POLICY OR REPLACE (\S+) ON (.+?) FOR SELECT USING (.+) TO (.+)$")

_KEPT: set[int] = set()


def module_children() -> set[int]:
    return _KEPT  # the module's endpoint


class Policy(NamedTuple):
    tables: tuple[str, ...]
    condition: str
    to: str


def filled(team: str, user: str) -> str:
    text = SQL.read_text()
    for name, value in zip(
        PLACEHOLDERS, (team, user, "team-password-0", "user-password-0"), strict=True
    ):
        text = text.replace(name, value)
    return text


def statements(text: str) -> list[str]:
    """The file's statements, without comments (no string in it holds ``--`` or ``;``)."""
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    return [s.strip() for s in code.split(";") if s.strip()]


@cache
def _session() -> Any:
    from chdb import session

    return session.Session()


def formatted(sql: str) -> str:
    """``sql`` parsed and printed on one line by the engine's parser; raises when it does not
    parse."""
    # a parameter's value is read in the escaped form: a line break would end it
    escaped = sql.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    found = _session().query(
        "SELECT formatQuerySingleLine({q:String})", "RawBLOB", params={"q": escaped}
    )
    return str(found.bytes().decode())


def policies(team: str = "vision", user: str = "alice") -> dict[str, list[Policy]]:
    """Each role's policies (``TO`` as the parser prints it), from the filled file."""
    out: dict[str, list[Policy]] = {}
    for statement in statements(filled(team, user)):
        line = formatted(statement)
        if line.startswith("CREATE ROW POLICY"):
            match = _POLICY.match(line)
            assert match, line
            tables = tuple(t.strip() for t in match[2].split(","))
            assert all(t.startswith("gpugap.") for t in tables), line
            policy = Policy(tuple(t.removeprefix("gpugap.") for t in tables), match[3], match[4])
            out.setdefault(policy.to, []).append(policy)
    return out


ROLES = {
    "unscoped": "ALL EXCEPT gpugap_scoped",
    "team": "gpugap_team_vision",
    "person": "gpugap_person_alice",
}


def test_every_statement_parses_once_filled() -> None:
    text = filled("ml-vision", "alice.b")
    assert not [p for p in PLACEHOLDERS if p in text]
    found = statements(text)
    assert len(found) > 20
    for statement in found:
        formatted(statement)  # raises on a syntax error
    # the parser does refuse what is not ClickHouse's SQL
    with pytest.raises(RuntimeError, match="Syntax error"):
        formatted("CREATE ROW POLICY p ON gpugap.gpu_days USING team = 'x' TO")


def test_every_table_has_one_policy_for_the_unscoped_a_team_and_a_person() -> None:
    found = policies()
    assert set(found) == set(ROLES.values())
    for role in ROLES.values():
        tables = [t for p in found[role] for t in p.tables]
        assert sorted(tables) == sorted(set(tables)), f"{role}: a table named twice"
        assert set(tables) == set(POLICIES), role
    assert {p.condition for p in found[ROLES["unscoped"]]} == {"1"}


def test_a_scoped_role_is_marked_reads_only_its_database_and_holds_its_users_select() -> None:
    grants = [formatted(s) for s in statements(filled("vision", "alice")) if s.startswith("GRANT")]
    for role in ("gpugap_team_vision", "gpugap_person_alice"):
        assert f"GRANT gpugap_scoped TO {role}" in grants
        assert f"GRANT SELECT ON gpugap.* TO {role}" in grants
    # users get their role and nothing else; the marker goes to roles only
    assert "GRANT gpugap_team_vision TO `vision-bi`" in grants
    assert "GRANT gpugap_person_alice TO `alice-bi`" in grants
    assert len(grants) == 6, grants


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScopedWarehouse]:
    with scoped_warehouse(tmp_path_factory.mktemp("row-policies")) as found:
        _KEPT.add(found.pid)
        seed(found)
        yield found


def seed(estate: ScopedWarehouse) -> None:
    """Rows of both teams (and of no team) in the tables the sink left empty."""
    admin = connect(estate.admin)
    try:
        for table in ("alerts", "alert_deliveries"):
            admin.command(
                f"INSERT INTO {table} (alert_id, owner, team) VALUES ('a1', 'alice', 'vision'), "
                "('a2', 'bob', 'vision'), ('a3', 'carol', 'nlp'), ('a4', 'alice', 'nlp')"
            )
        admin.command(
            "INSERT INTO transfers (event_id, owner, team) VALUES ('t1', 'alice', 'vision'), "
            "('t2', 'bob', 'vision'), ('t3', 'carol', 'nlp'), ('t4', 'alice', 'nlp')"
        )
        admin.command(
            "INSERT INTO recommendations (id, user, account, namespace) VALUES "
            "('r1', 'alice', 'vision', ''), ('r2', 'bob', 'other', ''), ('r3', 'carol', 'nlp', ''),"
            " ('r4', '', '', 'vision'), ('r5', '', '', 'nlp'), ('r6', 'zed', 'misc', 'x')"
        )
        admin.command(
            "INSERT INTO recommendation_decisions (id, decision) VALUES ('r1', 'accepted'), "
            "('r2', 'rejected'), ('r3', 'accepted'), ('r4', 'accepted'), ('r5', 'accepted'), "
            "('r6', 'accepted'), ('r9', 'accepted')"
        )
        for table in POLICIES:  # any other empty table: one row of its columns' defaults
            if admin.query(f"SELECT count() FROM {table}").result_rows[0][0] == 0:
                name, kind = admin.query(
                    "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
                    f"AND table = '{table}' ORDER BY position LIMIT 1"
                ).result_rows[0]
                admin.command(
                    f"INSERT INTO {table} (`{name}`) SELECT defaultValueOfTypeName({{t:String}})",
                    parameters={"t": kind},
                )
    finally:
        admin.close()


def count(settings: Any, sql: str) -> int:
    client = connect(settings)
    try:
        return int(client.query(sql).result_rows[0][0])
    finally:
        client.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("team", "user", "role", "reader"),
    [
        ("vision", "alice", "team", "vision-bi"),
        ("nlp", "carol", "team", "nlp-bi"),
        ("vision", "alice", "person", "alice-bi"),
        ("vision", "alice", "unscoped", "reader"),
    ],
)
def test_each_condition_keeps_the_rows_the_endpoint_shows_that_reader(
    estate: ScopedWarehouse, team: str, user: str, role: str, reader: str
) -> None:
    bi = estate.reader if reader == "reader" else estate.as_user(reader)
    database = estate.admin.database
    to = ROLES[role].replace("vision", team).replace("alice", user)
    seen_some = narrowed = 0
    for policy in policies(team, user)[to]:
        condition = policy.condition.replace("gpugap.", f"{database}.")
        for table in policy.tables:
            total = count(estate.admin, f"SELECT count() FROM {table}")
            assert total > 0, f"{table} is empty: the comparison would prove nothing"
            kept = count(estate.admin, f"SELECT count() FROM {table} WHERE {condition}")
            shown = count(bi, f"SELECT count() FROM {table}")
            assert kept == shown, f"{table}: the file keeps {kept} rows, the endpoint {shown}"
            seen_some += shown > 0
            narrowed += shown < total
            if POLICIES[table] == UNSCOPED and role != "unscoped":
                assert shown == 0, table
    assert seen_some >= 4  # not a vacuous comparison of empty results
    assert (narrowed > 0) == (role != "unscoped")
