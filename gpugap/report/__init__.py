"""``gpugap report``: allocated vs consumed GPU-hours and where the gap is, read from the
warehouse views (the same SQL a BI tool would run).

For other parts (the demo)::

    from gpugap.report import build_report, render, report_for
    report = report_for(settings.clickhouse, since=None, until=None, by="class", top=10)
    print(render(report, "table"))
"""

from __future__ import annotations

from datetime import datetime

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.groundfloor.timearg import parse_time, parse_window
from gpugap.report.build import build_report
from gpugap.report.models import DIMENSIONS, Report, report_schema
from gpugap.report.queries import BY_COLUMN
from gpugap.report.render import FORMATS, render
from gpugap.warehouse.client import QueryError, connect

__all__ = [
    "BY_COLUMN",
    "DIMENSIONS",
    "FORMATS",
    "QueryError",
    "Report",
    "build_report",
    "parse_time",
    "parse_window",
    "render",
    "report_for",
    "report_schema",
]


def report_for(
    settings: ClickHouseSettings,
    since: datetime | None = None,
    until: datetime | None = None,
    by: str = "class",
    top: int = 10,
) -> Report:
    """Connect, build the report, close: the one call for a caller holding settings."""
    client = connect(settings)
    try:
        return build_report(client, since, until, by, top)
    finally:
        client.close()
