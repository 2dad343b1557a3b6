"""A benchmark's own warehouse database: on the ClickHouse at ``url``, or on a throwaway
embedded endpoint when there is none; dropped and migrated afresh, the endpoint stopped after."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings


@contextmanager
def bench_database(
    url: str | None,
    database: str,
    *,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[ClickHouseSettings, Any]]:
    """(settings, a client) of ``database``, new and migrated. ``env``: the embedded
    endpoint's environment (its users), when one is started."""
    from gpugap.services.kafka import free_port
    from gpugap.warehouse.client import connect
    from gpugap.warehouse.migrate import migrate
    from tests.harness.embedded_clickhouse import EmbeddedClickHouse

    with tempfile.TemporaryDirectory(prefix=f"gpugap-bench-{database}-") as tmp:
        server = None
        if url is None:
            server = EmbeddedClickHouse(Path(tmp) / "data", free_port(), env=env)
            server.start()
            url = server.url
        client = None
        try:
            generated = server.password_file if server is not None else None
            settings = ClickHouseSettings(
                url=url,
                database=database,
                password_file=generated if generated and generated.exists() else None,
            )
            admin = connect(settings, database=False)
            admin.command(f"DROP DATABASE IF EXISTS `{database}`")
            admin.close()
            migrate(settings)
            client = connect(settings)
            yield settings, client
        finally:
            if client is not None:
                client.close()
            if server is not None:
                server.stop()
