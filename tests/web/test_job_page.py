"""The job page (/job, gpugap.web.pages) and its API (/api/job) in headless Chromium: on
hand-computed allocations (tests/gpugap/job_data.py) it shows the figures and the advice,
lists an ambiguous id's candidates as links and says when an id names nothing; on the demo's
day its figures are the views' and the main page links to it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.client import connect
from gpugap.web import api, pages, params
from gpugap.web.queries import Query
from gpugap.web.server import assets
from tests.gpugap.job_data import records
from tests.harness.warehouse import DemoWarehouse
from tests.harness.web_page import Background
from tests.warehouse.test_views import store
from tests.web.conftest import Tab, screenshot
from tests.web.test_page import PAINTED

T = TypeVar("T")
SETTLED = "() => document.body.dataset.state !== 'loading'"


def off_the_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn`` in a thread of its own: Playwright's sync API keeps an event loop running in
    this one, and asyncio.run (the sink, the API) refuses to start under it."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def with_job_page(app: Any) -> None:
    """/job on the page's app, unless gpugap web already serves it."""
    if not any(r.canonical == "/job" for r in app.router.resources()):
        pages.add_routes(app, assets())


def serve(settings: ClickHouseSettings) -> Background:
    return Background(settings, routes=with_job_page)


@pytest.fixture(scope="module")
def demo_url(demo_warehouse: DemoWarehouse) -> Iterator[str]:
    server = serve(demo_warehouse.settings)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def jobs_url(clickhouse: ClickHouseSettings) -> Iterator[str]:
    off_the_loop(store, clickhouse, records())
    server = serve(clickhouse)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    """A tab (tests/web/conftest.py's Tab); its console errors and requests to other hosts fail
    the test, but those it takes out of ``errors`` itself."""
    t = Tab(browser.new_page(), "")
    t.page.on("console", lambda m: t.errors.append(m.text) if m.type == "error" else None)
    t.page.on("pageerror", lambda e: t.errors.append(str(e)))
    t.page.on("request", lambda r: None if r.url.startswith("http://127.0.0.1:") else
              t.foreign.append(r.url))  # fmt: skip
    try:
        yield t
    finally:
        t.page.close()
    assert not t.errors and not t.foreign, (t.errors, t.foreign)


def open_job(tab: Tab, url: str, query: str) -> str:
    page = tab.page
    page.goto(f"{url}job?{query}")
    page.wait_for_function(SETTLED, timeout=60_000)
    assert page.get_attribute("body", "data-state") == "ready", page.text_content("#status")
    return str(page.get_attribute("body", "data-match"))


def value(tab: Tab, element_id: str) -> float:
    page = tab.page
    return float(page.get_attribute(f"#{element_id}", "data-value") or "nan")


def test_the_page_shows_a_two_gpu_job_that_used_one(
    tab: Tab, jobs_url: str, artifacts: Any
) -> None:
    page = tab.page
    assert open_job(tab, jobs_url, "id=1") == "one"
    assert page.text_content("#job-title") == "Job 1 · cluster c · slurm"
    cards = {k: value(tab, f"j-{k}") for k in ("allocated", "consumed", "gap", "idle", "padding",
                                                  "wait")}  # fmt: skip
    assert cards == pytest.approx(
        {"allocated": 4, "consumed": 1.8, "gap": 2.2, "idle": 2, "padding": 12, "wait": 10}
    )
    said = page.eval_on_selector_all("#advice li strong", "els => els.map(e => e.textContent)")
    assert said == ["ask for 1 GPU", "--time=2:30:00"]
    assert "#SBATCH --gpus=1" in page.text_content("#advice")
    for chart in ("chart-util", "chart-memory"):
        assert page.evaluate(PAINTED, chart) > 1000, f"{chart} drew nothing"
    assert page.eval_on_selector_all("#t-gpus tbody tr", "rows => rows.length") == 2
    screenshot(page, artifacts, "job")


def test_an_ambiguous_id_links_to_each_candidate(tab: Tab, jobs_url: str) -> None:
    page = tab.page
    assert open_job(tab, jobs_url, "id=7") == "ambiguous"
    links = page.eval_on_selector_all("#t-candidates tbody a", "as => as.map(a => a.textContent)")
    assert links == ["slurm/c/7#1", "slurm/c/7"]
    page.click("#t-candidates a >> text='slurm/c/7#1'")
    page.wait_for_function(SETTLED, timeout=60_000)
    assert page.get_attribute("body", "data-match") == "one"
    assert "slurm/c/7#1" in page.text_content("#job-meta")


def test_an_unknown_or_malformed_id_says_so(tab: Tab, jobs_url: str) -> None:
    page = tab.page
    assert open_job(tab, jobs_url, "id=424242") == "unknown"
    assert "no allocation matches '424242'" in page.text_content("#status")
    page.goto(f"{jobs_url}job?id=a%20b")
    page.wait_for_function(SETTLED, timeout=60_000)
    assert page.get_attribute("body", "data-state") == "error"
    assert "id:" in page.text_content("#status")
    assert tab.errors == [  # the 400 (Chromium says so on the console): nothing else
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]
    tab.errors.clear()


def test_the_api_validates_its_parameters() -> None:
    for bad, words in (({}, "id is required"), ({"id": ["1"], "x": ["2"]}, "unknown parameter"),
                       ({"id": ["1", "2"]}, "give it once"), ({"id": ["a/b/c"]}, "id:"),
                       ({"id": ["1"], "cluster": [""]}, "cluster")):  # fmt: skip
        with pytest.raises(params.BadRequest, match=words):
            params.job(bad)


def _answer(settings: ClickHouseSettings, **query: str) -> dict[str, Any]:
    client = connect(settings)

    async def run(q: Query) -> tuple[list[str], list[Any]]:
        result = client.query(q.sql, parameters=q.params)
        return list(result.column_names), [list(r) for r in result.result_rows]

    try:
        return off_the_loop(asyncio.run, api.answer("job", {k: [v] for k, v in query.items()}, run))
    finally:
        client.close()


def test_on_the_demo_the_page_shows_the_views_figures(
    tab: Tab, demo_url: str, demo_warehouse: DemoWarehouse
) -> None:
    page = tab.page
    wh = demo_warehouse
    cluster, aid, allocated, consumed, gap = wh.rows(
        "SELECT cluster, allocation_id, allocated_gpu_h, consumed_gpu_h, gap_gpu_h "
        "FROM v_top_waste ORDER BY gap_gpu_h DESC, allocation_id LIMIT 1"
    )[0]
    body = _answer(wh.settings, id=aid, cluster=cluster)
    assert body["match"] == "one"
    assert body["job"]["figures"]["gap_gpu_h"] == round(gap, 4)
    # the main page's allocation view links to it
    page.goto(f"{demo_url}?view=allocation&acluster={cluster}&allocation={aid}")
    page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=60_000)
    page.click("#job-link")
    page.wait_for_function(SETTLED, timeout=60_000)
    assert page.get_attribute("body", "data-match") == "one"
    got = [value(tab, f"j-{k}") for k in ("allocated", "consumed", "gap")]
    assert got == pytest.approx([allocated, consumed, gap], abs=1e-4)
    assert page.evaluate(PAINTED, "chart-util") > 1000
