"""Each signed-in person sees what their role allows, the warehouse deciding (the page's queries
carry the person's scope to the embedded endpoint, whose row policies hold it): here through a
trusted proxy's headers, sent by the test from the proxy's address, against the hand-computed
estate of tests/harness/scoped_warehouse.py. The browser and real-provider flows are
test_signon_browser.py's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests

from gpugap.schemas.errors import ConfigError
from gpugap.web.signon.settings import SignOnSettings
from tests.harness.scoped_warehouse import (
    JOBS,
    T0,
    ScopedWarehouse,
    allocated_h,
    consumed_h,
    scoped_warehouse,
)
from tests.harness.web_page import Background

pytestmark = pytest.mark.timeout(300)

GROUPS: dict[str, Any] = {
    "team_groups": {"vision-members": "vision", "nlp-members": "nlp"},
    "lead_groups": {"vision-leads": "vision"},
    "admin_groups": ["gpu-admins"],
}
RANGE = {
    "from": str(int((T0 - timedelta(hours=1)).timestamp())),
    "to": str(int((T0 + timedelta(hours=3)).timestamp())),
}
_KEPT: set[int] = set()


def module_children() -> set[int]:
    return _KEPT


@pytest.fixture(scope="module")
def estate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScopedWarehouse]:
    with scoped_warehouse(tmp_path_factory.mktemp("signon")) as found:
        _KEPT.add(found.pid)
        yield found


@pytest.fixture(scope="module")
def page(estate: ScopedWarehouse) -> Iterator[str]:
    settings = SignOnSettings(mode="proxy", trusted_proxies=["127.0.0.1"], **GROUPS)
    server = Background(estate.admin, signon=settings)
    try:
        yield server.url
    finally:
        server.stop()


def as_person(page: str, path: str, user: str, groups: str, **params: str) -> requests.Response:
    headers = {
        "X-Forwarded-User": user,
        "X-Forwarded-Email": f"{user}@example.org",
        "X-Forwarded-Groups": groups,
    }
    return requests.get(page.rstrip("/") + path, params=params, headers=headers, timeout=30)


def waste(page: str, user: str, groups: str, **extra: str) -> set[str]:
    answer = as_person(page, "/api/top_waste", user, groups, **RANGE, **extra)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    index = body["columns"].index("allocation_id")
    return {row[index] for row in body["rows"]}


def ids(*owners: str) -> set[str]:
    return {f"slurm/c/{j.job_id}" for j in JOBS if j.owner in owners}


def test_a_user_sees_their_jobs_a_lead_the_team_an_admin_everything(page: str) -> None:
    assert waste(page, "alice", "vision-members") == ids("alice")
    assert waste(page, "carol", "nlp-members,unrelated") == ids("carol")
    assert waste(page, "dave", "vision-leads") == ids("alice", "bob")
    assert waste(page, "erin", "gpu-admins") == ids("alice", "bob", "carol")
    who = as_person(page, "/api/whoami", "alice", "vision-members").json()
    assert (who["user"], who["role"], who["team"]) == ("alice", "user", "vision")


def test_editing_the_requests_parameters_shows_nothing_more(page: str) -> None:
    # the page's own team filter, set to another team: the engine still narrows to alice's
    assert waste(page, "alice", "vision-members", team="nlp") == set()
    assert waste(page, "alice", "vision-members", team="vision") == ids("alice")
    # another person's allocation, asked for by its id: nothing of it
    mine = as_person(
        page, "/api/allocation", "alice", "vision-members", cluster="c", allocation="slurm/c/101"
    )
    theirs = as_person(
        page, "/api/allocation", "alice", "vision-members", cluster="c", allocation="slurm/c/201"
    )
    assert mine.status_code == theirs.status_code == 200, theirs.text
    assert "alice" in mine.text
    assert "carol" not in theirs.text and "201" not in theirs.text.replace("slurm/c/201", "")
    lead = as_person(
        page, "/api/allocation", "dave", "vision-leads", cluster="c", allocation="slurm/c/101"
    )
    assert "alice" in lead.text


def test_a_person_without_a_role_or_without_a_proxy_is_refused(page: str) -> None:
    answer = as_person(page, "/api/top_waste", "mallory", "strangers", **RANGE)
    assert answer.status_code == 403
    assert "no role" in answer.json()["error"]
    assert requests.get(page + "api/top_waste", params=RANGE, timeout=30).status_code == 401
    assert requests.get(page, timeout=30).status_code == 401
    # the page's files and liveness stay open
    assert requests.get(page + "healthz", timeout=30).status_code == 200


def test_identity_headers_from_an_address_that_is_not_the_proxy_are_refused(
    estate: ScopedWarehouse,
) -> None:
    settings = SignOnSettings(mode="proxy", trusted_proxies=["127.0.0.2"], **GROUPS)
    server = Background(estate.admin, signon=settings)
    try:
        answer = as_person(server.url, "/api/top_waste", "erin", "gpu-admins", **RANGE)
        assert answer.status_code == 403
        assert "proxy" in answer.json()["error"]
        assert as_person(server.url, "/", "erin", "gpu-admins").status_code == 403
    finally:
        server.stop()


def test_metrics_answer_only_their_scrapers_with_sign_on(estate: ScopedWarehouse) -> None:
    settings = SignOnSettings(
        mode="proxy", trusted_proxies=["127.0.0.1"], metrics_clients=["127.0.0.2"], **GROUPS
    )
    server = Background(estate.admin, signon=settings)
    try:
        assert requests.get(server.url + "metrics", timeout=30).status_code == 403
    finally:
        server.stop()


def test_sign_on_is_refused_over_a_warehouse_that_would_not_narrow(
    estate: ScopedWarehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ClickHouse server ignores the scope header: the page must not start over one. The
    check is the endpoint's own answer; here the header is dropped on its way, as a server
    would ignore it."""
    from gpugap.web import server as web_server

    monkeypatch.setattr(web_server, "SCOPE_HEADER", "X-Not-The-Scope")
    settings = SignOnSettings(mode="proxy", trusted_proxies=["127.0.0.1"], **GROUPS)
    with pytest.raises(ConfigError, match="narrows each person's queries"):
        Background(estate.admin, signon=settings)


def test_incomplete_sign_on_settings_say_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="GPUGAP_WEB_SIGNON_ISSUER"):
        SignOnSettings(mode="oidc", **GROUPS)
    with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
        SignOnSettings(mode="proxy", **GROUPS)
    with pytest.raises(ConfigError, match="nobody a role"):
        SignOnSettings(mode="proxy", trusted_proxies=["127.0.0.1"])


def decide(page: str, user: str, groups: str, body: dict[str, Any], **headers: str) -> Any:
    return requests.post(
        page + "api/decide",
        json=body,
        headers={
            "X-Forwarded-User": user,
            "X-Forwarded-Groups": groups,
            "Origin": page.rstrip("/"),
            **headers,
        },
        timeout=30,
    )


def test_a_lead_decides_the_teams_recommendations_and_the_trail_names_them(
    page: str, estate: ScopedWarehouse
) -> None:
    listed = as_person(page, "/api/recommendations", "dave", "vision-leads").json()
    index = listed["columns"].index("id")
    assert {r[index] for r in listed["rows"]} == {"time-alice", "time-bob"}
    assert listed["may_decide"] is True
    answer = decide(
        page, "dave", "vision-leads", {"id": "time-bob", "decision": "accept", "why": "fits"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["decided_by"] == "dave"
    trail = rows_as(
        estate,
        "SELECT decided_by, decision, reason FROM recommendation_decisions WHERE id = 'time-bob'",
    )
    assert trail == [("dave", "accept", "fits")]
    # another team's: not found for him; a user may not decide; another site may not
    assert (
        decide(
            page, "dave", "vision-leads", {"id": "time-carol", "decision": "accept", "why": "x"}
        ).status_code
        == 404
    )
    assert (
        decide(
            page, "alice", "vision-members", {"id": "time-alice", "decision": "reject", "why": "x"}
        ).status_code
        == 403
    )
    cross = decide(
        page,
        "dave",
        "vision-leads",
        {"id": "time-bob", "decision": "reject", "why": "x"},
        Origin="https://elsewhere.example",
    )
    assert cross.status_code == 403
    mine = as_person(page, "/api/recommendations", "alice", "vision-members").json()
    assert {r[index] for r in mine["rows"]} == {"time-alice"} and mine["may_decide"] is False


def rows_as(estate: ScopedWarehouse, sql: str) -> list[tuple[Any, ...]]:
    from gpugap.warehouse.client import connect

    client = connect(estate.admin)
    try:
        return [tuple(r) for r in client.query(sql).result_rows]
    finally:
        client.close()


def test_a_user_sees_their_teams_totals_and_nothing_of_its_jobs(page: str) -> None:
    vision = [j for j in JOBS if j.team == "vision"]
    totals = as_person(page, "/api/team_totals", "alice", "vision-members").json()
    assert totals["team"] == "vision"
    assert totals["allocations"] == len(vision)
    assert totals["allocated_gpu_h"] == pytest.approx(sum(allocated_h(j) for j in vision))
    assert totals["consumed_gpu_h"] == pytest.approx(sum(consumed_h(j) for j in vision))
    # while her own jobs are hers alone
    assert waste(page, "alice", "vision-members") == ids("alice")


def test_the_job_page_answers_a_person_about_their_own_jobs_only(page: str) -> None:
    mine = as_person(page, "/api/job", "alice", "vision-members", id="101").json()
    assert mine["match"] == "one"
    theirs = as_person(page, "/api/job", "alice", "vision-members", id="201").json()
    assert theirs["match"] == "unknown"
    lead = as_person(page, "/api/job", "dave", "vision-leads", id="102").json()
    assert lead["match"] == "one"
