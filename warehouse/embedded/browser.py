"""Browsers are clients too, and a web page the operator opens is somebody else's: a request
from a page of another origin (``Origin`` foreign) is refused, and so is one addressed to a
name the endpoint does not answer to (a page that rebinds its own DNS name to 127.0.0.1 sends
its own name as ``Host``). A script or image load sends no ``Origin``, but a browser says
where it comes from in its Fetch Metadata: ``Sec-Fetch-Site`` ``cross-site`` or ``same-site``
(a page on another port of this host is the same site, not the same origin) is refused unless
its ``Origin`` is listed, and ``Sec-Fetch-Mode: no-cors`` (``<script src>``, ``<img src>``)
always, but from the endpoint's own pages. Every answer carries ``X-Content-Type-Options:
nosniff``, so a browser never runs one as a script. Real clients send no ``Origin``, no
``Sec-Fetch-*`` and the Host they were given."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from gpugap.warehouse.embedded.errors import EngineError

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
        origin = (headers.get("Origin") or "").strip().lower().rstrip("/")
        own = origin == f"http://{host_header}"
        listed = origin in self.origins
        site = headers.get("Sec-Fetch-Site", "").strip().lower()
        if headers.get("Sec-Fetch-Mode", "").strip().lower() == "no-cors" and site not in (
            "same-origin",
            "none",
        ):
            raise _refused(
                f"a {site or 'browser'} page's load of it as a script, image or style (no-cors)"
            )
        if site in ("cross-site", "same-site") and not listed:
            raise _refused(f"a request from a {site} web page ('{origin[:100] or 'no Origin'}')")
        if origin and not (own or listed):
            raise _refused(f"a request from the web page at '{origin[:100]}'")


def _refused(what: str) -> EngineError:
    return EngineError(
        f"Not enough privileges: {what} (the endpoint answers only its own pages and "
        "GPUGAP_CLICKHOUSE_SERVE_ALLOWED_ORIGINS)",
        497,
        "ACCESS_DENIED",
    )


def _hostname(host_header: str) -> str:
    """The name in a Host header, without its port ('[::1]:8123' -> '::1')."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
