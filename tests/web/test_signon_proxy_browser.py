"""Signing in through oauth2-proxy v7 (a Go module, built by tests/harness/signon_build.py) in
header mode, in Chromium: the proxy logs the person in at Ory Hydra and passes their name and
groups to the page, which trusts those headers from the proxy's address only. The page listens
on 127.0.0.2, so the test can also reach it from 127.0.0.3, an address that is not the proxy's."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpugap.services.kafka import free_port
from gpugap.web.signon.settings import SignOnSettings
from tests.harness.chromium import chromium_browser
from tests.harness.hydra import Hydra
from tests.harness.oauth2_proxy import OAuth2Proxy
from tests.harness.scoped_warehouse import ScopedWarehouse, scoped_warehouse
from tests.harness.signon_build import ensure_hydra, ensure_oauth2_proxy
from tests.harness.web_page import Background
from tests.web.test_signon_browser import PEOPLE, RANGE, ROLES, ids

pytestmark = pytest.mark.timeout(600)
PAGE_HOST = "127.0.0.2"
_KEPT: set[int] = set()


def module_children() -> set[int]:
    return _KEPT


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScopedWarehouse]:
    with scoped_warehouse(tmp_path_factory.mktemp("signon-proxy")) as found:
        _KEPT.add(found.pid)
        yield found


@pytest.fixture(scope="module")
def proxied(estate: ScopedWarehouse) -> Iterator[tuple[OAuth2Proxy, Background]]:
    settings = SignOnSettings(mode="proxy", trusted_proxies=["127.0.0.1"], **ROLES)
    page = Background(estate.admin, host=PAGE_HOST, port=free_port(), signon=settings)
    hydra = Hydra(ensure_hydra(), PEOPLE)
    try:
        hydra.start()
        assert hydra.proc is not None
        _KEPT.add(hydra.proc.pid)
        proxy = OAuth2Proxy(ensure_oauth2_proxy(), hydra, f"http://{PAGE_HOST}:{page.port}/")
        proxy.start()
        assert proxy.proc is not None
        _KEPT.add(proxy.proc.pid)
        try:
            yield proxy, page
        finally:
            proxy.close()
    finally:
        hydra.close()
        page.stop()


@pytest.fixture(scope="module")
def chromium(proxied: Any) -> Iterator[Any]:
    with chromium_browser() as browser:
        yield browser


def from_address(page: Background, source: str, path: str, headers: dict[str, str]) -> Any:
    conn = http.client.HTTPConnection(PAGE_HOST, page.port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{page.port}", **headers})
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("user", "sees"),
    [("alice", ("alice",)), ("dave", ("alice", "bob")), ("erin", ("alice", "bob", "carol"))],
)
def test_a_person_signed_in_by_the_proxy_sees_what_their_role_allows(
    chromium: Any, proxied: tuple[OAuth2Proxy, Background], user: str, sees: tuple[str, ...]
) -> None:
    proxy, _ = proxied
    context = chromium.new_context()
    try:
        tab = context.new_page()
        tab.goto(proxy.url + "/")
        tab.wait_for_selector("#username", timeout=30_000)
        tab.fill("#username", user)
        tab.fill("#password", PEOPLE[user][0])
        tab.click("#login")
        tab.wait_for_url(f"{proxy.url}/*", timeout=30_000)
        who = tab.request.get(proxy.url + "/api/whoami")
        assert who.status == 200, who.text()
        assert who.json()["user"] == user
        answer = tab.request.get(f"{proxy.url}/api/top_waste?{RANGE}")
        body = answer.json()
        index = body["columns"].index("allocation_id")
        assert {row[index] for row in body["rows"]} == ids(*sees)
    finally:
        context.close()


def test_a_forged_identity_from_an_address_that_is_not_the_proxy_is_refused(
    proxied: tuple[OAuth2Proxy, Background],
) -> None:
    _, page = proxied
    forged = {"X-Forwarded-User": "erin", "X-Forwarded-Groups": "gpu-admins"}
    status, body = from_address(page, "127.0.0.3", f"/api/top_waste?{RANGE}", forged)
    assert status == 403
    assert "proxy" in json.loads(body)["error"]
    # and without the headers, from there: not signed in
    assert from_address(page, "127.0.0.3", "/api/whoami", {})[0] == 401
