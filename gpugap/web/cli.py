"""``gpugap web``'s command line, registered into ``gpugap``'s parser."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from gpugap.schemas.errors import ConfigError

log = logging.getLogger("gpugap.web")


def register(sub: Any, cmd: Any) -> None:
    from gpugap.web import DEFAULT_PORT

    w = cmd(
        "web",
        _web,
        "serve the capacity-gap page over the warehouse views (read-only): the gap over time, "
        "Slurm vs Kubernetes, top waste, idle now, alerts, unallocated capacity, padding",
    )
    w.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    w.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})"
    )
    w.add_argument(
        "--clickhouse",
        metavar="URL",
        help="ClickHouse HTTP URL (default GPUGAP_CLICKHOUSE_URL; the read-only user from "
        "GPUGAP_CLICKHOUSE_READONLY_USER/_PASSWORD when its password is set)",
    )


def _web(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.plugin import require

    require("gpugap web", "clickhouse,local", ("aiohttp", "clickhouse_connect"))
    from gpugap.groundfloor.settings import load
    from gpugap.warehouse.client import client_options
    from gpugap.web.server import serve

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be 0..65535, got {args.port}")
    settings = load().clickhouse
    if args.clickhouse:
        settings = settings.model_copy(update={"url": args.clickhouse})
    client_options(settings)  # a malformed URL is a ConfigError before anything listens
    from gpugap.groundfloor.settings import read_part
    from gpugap.web.signon.settings import SignOnSettings

    signon = read_part(SignOnSettings)  # GPUGAP_WEB_SIGNON_*: a clear error when incomplete
    if args.host not in ("127.0.0.1", "localhost", "::1") and signon.mode == "off":
        log.warning(
            "the page listens on %s with no sign-on: whoever reaches that address reads every "
            "team's figures (GPUGAP_WEB_SIGNON_MODE, docs/security.md#sign-on)",
            args.host,
        )
    serve(settings, args.host, args.port, signon)
    return 0
