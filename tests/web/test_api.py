"""The page's API: only named queries, every parameter validated and bounded, values bound (never
SQL text), read-only, loopback-only, and every asset shipped in the package."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import pytest
import requests

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.web import params, queries
from gpugap.web.server import HEADERS, assets, reader
from tests.web.conftest import DemoWarehouse

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def q(**kw: object) -> dict[str, list[str]]:
    return {k: v if isinstance(v, list) else [str(v)] for k, v in kw.items()}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (q(sql="SELECT 1"), "unknown parameter"),
        (q(to=1, **{"from": 2}), "before"),
        (q(**{"from": "1e9"}), "whole seconds"),
        (q(**{"from": -5}), "whole seconds"),
        (q(to=4_102_444_801), "whole seconds"),
        (q(to=10**12), "whole seconds"),
        (q(to=500 * 86400, **{"from": 0}), "at most 400 days"),
        (q(team=[f"t{i}" for i in range(51)]), "at most 50"),
        (q(team="x" * 129), "printable"),
        (q(cluster="a\nb"), "printable"),
        (q(cluster=""), "printable"),
        (q(by="owner"), "by:"),
        (q(by=["class", "team"]), "once"),
        (q(limit=0), "limit"),
        (q(limit=201), "limit"),
        (q(limit="1; DROP"), "limit"),
    ],
)
def test_bad_parameters_are_refused_with_a_reason(given: dict[str, list[str]], why: str) -> None:
    with pytest.raises(params.BadRequest, match=why):
        params.filters(given, NOW)


def test_good_parameters_become_bound_values_never_sql() -> None:
    evil = "x' OR 1=1 --"
    f = params.filters(q(team=[evil, "b", evil], by="team", limit=7), NOW)
    assert f.teams == ("b", evil) and f.by == "team" and f.limit == 7
    assert (f.until - f.since).total_seconds() == 86400  # the default: the last 24 hours
    for build in queries.FILTERED.values():
        query = build(f)
        assert evil not in query.sql
        assert set(re.findall(r"\{(\w+):", query.sql)) == set(query.params)
    # the dimension is a column name from a fixed map, chosen by the validated value
    assert " team AS g" in queries.timeseries(f).sql
    key = params.allocation(q(cluster="c1", allocation=evil))
    assert evil not in queries.allocation_timeline(key).sql
    with pytest.raises(params.BadRequest):
        params.allocation(q(cluster="c1"))


def test_long_ranges_chart_daily_rows_in_few_buckets() -> None:
    week = params.filters(q(to=7 * 86400, **{"from": 0}), NOW)
    assert (queries.buckets(week).grain, queries.buckets(week).step_s) == ("hour", 3600)
    year = params.filters(q(to=365 * 86400, **{"from": 0}), NOW)
    b = queries.buckets(year)
    assert b.grain == "day" and 365 * 86400 / b.step_s <= queries.MAX_POINTS


def test_the_page_queries_as_the_read_only_user() -> None:
    s = ClickHouseSettings(readonly_password="pw")
    assert reader(s).user == s.readonly_user and reader(s).password is not None
    plain = ClickHouseSettings(readonly_password=None)
    assert reader(plain).user == plain.user  # then in readonly=2 mode (warehouse.client.run_query)


def test_every_asset_ships_in_the_package_and_names_no_other_host() -> None:
    files = assets()
    assert {"index.html", "app.js", "tables.js", "app.css", "vendor/chart.umd.min.js",
            "vendor/LICENSE.md"} <= set(files)  # fmt: skip
    assert b"Chart.js v4" in files["vendor/chart.umd.min.js"][:200]
    assert b"MIT" in files["vendor/LICENSE.md"]
    page = b"".join(files[n] for n in ("index.html", "app.js", "tables.js", "app.css"))
    assert not re.search(rb"(src|href)=\"(https?:)?//", page)
    assert not re.search(rb"fetch\(\s*[\"'`]https?:", page)
    # the vendored file is the one the fetch script pins (python -m gpugap.web.vendor)
    from gpugap.web import vendor

    assert vendor.VERSION.encode() in files["vendor/chart.umd.min.js"][:200]
    assert (resources.files("gpugap.web") / "static" / "vendor" / "chart.umd.min.js").is_file()


def test_the_server_answers_only_what_it_should(
    page_url: str, demo_warehouse: DemoWarehouse
) -> None:
    r = requests.get(page_url, timeout=10)
    assert r.status_code == 200 and "text/html" in r.headers["Content-Type"]
    for header, value in HEADERS.items():
        assert r.headers[header] == value
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    ok = requests.get(page_url + "api/summary", params={"team": "x' OR 1=1 --"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["allocated_gpu_h"] == 0  # a value, not SQL
    bad = requests.get(page_url + "api/summary", params={"limit": "999"}, timeout=10)
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    assert requests.get(page_url + "api/drop_everything", timeout=10).status_code == 404
    assert requests.get(page_url + "api/extent?x=1", timeout=10).status_code == 400
    assert requests.post(page_url + "api/summary", data="SELECT 1", timeout=10).status_code == 405
    assert requests.get(page_url + "static/../server.py", timeout=10).status_code == 404
    assert requests.get(page_url + "static/%2e%2e/server.py", timeout=10).status_code == 404
    long = requests.get(page_url + "api/summary?" + "team=a&" * 2000, timeout=10)
    assert long.status_code in (400, 414)
    # DNS rebinding: a request addressed to another host name is refused
    foreign = requests.get(page_url, headers={"Host": "attacker.example"}, timeout=10)
    assert foreign.status_code == 421
    extent = requests.get(page_url + "api/extent", timeout=10).json()
    assert extent["latest"] > extent["first"] > 0
    options = requests.get(page_url + "api/options", timeout=10).json()
    assert options["clusters"] and options["teams"] and options["classes"]


def span(seconds: int) -> params.Filters:
    return params.filters(
        q(to=int(NOW.timestamp()), **{"from": int(NOW.timestamp()) - seconds}), NOW
    )


@pytest.mark.parametrize(
    ("seconds", "grain", "step_s", "source"),
    [
        (3600, "minute", 60, "gpu_minutes"),  # the last hour: 60 one-minute buckets
        (3 * 3600, "minute", 60, "gpu_minutes"),
        (6 * 3600, "minute", 300, "gpu_minutes"),
        (6 * 3600 + 60, "hour", 3600, "v_capacity_gap"),
        (86400, "hour", 3600, "v_capacity_gap"),
        (7 * 86400, "hour", 3600, "v_capacity_gap"),
        (14 * 86400, "hour", 7200, "v_capacity_gap"),
        (30 * 86400, "day", 86400, "v_capacity_gap_daily"),
        (400 * 86400, "day", 2 * 86400, "v_capacity_gap_daily"),
    ],
)
def test_the_time_charts_bucket_follows_the_range(
    seconds: int, grain: str, step_s: int, source: str
) -> None:
    f = span(seconds)
    b = queries.buckets(f)
    assert (b.grain, b.step_s) == (grain, step_s)
    assert 1 < -(-seconds // b.step_s) <= queries.MAX_POINTS
    assert f" FROM {source} " in queries.timeseries(f).sql
    free = queries.unallocated(f).sql
    assert (" FROM gpu_minutes " in free) == (grain == "minute")
    if grain == "minute":  # per-minute rows only over a few hours, read by the key's first column
        for sql in (queries.timeseries(f).sql, free):
            assert "toStartOfHour(minute) >= toStartOfHour({since:" in sql
            assert "toStartOfHour(minute) < {until:" in sql


def test_the_last_hour_is_sixty_minutes_that_add_up_to_the_hour(
    page_url: str, demo_warehouse: DemoWarehouse
) -> None:
    latest = requests.get(page_url + "api/extent", timeout=10).json()["latest"]
    end = -(-(latest + 60) // 3600) * 3600
    hour = {"from": end - 3600, "to": end}
    ts = requests.get(page_url + "api/timeseries", params=hour, timeout=30).json()
    free = requests.get(page_url + "api/unallocated", params=hour, timeout=30).json()
    for body in (ts, free):
        assert (body["grain"], body["step_s"]) == ("minute", 60)
        assert body["t"] == list(range(end - 3600, end, 60))
        assert "minute" in body["bucket"]
    want = demo_warehouse.rows(
        "SELECT sum(allocated_gpu_h), sum(consumed_gpu_h), sum(gap_gpu_h), sum(unmeasured_gpu_h) "
        "FROM v_capacity_gap WHERE hour = toDateTime({h:UInt32}, 'UTC')",
        h=end - 3600,
    )[0]
    got = [sum(ts[k]) / 60 for k in ("allocated", "consumed", "gap", "unmeasured")]
    assert got == pytest.approx([float(v) for v in want], rel=1e-3, abs=1e-3)
    assert sum(sum(g["gap"]) for g in ts["groups"]) / 60 == pytest.approx(float(want[2]), abs=1e-3)
    free_want = demo_warehouse.one(
        "SELECT sum(unallocated_gpu_h) FROM v_unallocated_hourly "
        "WHERE hour = toDateTime({h:UInt32}, 'UTC')",
        h=end - 3600,
    )
    assert free["unallocated_gpu_h"] == pytest.approx(float(free_want), rel=1e-3, abs=1e-3)
    assert sum(free["unallocated"]) / 60 == pytest.approx(float(free_want), rel=1e-3, abs=1e-3)


# the cost section: a rate card for one of the demo's clusters (the others have no rate) and a
# few transfers, written for the test and deleted after it (the other tests read the demo bare)
COST_SOURCE = "test-web-cost"
TRANSFER_COLUMNS = ["event_id", "time", "interval_s", "cluster", "from_env", "to_env", "bytes",
                    "source", "node", "interface", "team", "owner", "allocation_id",
                    "description", "billed_cost", "billed_currency", "ingested_at"]  # fmt: skip


@pytest.fixture
def priced(demo_warehouse: DemoWarehouse) -> Iterator[dict[str, Any]]:
    """A card pricing the demo's first cluster (cloud, per GPU-hour and per GiB to onprem) and
    transfers in its last hour: two on that cluster (one rated, both team "vision"), one on
    a cluster no card names (a bill's own, "no rate")."""
    from gpugap.groundfloor.ratecard import RateCard, write_rate_card

    wh = demo_warehouse
    clusters = [r[0] for r in wh.rows("SELECT DISTINCT cluster FROM gpu_minutes ORDER BY 1")]
    latest = wh.one("SELECT latest_minute FROM v_data_extent")
    when = latest.replace(tzinfo=UTC) if latest.tzinfo is None else latest
    card = RateCard.model_validate({
        "name": "web test card", "currency": "EUR",
        "clusters": {clusters[0]: {"environment": "cloud", "gpu_model": "H100",
                                   "cloud": {"H100": {"on_demand": 6.0}},
                                   "egress_per_gib": {"cloud->onprem": 0.09}}},
    })  # fmt: skip
    now = datetime.now(UTC)
    write_rate_card(wh.admin, card, COST_SOURCE, now)

    def moved(event: str, cluster: str, to_env: str, gib: int, team: str) -> list[Any]:
        return [event, when, 3600.0, cluster, "cloud", to_env, gib << 30, COST_SOURCE, "", "",
                team, "", "", "", None, "", now]  # fmt: skip

    wh.admin.insert("transfers", [
        moved("w1", clusters[0], "onprem", 10, "vision"),
        moved("w2", clusters[0], "onprem", 3, "search"),
        moved("w3", "billed-elsewhere", "onprem", 2, "vision"),
    ], column_names=TRANSFER_COLUMNS)  # fmt: skip
    try:
        yield {"cluster": clusters[0], "clusters": clusters, "card": card}
    finally:
        for table in ("rate_card", "transfer_rate"):
            wh.admin.command(
                f"ALTER TABLE {table} DELETE WHERE updated_at = {{t:DateTime64(3, 'UTC')}} "
                "SETTINGS mutations_sync = 2",
                parameters={"t": now},
            )
        wh.admin.command(
            f"ALTER TABLE transfers DELETE WHERE source = '{COST_SOURCE}' "
            "SETTINGS mutations_sync = 2"
        )


def test_the_cost_table_is_the_reports_per_cluster_with_egress_and_no_rate_totals(
    page_url: str, demo_warehouse: DemoWarehouse, priced: dict[str, Any]
) -> None:
    from gpugap.cost.report import build_cost

    extent = requests.get(page_url + "api/extent", timeout=10).json()
    window = {"from": extent["first"], "to": extent["latest"] + 60}
    got = requests.get(page_url + "api/cost", params=window, timeout=60).json()
    assert got["currency"] == "EUR" and got["rate_card"]["name"] == "web test card"
    rows = [dict(zip(got["columns"], r, strict=True)) for r in got["rows"]]
    want = build_cost(
        demo_warehouse.admin,
        datetime.fromtimestamp(window["from"], UTC),
        datetime.fromtimestamp(window["to"], UTC),
    )
    figures = ("allocated_gpu_h", "allocated_cost", "unallocated_cost",
               "egress_gib", "egress_cost", "total_cost")  # fmt: skip
    assert [r["cluster"] for r in rows] == [r.key for r in want.by_cluster] + ["all"]
    for r, w in zip(rows, [*want.by_cluster, want.totals], strict=True):
        assert r["environment"] == w.environment, r["cluster"]
        assert {k: r[k] for k in figures} == pytest.approx({k: getattr(w, k) for k in figures}), r[
            "cluster"
        ]
    mine = rows[[r["cluster"] for r in rows].index(priced["cluster"])]
    assert mine["egress_gib"] == pytest.approx(13.0)
    assert mine["egress_cost"] == pytest.approx(13 * 0.09)
    assert mine["total_cost"] == pytest.approx(
        mine["allocated_cost"] + mine["unallocated_cost"] + 13 * 0.09
    )
    elsewhere = rows[[r["cluster"] for r in rows].index("billed-elsewhere")]
    assert elsewhere["egress_gib"] == pytest.approx(2.0)
    assert elsewhere["egress_cost"] is None and elsewhere["total_cost"] is None  # never 0
    # a sum with any unknown part is unknown ("no rate" on the page), not the known parts' sum
    assert rows[-1]["cluster"] == "all" and rows[-1]["total_cost"] is None
    assert rows[-1]["egress_cost"] is None and rows[-1]["egress_gib"] == pytest.approx(15.0)

    # the team filter narrows egress; the class filter does not (transfers have no class)
    team = requests.get(page_url + "api/cost", params={**window, "team": "search"},
                        timeout=60).json()  # fmt: skip
    by_team = {r[0]: dict(zip(team["columns"], r, strict=True)) for r in team["rows"]}
    assert by_team[priced["cluster"]]["egress_gib"] == pytest.approx(3.0)
    assert "billed-elsewhere" not in by_team
    cls = demo_warehouse.one("SELECT any(workload_class) FROM v_capacity_gap_daily "
                             "WHERE workload_class != ''")  # fmt: skip
    by_class = requests.get(page_url + "api/cost", params={**window, "class": cls},
                            timeout=60).json()  # fmt: skip
    assert by_class["not_applied"]["egress"] == ["class"] and by_class["filtered"]["class"]
    assert by_class["rows"][-1][got["columns"].index("egress_gib")] == pytest.approx(15.0)
