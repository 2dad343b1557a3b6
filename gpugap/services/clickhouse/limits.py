"""What one request may consume, and the engine's own configuration that enforces it.

The engine (chDB) reads a ClickHouse ``config.xml`` + ``users.xml`` written here: the settings
profile carries the default limits with constraints (a client cannot raise them, not even in a
query's SETTINGS clause), and the grants leave out every host source (URL, S3, remote servers,
the File engine, writing files, SYSTEM commands). chDB's own INSERT path reads its data through
the FILE source, so READ ON FILE stays granted; the HTTP layer refuses ``file()`` itself (see
policy.py). All connections of the process are the engine's user ``default``: who may write is
decided per connection with engine-level ``readonly``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpugap.services.clickhouse import policy
from schemas.errors import ServiceError

GiB = 1 << 30


class EndpointLimits(BaseSettings):
    """``GPUGAP_CLICKHOUSE_SERVE_*``: bounds of the embedded endpoint, per request."""

    model_config = SettingsConfigDict(
        env_prefix="GPUGAP_CLICKHOUSE_SERVE_", frozen=True, extra="ignore"
    )

    max_query_bytes: int = Field(
        default=256 * 1024,
        gt=0,
        description="query text (URL + body of a non-INSERT), like max_query_size",
    )
    max_uri_bytes: int = Field(
        default=1 << 20, gt=0, description="request line, like http_max_uri_size"
    )
    max_insert_bytes: int = Field(
        default=4 * GiB,
        gt=0,
        description="one INSERT's data after decompression (streamed, except the whole-file "
        "formats such as Parquet and ORC, which chDB buffers)",
    )
    max_line_bytes: int = Field(
        default=16 << 20,
        ge=2 << 20,
        description="one line of a text INSERT format (CSV, TSV, JSONEachRow, Values...): chDB "
        "buffers a row that never ends",
    )
    receive_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="headers, and each read of a body, like http_receive_timeout",
    )
    max_execution_time_s: int = Field(
        default=300, gt=0, description="default and maximum per query"
    )
    max_memory_usage: int = Field(
        default=4 * GiB, gt=0, description="default and maximum per query"
    )
    max_result_bytes: int = Field(
        default=1 * GiB, gt=0, description="a result is buffered before it is sent: its maximum"
    )
    max_concurrent_queries: int = Field(default=16, gt=0)
    queue_wait_s: float = Field(
        default=10.0, ge=0, description="how long a request waits for a free slot before code 202"
    )
    max_sessions: int = Field(default=1000, gt=0)
    session_timeout_s: float = Field(
        default=3600.0, gt=0, description="idle time before a session ends"
    )


_CATALOG = """
import chdb
c = chdb.connect(":memory:")
q = lambda sql: c._conn.query(sql, "TSVRaw").bytes().decode().split()
print(" ".join(q("SELECT name FROM system.settings WHERE changed")))
print(" ".join(q("SELECT name FROM system.settings")))
"""


@dataclass(frozen=True)
class Catalog:
    """The engine's setting names, and those chDB itself changes on every connection."""

    names: frozenset[str]
    preset: frozenset[str]


def catalog(directory: Path) -> Catalog:
    """Read once per chDB version (in a child process: one engine per process, and this one
    must open the data directory with the configuration built from it), then cached."""
    import chdb

    cache = directory / f"settings-{chdb.__version__}.txt"
    if not cache.exists():
        directory.mkdir(parents=True, exist_ok=True)
        try:
            out = subprocess.run(
                [sys.executable, "-c", _CATALOG],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            raise ServiceError(f"cannot list the engine's settings: {exc}") from None
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # endpoints may start side by side
        tmp.write_text(out)
        tmp.replace(cache)
    preset, names = [*cache.read_text().splitlines(), "", ""][:2]
    return Catalog(frozenset(names.split()), frozenset(preset.split()))


def write_engine_config(directory: Path, limits: EndpointLimits, cache: Path | None = None) -> Path:
    """Write config.xml and users.xml into ``directory``; return the config's path. The
    engine's setting names are read once per chDB version into ``cache`` (default:
    ``directory``), so a fresh data directory does not start a child process again."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    known = catalog(cache or directory)
    capped = {
        "max_execution_time": limits.max_execution_time_s,
        "max_memory_usage": limits.max_memory_usage,
        "max_result_bytes": limits.max_result_bytes,
        "max_query_size": limits.max_query_bytes,
    }
    defaults = "".join(f"<{k}>{v}</{k}>" for k, v in capped.items())
    # min 1: 0 means "no limit" to the engine
    maxima = "".join(f"<{k}><min>1</min><max>{v}</max></{k}>" for k, v in capped.items())
    # the allow-list, enforced by the engine: every other setting is constant (clients see it
    # as readonly in system.settings), and so are those that switch a limit or a guard off.
    # Left changeable: readonly (a reader's connection sets it), log_comment (marks a
    # request's query for cancelling) and what chDB itself sets on every connection.
    fixed = {n for n in known.names if not policy.is_allowed(n)} | {
        "allow_ddl",
        "timeout_overflow_mode",
        "max_concurrent_queries_for_user",
        "max_concurrent_queries_for_all_users",
    }
    fixed -= {"readonly", "log_comment", *known.preset, *capped}
    const = "".join(f"<{k}><const/></{k}>" for k in sorted(fixed))
    grants = "".join(
        f"<query>{escape(g)}</query>"
        for g in (
            "GRANT READ ON FILE",  # chDB's INSERT reads its data through the FILE source
            "GRANT SHOW, SELECT, INSERT, ALTER, CREATE, DROP, TRUNCATE, OPTIMIZE, "
            "KILL QUERY ON *.*",
        )
    )
    users = directory / "users.xml"
    users.write_text(
        "<clickhouse><profiles><default>"
        f"{defaults}<result_overflow_mode>throw</result_overflow_mode>"
        f"<constraints>{maxima}{const}</constraints>"
        "</default></profiles><users><default><password></password><profile>default</profile>"
        "<networks><ip>::/0</ip></networks><quota>default</quota>"
        f"<grants>{grants}</grants></default></users>"
        "<quotas><default></default></quotas></clickhouse>\n"
    )
    config = directory / "config.xml"
    config.write_text(
        f"<clickhouse><users_config>{escape(str(users))}</users_config></clickhouse>\n"
    )
    return config
