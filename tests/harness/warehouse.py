"""The tests' warehouse: the embedded endpoint's passwords for the session, the demo's day
loaded once (tests/conftest.py's ``demo_warehouse``), and records stored through the sink."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Record
from gpugap.warehouse.client import connect
from gpugap.web import metrics
from gpugap.web.queries import Query

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


def metric_samples(
    settings: ClickHouseSettings, prefix: str
) -> list[tuple[str, dict[str, str], float]]:
    """``/metrics``' samples (gpugap.web.metrics) read off the warehouse of ``settings``, of the
    families whose name starts with ``prefix``: (family, labels, value)."""
    client = connect(settings)

    async def run(q: Query) -> tuple[list[str], list[Any]]:
        result = client.query(q.sql, parameters=q.params)
        return list(result.column_names), [list(r) for r in result.result_rows]

    try:
        text = asyncio.run(metrics.Exporter(run).text())
    finally:
        client.close()
    return [
        (fam.name, s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        if fam.name.startswith(prefix)
        for s in fam.samples
    ]


def store(clickhouse: ClickHouseSettings, rows: Sequence[Record], **sink: Any) -> None:
    """Write ``rows`` through the sink (which rolls them up), as a deployment does."""
    from gpugap.sinks.clickhouse.sink import ClickHouseSink

    async def write() -> None:
        out = ClickHouseSink(clickhouse, **sink)
        await out.start()
        await out.write(list(rows))
        await out.close()

    asyncio.run(write())
