"""One client for the warehouse, the embedded endpoint or a real ClickHouse server: one
``connect``, one mapping of clickhouse-connect's errors to gpugap's (unreachable or overloaded
is retriable, a refusal is one line that says what to do), and the read-only query helper every
reader (the report, ``gpugap sql``, the web page, recommendations) goes through."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import urlparse

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas.errors import ConfigError, FatalError, RetriableError

# readonly=2: no writes and no DDL, but settings may still be changed per query (clickhouse-
# connect sends some of its own; readonly=1 would refuse those).
READONLY = {"readonly": 2}
# codes meaning "try again later": too many queries, timeouts, network, memory, overloaded
RETRIABLE_CODES = {159, 202, 209, 210, 241, 242, 252, 319, 425, 999}
_UNKNOWN_OBJECT = {60, 81}  # UNKNOWN_TABLE, UNKNOWN_DATABASE
_CREDENTIALS = {192, 194, 516}  # UNKNOWN_USER, REQUIRED_PASSWORD, AUTHENTICATION_FAILED
_MIGRATE = " (a new warehouse? `gpugap db migrate` creates the tables and views)"


class QueryError(FatalError):
    """ClickHouse refused a query (syntax, a missing table, not allowed in read-only mode)."""


def one_line(exc: BaseException) -> str:
    """A ClickHouse error as one short line: its code and message, without the wrapping."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^Received ClickHouse exception, code: \d+, server response: ", "", text)
    text = re.sub(r" \(version [^)]*\)| \(for url [^)]*\)", "", text)
    return text if len(text) <= 300 else text[:297] + "..."


def client_options(settings: ClickHouseSettings, *, database: bool = True) -> dict[str, Any]:
    """clickhouse-connect's ``get_client`` arguments for ``settings`` (also what the web page
    and the report hand to their own clients)."""
    url = urlparse(settings.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"GPUGAP_CLICKHOUSE_URL must be http(s)://host:port, got {settings.url!r}"
        )
    opts: dict[str, Any] = {
        "host": url.hostname,
        "port": url.port or (8443 if url.scheme == "https" else 8123),
        "secure": url.scheme == "https",
        "username": settings.user,
        "password": settings.password.get_secret_value() if settings.password else "",
        "connect_timeout": 5,
        "send_receive_timeout": 120,
        "autogenerate_session_id": False,
    }
    if database:
        opts["database"] = settings.database
    return opts


def connect(settings: ClickHouseSettings, *, database: bool = True) -> Any:
    """A clickhouse-connect client on ``settings.database`` (or on none), or a gpugap error:
    RetriableError when the server is unreachable, QueryError when it refuses (a missing
    database names `gpugap db migrate`)."""
    import clickhouse_connect

    # both libraries log each failed attempt as a warning: the error raised says it once
    for name in ("urllib3", "clickhouse_connect"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return clickhouse_connect.get_client(**client_options(settings, database=database))
    except ConfigError:
        raise
    except Exception as exc:
        where = f"{settings.url} (database {settings.database})" if database else settings.url
        raise as_gpugap_error(exc, where) from None


def as_gpugap_error(exc: BaseException, where: str) -> BaseException:
    """clickhouse-connect's errors -> ours, in one line: unreachable or overloaded is
    RetriableError, credentials refused ConfigError (naming the settings), any other refusal
    QueryError; anything else is returned as it is."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    code = getattr(exc, "code", None)
    if isinstance(exc, (OperationalError, OSError)) or (
        isinstance(exc, DatabaseError) and code and int(code) in RETRIABLE_CODES
    ):
        # the OS's reason ("[Errno 111] Connection refused", "timed out"), not urllib3's story
        reason = re.search(
            r"\[Errno -?\d+\] [^'\")]+|timed out|Name or service not known", str(exc)
        )
        why = reason.group(0).strip() if reason else one_line(exc)
        return RetriableError(f"ClickHouse at {where} is unavailable: {why}")
    if isinstance(exc, DatabaseError) and code is not None and int(code) in _CREDENTIALS:
        return ConfigError(
            f"ClickHouse at {where} refused the credentials: {one_line(exc)} (check "
            "GPUGAP_CLICKHOUSE_USER and GPUGAP_CLICKHOUSE_PASSWORD)"
        )
    if isinstance(exc, DatabaseError):
        hint = _MIGRATE if code is not None and int(code) in _UNKNOWN_OBJECT else ""
        return QueryError(f"ClickHouse at {where} refused the query: {one_line(exc)}{hint}")
    return exc


def run_query(
    client: Any,
    sql: str,
    parameters: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Any:
    """``client.query`` in read-only mode: the QueryResult, or a one-line gpugap error."""
    from clickhouse_connect.driver.exceptions import DatabaseError

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
    except Exception as exc:
        raise as_gpugap_error(exc, where) from None
