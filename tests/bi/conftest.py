"""What every BI-client suite shares: the warehouse of the test (the ``clickhouse`` fixture: a
fresh database with the migrations applied) plus two tables of the test's own, and the two
accounts a BI tool is given (the default user, and the read-only "reader")."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlparse

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from tests.harness import bi_drivers as drivers
from tests.harness.warehouse import READER_PASSWORD

# a table with the types BI tools trip over, and two rows of it
TYPES_DDL = """
CREATE TABLE bi_types
(
    ts DateTime64(3, 'UTC'),
    lc LowCardinality(String),
    n Nullable(Float64),
    tags Array(String),
    s SimpleAggregateFunction(sum, Float64)
)
ENGINE = MergeTree ORDER BY (lc, ts)
"""
TYPES_ROWS = """
INSERT INTO bi_types VALUES
    ('2024-05-01 10:00:00.250', 'a', 1.5, ['x', 'y'], 2.5),
    ('2024-05-01 10:05:00.000', 'b', NULL, [], 4)
"""
TYPES = {
    "ts": "DateTime64(3, 'UTC')",
    "lc": "LowCardinality(String)",
    "n": "Nullable(Float64)",
    "tags": "Array(String)",
    "s": "SimpleAggregateFunction(sum, Float64)",
}
# where the drivers write; the readers must be refused
INSERT_DDL = (
    "CREATE TABLE bi_insert (id UInt32, name String, at DateTime('UTC')) "
    "ENGINE = MergeTree ORDER BY id"
)
# 2024-05-01 09:00:00 .. 11:00:00 UTC, as Grafana's $__timeFilter expands them
T_FROM, T_TO = 1714554000, 1714561200


def warehouse_views() -> list[str]:
    names: set[str] = set()
    pkg = resources.files("gpugap.warehouse.migrations")
    for f in pkg.iterdir():
        if f.name.endswith(".sql"):
            names |= set(re.findall(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)", f.read_text(), re.I))
    return sorted(names)


@dataclass(frozen=True)
class Account:
    name: str
    password: str
    writes: bool  # whether the server must accept its INSERTs


@dataclass
class Warehouse:
    settings: ClickHouseSettings
    host: str
    port: int
    database: str
    views: list[str]
    admin: Any  # a clickhouse-connect client on the test's database (the project's own client)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def count(self, table: str) -> int:
        return int(self.admin.query(f"SELECT count() FROM `{table}`").result_rows[0][0])

    def columns(self, table: str) -> list[tuple[str, str]]:
        rows = self.admin.query(
            "SELECT name, type FROM system.columns WHERE database = {d:String} AND "
            "table = {t:String} ORDER BY position",
            parameters={"d": self.database, "t": table},
        ).result_rows
        return [(r[0], r[1]) for r in rows]


@pytest.fixture(params=["default", "reader"])
def account(request: pytest.FixtureRequest, clickhouse_server: ClickHouseSettings) -> Account:
    if request.param == "default":
        pw = clickhouse_server.password
        return Account(clickhouse_server.user, pw.get_secret_value() if pw else "", True)
    return Account("reader", READER_PASSWORD, False)


@pytest.fixture
def warehouse(clickhouse: ClickHouseSettings) -> Iterator[Warehouse]:
    from gpugap.warehouse.client import connect

    admin = connect(clickhouse)
    try:
        for sql in (TYPES_DDL, TYPES_ROWS, INSERT_DDL):
            admin.command(sql)
        url = urlparse(clickhouse.url)
        yield Warehouse(
            clickhouse, url.hostname or "127.0.0.1", url.port or 8123, clickhouse.database,
            warehouse_views(), admin,
        )  # fmt: skip
    finally:
        admin.close()


def built(build: Callable[[], Any]) -> Any:
    """A driver from drivers.py; a build that fails fails the test (never skips it)."""
    try:
        return build()
    except drivers.DriverBuildError as exc:
        pytest.fail(f"could not build the BI client: {exc}", pytrace=False)


def run_json(cmd: list[str], stdin: str, what: str, timeout: float = 180,
             env: dict[str, str] | None = None) -> Any:  # fmt: skip
    """Run a driver program and parse the JSON it prints; its stderr goes into the message."""
    try:
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} did not finish in {timeout}s: {exc.stderr!r}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"{what} exited {proc.returncode} without JSON:\n--- stdout\n{proc.stdout[-3000:]}"
            f"\n--- stderr\n{proc.stderr[-3000:]}"
        )


def ok(step: dict[str, Any]) -> dict[str, Any]:
    """The step's result, or a failure naming the operation and the driver's error."""
    if step.get("error"):
        pytest.fail(f"{step.get('op')} {step.get('sql') or step.get('arg') or ''!r}: "
                    f"{step['error']}", pytrace=False)  # fmt: skip
    return step


def refused(step: dict[str, Any], what: str) -> None:
    """A write by the read-only user must fail with ClickHouse's READONLY (164) refusal or an
    ACCESS_DENIED (497)."""
    err = step.get("error") or ""
    assert err, f"{what}: the read-only user's write was accepted"
    assert re.search(r"\b(164|497)\b|READONLY|readonly|ACCESS_DENIED", err), (
        f"{what}: refused, but not as a read-only refusal: {err}"
    )
