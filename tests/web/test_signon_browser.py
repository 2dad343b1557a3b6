"""Signing in to the page in Chromium against a real OpenID Connect provider (Ory Hydra, built
from the Go module proxy: tests/harness/hydra.py; Dex is not served by the proxy here), each
person then seeing what their role allows, the embedded endpoint narrowing every query; and
the refusals: a tampered state or nonce, a cookie replayed after logout, an expired token.
oauth2-proxy's header mode is test_signon_proxy_browser.py's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from gpugap.services.kafka import free_port
from gpugap.web.signon.settings import SignOnSettings
from tests.harness.chromium import chromium_browser
from tests.harness.hydra import Hydra
from tests.harness.scoped_warehouse import JOBS, T0, ScopedWarehouse, scoped_warehouse
from tests.harness.signon_build import ensure_hydra
from tests.harness.web_page import Background

pytestmark = pytest.mark.timeout(600)

PEOPLE = {
    "alice": ("alice-pw", "alice@example.org", ["vision-members"], "Alice"),
    "carol": ("carol-pw", "carol@example.org", ["nlp-members"], "Carol"),
    "dave": ("dave-pw", "dave@example.org", ["vision-leads"], "Dave"),
    "erin": ("erin-pw", "erin@example.org", ["gpu-admins"], "Erin"),
}
ROLES: dict[str, Any] = {
    "team_groups": {"vision-members": "vision", "nlp-members": "nlp"},
    "lead_groups": {"vision-leads": "vision"},
    "admin_groups": ["gpu-admins"],
}
RANGE = (
    f"from={int((T0 - timedelta(hours=1)).timestamp())}"
    f"&to={int((T0 + timedelta(hours=3)).timestamp())}"
)
TOKEN_S = 15  # the short-lived provider's token lifetime
_KEPT: set[int] = set()


def module_children() -> set[int]:
    return _KEPT


class Site:
    """Hydra, a client registered for the page, and the page with sign-on over the estate."""

    def __init__(self, estate: ScopedWarehouse, **hydra: Any) -> None:
        self.hydra = Hydra(ensure_hydra(), PEOPLE, **hydra)
        self.hydra.start()
        assert self.hydra.proc is not None
        _KEPT.add(self.hydra.proc.pid)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/"
        client_id, secret = self.hydra.add_client([f"{self.url}auth/callback"])
        self.settings = SignOnSettings(
            mode="oidc",
            issuer=self.hydra.issuer,
            client_id=client_id,
            client_secret=secret,
            public_url=self.url.rstrip("/"),
            **ROLES,
        )
        self.page = Background(estate.admin, port=port, signon=self.settings)

    def close(self) -> None:
        self.page.stop()
        self.hydra.close()


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScopedWarehouse]:
    with scoped_warehouse(tmp_path_factory.mktemp("signon-browser")) as found:
        _KEPT.add(found.pid)
        yield found


@pytest.fixture(scope="module")
def site(estate: ScopedWarehouse) -> Iterator[Site]:
    found = Site(estate)
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="module")
def chromium(estate: ScopedWarehouse) -> Iterator[Any]:
    # after the estate: Playwright's sync API keeps an event loop running in this thread,
    # and loading the estate runs one of its own
    with chromium_browser() as browser:
        yield browser


def sign_in(context: Any, site: Site, user: str, password: str | None = None) -> Any:
    """Open the page, be sent to the provider, fill its form; the tab, back on the page."""
    tab = context.new_page()
    tab.goto(site.url)
    tab.wait_for_selector("#username", timeout=30_000)
    tab.fill("#username", user)
    tab.fill("#password", password or PEOPLE[user][0])
    tab.click("#login")
    tab.wait_for_url(f"{site.url}*", timeout=30_000)
    return tab


def api(tab: Any, site: Site, path: str) -> tuple[int, Any]:
    """A request from the tab's browser context (its cookies), as the page's own code sends."""
    answer = tab.request.get(site.url + path)
    try:
        body = answer.json()
    except Exception:
        body = answer.text()
    return answer.status, body


def waste_ids(tab: Any, site: Site, extra: str = "") -> set[str]:
    status, body = api(tab, site, f"api/top_waste?{RANGE}{extra}")
    assert status == 200, body
    index = body["columns"].index("allocation_id")
    return {row[index] for row in body["rows"]}


def ids(*owners: str) -> set[str]:
    return {f"slurm/c/{j.job_id}" for j in JOBS if j.owner in owners}


@pytest.mark.parametrize(
    ("user", "role", "sees"),
    [
        ("alice", "user", ("alice",)),
        ("carol", "user", ("carol",)),
        ("dave", "lead", ("alice", "bob")),
        ("erin", "admin", ("alice", "bob", "carol")),
    ],
)
def test_each_person_signs_in_and_sees_what_their_role_allows(
    chromium: Any, site: Site, user: str, role: str, sees: tuple[str, ...]
) -> None:
    context = chromium.new_context()
    try:
        tab = sign_in(context, site, user)
        # the page says who it shows itself to; a user also their team's totals
        tab.wait_for_selector("#who", timeout=30_000)
        assert user in (tab.text_content("#who") or "")
        if role == "user":
            tab.wait_for_selector("#team-totals", timeout=30_000)
            assert "GPU-h" in (tab.text_content("#team-totals") or "")
        status, who = api(tab, site, "api/whoami")
        assert status == 200 and (who["user"], who["role"]) == (user, role)
        assert waste_ids(tab, site) == ids(*sees)
        # the page's own filter, edited to another team, shows nothing more
        assert waste_ids(tab, site, "&team=nlp") <= ids(*sees)
        cookies = {c["name"]: c for c in context.cookies()}
        session = cookies["gpugap_session"]
        assert session["httpOnly"] and session["sameSite"] == "Lax"
        assert "code=" not in tab.url and "token" not in tab.url
    finally:
        context.close()


def test_a_cookie_replayed_after_logout_is_refused(chromium: Any, site: Site) -> None:
    context = chromium.new_context()
    try:
        tab = sign_in(context, site, "alice")
        copied = [c for c in context.cookies() if c["name"] == "gpugap_session"]
        assert api(tab, site, "api/whoami")[0] == 200
        tab.click("#sign-out")  # the page's own form
        tab.wait_for_selector("text=You are signed out", timeout=30_000)
        assert api(tab, site, "api/whoami")[0] == 401
    finally:
        context.close()
    thief = chromium.new_context()
    try:
        thief.add_cookies(copied)
        tab = thief.new_page()
        assert api(tab, site, "api/whoami")[0] == 401
        assert api(tab, site, f"api/top_waste?{RANGE}")[0] == 401
    finally:
        thief.close()


def begin_tampered(tab: Any, site: Site, field: str) -> None:
    """Start a login as the page does (its cookie lands in the tab's context), then go to the
    provider with ``field`` of the authorization request altered, and sign in there."""
    started = tab.request.get(site.url + "auth/login", max_redirects=0)
    assert started.status == 303
    location = started.headers["location"]
    assert f"{field}=" in location
    tab.goto(location.replace(f"{field}=", f"{field}=x", 1))
    tab.fill("#username", "alice")
    tab.fill("#password", PEOPLE["alice"][0])
    tab.click("#login")
    tab.wait_for_url(f"{site.url}auth/callback*", timeout=30_000)


@pytest.mark.parametrize(
    ("field", "why"),
    [("state", "was not started in this browser"), ("nonce", "nonce is not this login's")],
)
def test_a_login_with_a_tampered_state_or_nonce_is_refused(
    chromium: Any, site: Site, field: str, why: str
) -> None:
    context = chromium.new_context()
    try:
        tab = context.new_page()
        begin_tampered(tab, site, field)
        assert why in (tab.text_content("body") or "")
        assert api(tab, site, "api/whoami")[0] == 401
    finally:
        context.close()


def test_a_wrong_password_signs_nobody_in(chromium: Any, site: Site) -> None:
    context = chromium.new_context()
    try:
        tab = context.new_page()
        tab.goto(site.url)
        tab.fill("#username", "alice")
        tab.fill("#password", "not-her-password")
        tab.click("#login")
        tab.wait_for_load_state()
        assert not tab.url.startswith(site.url)
        assert api(tab, site, "api/whoami")[0] == 401
    finally:
        context.close()


def test_a_session_ends_when_its_id_token_expires(chromium: Any, estate: ScopedWarehouse) -> None:
    # long enough that a loaded machine signs in well within it (3 s flaked under CI)
    short = Site(estate, id_token_ttl_s=TOKEN_S, access_token_ttl_s=TOKEN_S)
    context = chromium.new_context()
    try:
        tab = sign_in(context, short, "alice")
        assert api(tab, short, "api/whoami")[0] == 200
        lasts = [c["expires"] for c in context.cookies() if c["name"] == "gpugap_session"]
        time.sleep(max(0.0, lasts[0] + 1 - time.time()))  # the cookie ends with the token
        status, body = api(tab, short, "api/whoami")
        assert status == 401, body
        assert api(tab, short, f"api/top_waste?{RANGE}")[0] == 401
        # the page, asking again (another range), is sent to sign in and comes back: the
        # provider remembers her, so no form, and a new session
        logins = len(short.hydra.logins)
        old = {c["value"] for c in context.cookies() if c["name"] == "gpugap_session"}
        tab.select_option("#range-preset", "6")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = {c["value"] for c in context.cookies() if c["name"] == "gpugap_session"}
            if new and new != old:
                break
            tab.wait_for_timeout(100)
        assert new and new != old, "the page did not sign in again"
        tab.wait_for_selector("#who", timeout=30_000)
        assert len(short.hydra.logins) == logins  # no password asked again
    finally:
        context.close()
        short.close()


def test_a_lead_decides_a_recommendation_on_the_page(chromium: Any, site: Site) -> None:
    context = chromium.new_context()
    try:
        tab = sign_in(context, site, "dave")
        row = tab.wait_for_selector('#recommendations tr[data-id="time-alice"]', timeout=30_000)
        listed = tab.eval_on_selector_all(
            "#recommendations tr[data-id]", "rs => rs.map(r => r.dataset.id)"
        )
        assert sorted(listed) == ["time-alice", "time-bob"]  # the team's, not carol's
        row.query_selector("input.why").fill("two hours is plenty")
        row.query_selector("button.accept").click()
        tab.wait_for_function(
            '() => document.querySelector(\'#recommendations tr[data-id="time-alice"] '
            ".decision').textContent.startsWith('accept')",
            timeout=30_000,
        )
        assert row.query_selector(".decision").text_content() == "accept (dave)"
    finally:
        context.close()
    user = chromium.new_context()
    try:
        tab = sign_in(user, site, "alice")
        row = tab.wait_for_selector('#recommendations tr[data-id="time-alice"]', timeout=30_000)
        assert row.query_selector("button") is None  # a user sees, a lead decides
        assert row.query_selector(".decision").text_content() == "accept (dave)"
    finally:
        user.close()
