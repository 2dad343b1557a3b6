"""Fixtures of the report's tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.client import connect
from gpugap.warehouse.migrate import migrate
from tests.gpugap.report_data import store


@pytest.fixture(scope="session")
def estate(clickhouse_server: ClickHouseSettings) -> Iterator[ClickHouseSettings]:
    """The estate of report_data.py in a database of its own, written once through the sink
    (read-only for the tests that use it)."""
    settings = clickhouse_server.model_copy(update={"database": f"r{uuid.uuid4().hex[:10]}"})
    migrate(settings)
    store(settings)
    yield settings
    admin = connect(settings, database=False)
    try:
        admin.command(f"DROP DATABASE IF EXISTS `{settings.database}`")
    finally:
        admin.close()
