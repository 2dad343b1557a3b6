"""Read-only queries for the report and ``gpugap sql``: one client, server-side parameters,
and ClickHouse's errors turned into one line that says what to do."""

from __future__ import annotations

import re
from typing import Any

from groundfloor.settings import ClickHouseSettings
from schemas.errors import FatalError, RetriableError

# readonly=2: no writes and no DDL, but settings may still be changed per query (clickhouse-
# connect sends some of its own; readonly=1 would refuse those).
READONLY = {"readonly": 2}
_UNKNOWN_OBJECT = {60, 81}  # UNKNOWN_TABLE, UNKNOWN_DATABASE
_MIGRATE = " (a new warehouse? `gpugap db migrate` creates the tables and views)"


class QueryError(FatalError):
    """ClickHouse refused a query (syntax, a missing table, not allowed in read-only mode)."""


def one_line(exc: BaseException) -> str:
    """A ClickHouse error as one short line: its code and message, without the wrapping."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^Received ClickHouse exception, code: \d+, server response: ", "", text)
    text = re.sub(r" \(version [^)]*\)| \(for url [^)]*\)", "", text)
    return text if len(text) <= 300 else text[:297] + "..."


def _refused(exc: Exception, where: str) -> QueryError:
    code = getattr(exc, "code", None)
    hint = _MIGRATE if code is not None and int(code) in _UNKNOWN_OBJECT else ""
    return QueryError(f"ClickHouse at {where} refused the query: {one_line(exc)}{hint}")


def _unavailable(exc: BaseException, url: str) -> RetriableError:
    # the OS's reason ("[Errno 111] Connection refused", "timed out"), not urllib3's story
    reason = re.search(r"\[Errno -?\d+\] [^'\")]+|timed out|Name or service not known", str(exc))
    why = reason.group(0).strip() if reason else one_line(exc)
    return RetriableError(f"ClickHouse at {url} is unavailable: {why}")


def open_client(settings: ClickHouseSettings) -> Any:
    """A clickhouse-connect client for the configured database, or one line on why not
    (unreachable: RetriableError; the database missing: QueryError)."""
    import logging

    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    from sinks.clickhouse.warehouse import client_options

    # both libraries log each failed attempt as a warning: the error below says it once
    for name in ("urllib3", "clickhouse_connect"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return clickhouse_connect.get_client(**client_options(settings))
    except (OperationalError, OSError) as exc:
        raise _unavailable(exc, settings.url) from None
    except DatabaseError as exc:
        raise _refused(exc, f"{settings.url} (database {settings.database})") from None


def run_query(
    client: Any,
    sql: str,
    parameters: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Any:
    """``client.query`` in read-only mode: the QueryResult, or a one-line gpugap error."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    where = str(getattr(client, "url", "") or "the server")
    try:
        try:
            readonly = {**READONLY, **(settings or {})}
            return client.query(sql, parameters=parameters, settings=readonly)
        except DatabaseError as exc:
            # a user whose profile is already read-only may not change `readonly` at all
            if "Cannot modify 'readonly'" not in str(exc):
                raise
            return client.query(sql, parameters=parameters, settings=settings)
    except OperationalError as exc:
        raise _unavailable(exc, where) from None
    except DatabaseError as exc:
        raise _refused(exc, where) from None
