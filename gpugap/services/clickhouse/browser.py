"""Browsers are clients too, and a web page the operator opens is somebody else's: a request
from a page of another origin (``Origin`` foreign) is refused, and so is one addressed to a
name the endpoint does not answer to (a page that rebinds its own DNS name to 127.0.0.1 sends
its own name as ``Host``). Real clients send no ``Origin`` and the Host they were given."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from gpugap.services.clickhouse.engine import EngineError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BrowserGuard:
    def __init__(self, listen: str, hosts: frozenset[str], origins: frozenset[str]) -> None:
        self.listen = listen.lower()
        self.hosts, self.origins = hosts, origins
        # beyond loopback every user has a password (check_exposure) and the names a site
        # gives the host are its own business, unless it lists them
        self.check_host = _is_loopback(self.listen) or bool(hosts)

    def check(self, headers: Mapping[str, str]) -> None:
        host_header = headers.get("Host", "").strip().lower()
        host = _hostname(host_header)
        if (
            host
            and self.check_host
            and not (_is_loopback(host) or host == self.listen.strip("[]") or host in self.hosts)
        ):
            raise EngineError(
                f"Not enough privileges: the endpoint does not answer to the host name "
                f"'{host[:100]}' (its own address and GPUGAP_CLICKHOUSE_SERVE_ALLOWED_HOSTS)",
                497,
                "ACCESS_DENIED",
            )
        origin = headers.get("Origin")
        if origin is None:
            return
        origin = origin.strip().lower().rstrip("/")
        if origin in self.origins or origin == f"http://{host_header}":
            return
        raise EngineError(
            f"Not enough privileges: a request from the web page at '{origin[:100]}' (the "
            "endpoint answers only its own pages and GPUGAP_CLICKHOUSE_SERVE_ALLOWED_ORIGINS)",
            497,
            "ACCESS_DENIED",
        )


def _hostname(host_header: str) -> str:
    """The name in a Host header, without its port ('[::1]:8123' -> '::1')."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
