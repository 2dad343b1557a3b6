"""The tests' warehouse: the embedded endpoint's passwords for the session, and the demo's day
loaded once (tests/conftest.py's ``demo_warehouse``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings

CLICKHOUSE_PASSWORD = "test-password-1"
READER_PASSWORD = "reader-password-1"


@dataclass
class DemoWarehouse:
    settings: ClickHouseSettings  # the admin's, on the demo's database
    admin: Any  # a clickhouse-connect client
    loaded: dict[str, Any]  # tests/demo_data.load's counts and timings

    def one(self, sql: str, **params: Any) -> Any:
        return self.admin.query(sql, parameters=params).result_rows[0][0]

    def rows(self, sql: str, **params: Any) -> list[Any]:
        return list(self.admin.query(sql, parameters=params).result_rows)
