"""``gpugap clickhouse serve``: the engine process started, the users' passwords made sure of,
the endpoint listening until SIGTERM/SIGINT; then requests finished, sessions closed, the
engine stopped."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import signal
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from gpugap.schemas.errors import ConfigError, ServiceError
from gpugap.warehouse.embedded import password
from gpugap.warehouse.embedded.engine import EngineProcess
from gpugap.warehouse.embedded.engine_config import (
    prepare_data_dir,
    workloads,
    write_engine_config,
)
from gpugap.warehouse.embedded.limits import EndpointLimits
from gpugap.warehouse.embedded.server import Endpoint
from gpugap.warehouse.embedded.users import User, role

log = logging.getLogger(__name__)
_SECRET_PARAM = re.compile(r"((?:^|[?&])(?:password|key)=)[^&]*", re.IGNORECASE)


class AccessLog(AbstractAccessLogger):
    """One line a request; passwords in the URL are masked."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        path = _SECRET_PARAM.sub(r"\1***", request.path_qs)
        self.logger.info(
            '%s "%s %s" %s %.3fs', request.remote, request.method, path, response.status, time
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _with_passwords(path: Path, users: Mapping[str, User]) -> dict[str, User]:
    """Every user with a password: one without gets the generated one (password.py)."""
    out = dict(users)
    for name, user in users.items():
        if user.password:
            continue
        secret, made = password.ensure(path)
        out[name] = replace(user, password=secret)
        where = password.password_file(path)
        if made and sys.stdout.isatty():  # once, where only the person who started it sees it
            print(f"clickhouse endpoint: user {name}'s password is {secret}", flush=True)
        print(
            f"clickhouse endpoint: user {name}'s password is in {where}"
            f"{' (generated now)' if made else ''}; clients: "
            f"GPUGAP_CLICKHOUSE_PASSWORD_FILE={where}",
            flush=True,
        )
    return out


def check_exposure(host: str, users: Mapping[str, User], insecure: bool) -> None:
    """No user without a password but when told so (``--insecure-no-password``), and then a
    listener beyond loopback says it loudly."""
    open_users = sorted(u.name for u in users.values() if not u.password)
    if not open_users:
        return
    if is_loopback(host):
        log.warning(
            "no password for %s (--insecure-no-password): any program of this machine, and "
            "any web page its browsers open that passes the Origin checks, is that user",
            ", ".join(open_users),
        )
        return
    if insecure:
        log.warning(
            "listening on %s with no password for %s: anyone who reaches this address can "
            "read and change the warehouse",
            host,
            ", ".join(open_users),
        )
        return
    raise ConfigError(
        f"refusing to listen on {host} without a password for {', '.join(open_users)}: anyone "
        "who reaches that address could read and change the warehouse. Set "
        "GPUGAP_CLICKHOUSE_PASSWORD (or _PASSWORD_FILE), listen on 127.0.0.1, or pass "
        "--insecure-no-password if that is really wanted"
    )


def serve(
    path: Path,
    host: str,
    port: int,
    users: Mapping[str, User],
    *,
    ready_file: Path | None = None,
    limits: EndpointLimits | None = None,
    insecure_no_password: bool = False,
    sql_guards: bool = True,
    warehouse: str | None = None,
) -> None:
    """Run until SIGTERM/SIGINT; then stop accepting, finish requests, close the engine.
    ``sql_guards=False`` turns every SQL-level check and engine grant off: only a test that
    shows the engine process's confinement holds without them passes it."""
    limits = limits or EndpointLimits()
    if not insecure_no_password:
        users = _with_passwords(path, users)
    check_exposure(host, users, insecure_no_password)
    from gpugap.groundfloor.settings import ServicesSettings

    cache = ServicesSettings().cache_dir / "chdb"
    config = write_engine_config(
        path / "gpugap-engine", limits, cache, guarded=sql_guards, warehouse=warehouse
    )
    if sql_guards:
        prepare_data_dir(path)
    # (a reader's workload always: any user's request may be scoped, scopes.py, and then reads)
    roles = {role(u) for u in users.values()} | {"reader"}
    startup = workloads(limits, roles) if sql_guards else []
    engine = EngineProcess(path, config, confine=limits.confine, startup=startup)
    confinement = engine.confinement
    if not confinement["confined"]:
        log.warning(
            "the ClickHouse engine runs NOT fully confined (%s): SQL that passes the endpoint's "
            "checks could reach the host",
            "; ".join(confinement.get("problems") or [confinement["text"]]),
        )
    ended: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # engine calls, decompression and checks run in threads: enough for every slot
        executor = ThreadPoolExecutor(limits.max_concurrent_queries * 2 + 4, "clickhouse")
        loop.set_default_executor(executor)
        endpoint = Endpoint(engine, users, limits, host, guarded=sql_guards, warehouse=warehouse)
        server = web.Server(
            endpoint.handle,
            handler_cancellation=True,  # a client that goes away cancels its query
            # aiohttp's keep-alive timer also closes a connection whose request does not
            # arrive in time: the bound on slow headers
            keepalive_timeout=limits.receive_timeout_s,
            # after an answer to a body not read whole (refused, timed out), aiohttp reads and
            # drops the rest for this long before it closes (default 10 s)
            lingering_time=min(2.0, limits.receive_timeout_s),
            max_line_size=limits.max_uri_bytes,
            max_field_size=65536,
            auto_decompress=False,  # bodies are decompressed, bounded, in body.py
            access_log_class=AccessLog,
            access_log=logging.getLogger("aiohttp.access"),
        )
        runner = web.ServerRunner(server, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        def engine_ended(code: int) -> None:  # (from the engine's watcher thread)
            ended.append(code)
            loop.call_soon_threadsafe(stop.set)

        engine.on_exit = engine_ended
        if ready_file is not None:
            ready_file.write_text(f"{host}:{port}\n")
        print(
            f"clickhouse endpoint: http://{host}:{port} (data in {path}; engine: "
            f"{confinement['text']})",
            flush=True,
        )
        await stop.wait()
        await runner.cleanup()
        endpoint.sessions.close()
        executor.shutdown(wait=True, cancel_futures=True)

    try:
        asyncio.run(main())
    finally:
        engine.close()
    if ended:
        raise ServiceError(
            f"the ClickHouse engine process ended unexpectedly (exit status {ended[0]}): the "
            "endpoint stopped; the log above says why"
        )
