"""The page in headless Chromium on the demo's day: it loads, every chart draws, and the numbers
it shows are the views' (each compared with a direct SQL query), through every filter."""

from __future__ import annotations

import calendar
import time
from typing import Any

import pytest

from tests.web.conftest import DemoWarehouse, Tab, screenshot

CHARTS = ("chart-time", "chart-split", "chart-free", "chart-padding")
# the same numbers straight from the hourly view: an independent path (the page's totals read
# whole days from the daily view and only the edge hours from this one)
TOTALS = """
SELECT sum(allocated_gpu_h), sum(consumed_gpu_h), sum(gap_gpu_h), sum(unmeasured_gpu_h)
FROM v_capacity_gap
WHERE hour >= toDateTime({since:UInt32}, 'UTC') AND hour < toDateTime({until:UInt32}, 'UTC')
  AND (empty({teams:Array(String)}) OR has({teams:Array(String)}, team))
  AND (empty({classes:Array(String)}) OR has({classes:Array(String)}, workload_class))
  AND (empty({clusters:Array(String)}) OR has({clusters:Array(String)}, cluster))
"""
PAINTED = """(id) => {
  const c = document.getElementById(id);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
  return n;
}"""
POINTS = """(id) => window.gpugapCharts[id].data.datasets
  .reduce((a, d) => a + d.data.filter((v) => v !== null && v !== 0).length, 0)"""


def totals(wh: DemoWarehouse, tab: Tab, teams: Any = (), classes: Any = (),
           clusters: Any = ()) -> tuple[float, ...]:  # fmt: skip
    since, until = tab.window()
    row = wh.rows(TOTALS, since=since, until=until, teams=list(teams), classes=list(classes),
                  clusters=list(clusters))[0]  # fmt: skip
    return tuple(float(v or 0.0) for v in row)


def assert_cards(tab: Tab, want: tuple[float, ...]) -> None:
    got = tuple(tab.value(f"sum-{k}") for k in ("allocated", "consumed", "gap", "unmeasured"))
    assert got == pytest.approx(want, rel=1e-6, abs=1e-3)


def table(tab: Tab, table_id: str) -> list[dict[str, str]]:
    return tab.page.evaluate(
        """(id) => { const t = document.getElementById(id);
          const keys = Array.from(t.tHead.rows[0].cells, (c) => c.dataset.key);
          return Array.from(t.tBodies[0].rows).filter((r) => !r.querySelector('td.empty'))
            .map((r) => Object.fromEntries(keys.map((k, i) => [k, r.cells[i].textContent]))); }""",
        table_id,
    )


def num(text: str) -> float:
    return float(text.replace(",", "").replace("%", "").strip() or "nan")


def test_the_page_loads_draws_every_chart_and_shows_the_views_totals(
    tab: Tab, demo_warehouse: DemoWarehouse, artifacts: Any
) -> None:
    t0 = time.perf_counter()
    tab.open()
    loaded = time.perf_counter() - t0
    for chart in CHARTS:
        assert tab.page.evaluate(PAINTED, chart) > 1000, f"{chart} drew nothing"
    for chart in ("chart-time", "chart-split", "chart-free"):
        assert tab.page.evaluate(POINTS, chart) > 0, f"{chart} has no data"
    want = totals(demo_warehouse, tab)
    assert want[0] > 0, "the demo's warehouse is empty"
    assert_cards(tab, want)
    gap_pct = 100 * want[2] / (want[0] - want[3])
    assert tab.value("sum-gap-pct") == pytest.approx(gap_pct, abs=0.01)
    since, until = tab.window()
    first, latest = demo_warehouse.rows(
        "SELECT toUnixTimestamp(toDateTime(first_day, 'UTC')), toUnixTimestamp(latest_minute) "
        "FROM v_data_extent"
    )[0]
    assert (since, until) == (first, -(-(latest + 60) // 3600) * 3600)  # all the data
    # every asset came from the page's own server, and nothing went wrong in the page
    assert tab.foreign == []
    assert tab.errors == []
    assert loaded < 15, f"the page took {loaded:.1f} s on the demo's day"
    screenshot(tab.page, artifacts, "estate")


def test_filters_change_the_numbers_as_the_views_say(
    tab: Tab, demo_warehouse: DemoWarehouse, artifacts: Any
) -> None:
    tab.open()
    teams = demo_warehouse.rows(
        "SELECT team FROM v_capacity_gap_daily WHERE team != '' GROUP BY team "
        "ORDER BY sum(gap_gpu_h) DESC LIMIT 2"
    )
    assert len(teams) == 2
    chosen = [teams[1][0]]
    before = tab.generation()
    tab.page.select_option("#f-team", chosen)
    tab.page.click("#apply")
    tab.ready(before)
    assert f"team={chosen[0]}" in tab.page.url
    want = totals(demo_warehouse, tab, teams=chosen)
    assert want[0] < totals(demo_warehouse, tab)[0], "the team filter changes nothing"
    assert_cards(tab, want)
    top = table(tab, "t-top")
    assert top and {r["team"] for r in top} == set(chosen)
    # and a class on top of it
    classes = demo_warehouse.rows(
        "SELECT DISTINCT workload_class FROM v_capacity_gap_daily WHERE team = {t:String} "
        "AND workload_class != '' ORDER BY workload_class LIMIT 1",
        t=chosen[0],
    )
    before = tab.generation()
    tab.page.select_option("#f-class", [classes[0][0]])
    tab.page.click("#apply")
    tab.ready(before)
    assert_cards(tab, totals(demo_warehouse, tab, teams=chosen, classes=[classes[0][0]]))
    assert {r["workload_class"] for r in table(tab, "t-top")} <= {classes[0][0]}
    screenshot(tab.page, artifacts, "filtered")
    # a cluster nobody has: everything is zero, and the tables say so
    tab.page.goto(tab.url + "?cluster=no-such-cluster")
    tab.ready(0)
    assert_cards(tab, (0.0, 0.0, 0.0, 0.0))
    assert table(tab, "t-top") == []
    # reset: all of it again
    before = tab.generation()
    tab.page.click("#reset")
    tab.ready(before)
    assert_cards(tab, totals(demo_warehouse, tab))
    assert tab.errors == []


def test_the_time_range_picker_narrows_the_window(tab: Tab, demo_warehouse: DemoWarehouse) -> None:
    tab.open()
    _, end = tab.window()
    before = tab.generation()
    tab.page.select_option("#range-preset", "6")  # last 6 h of the data: applies at once
    tab.ready(before)
    assert tab.window() == (end - 6 * 3600, end)
    assert_cards(tab, totals(demo_warehouse, tab))
    # a custom range, typed in (UTC)
    start = end - 3 * 3600
    text = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(start))
    before = tab.generation()
    tab.page.fill("#from", text)
    tab.page.dispatch_event("#from", "change")
    tab.page.click("#apply")
    tab.ready(before)
    assert tab.window() == (start, end)
    assert_cards(tab, totals(demo_warehouse, tab))
    # the range is in the URL: a reload shows the same window
    url = tab.page.url
    tab.page.goto(url)
    tab.ready(0)
    assert tab.window() == (start, end)


def test_the_gap_over_time_switches_to_scheduler_and_team(
    tab: Tab, demo_warehouse: DemoWarehouse
) -> None:
    tab.open()

    def labels() -> set[str]:
        return set(tab.page.evaluate(
            "window.gpugapCharts['chart-time'].data.datasets.map((d) => d.label)"
        ))  # fmt: skip

    classes = {r[0] for r in demo_warehouse.rows(
        "SELECT DISTINCT workload_class FROM v_capacity_gap_daily")}  # fmt: skip
    assert {f"gap · {c or '(none)'}" for c in classes} <= labels()
    for by, column in (("scheduler", "scheduler"), ("team", "team")):
        before = tab.generation()
        tab.page.select_option("#by", by)
        tab.ready(before)
        values = {r[0] for r in demo_warehouse.rows(
            f"SELECT DISTINCT {column} FROM v_capacity_gap_daily")}  # fmt: skip
        got = {x.removeprefix("gap · ") for x in labels() if x.startswith("gap · ")}
        if len(values) <= 8:
            assert got == {v or "(none)" for v in values}
        else:
            assert len(got) == 9
        assert tab.page.evaluate(PAINTED, "chart-time") > 1000
    # the stacked gap adds up to the total gap (average GPUs per bucket)
    ok = tab.page.evaluate(
        """() => { const ds = window.gpugapCharts['chart-time'].data.datasets;
          const gap = ds.filter((d) => d.stack === 'gap');
          return gap.length > 0 && gap[0].data.length > 0; }"""
    )
    assert ok


def test_top_waste_sorts_and_links_to_the_allocations_gpus(
    tab: Tab, demo_warehouse: DemoWarehouse, artifacts: Any
) -> None:
    tab.open()
    since, until = tab.window()
    want = demo_warehouse.rows(
        "SELECT cluster, allocation_id, sum(gap_gpu_h) AS g FROM v_capacity_gap "
        "WHERE hour >= toDateTime({s:UInt32}, 'UTC') AND hour < toDateTime({u:UInt32}, 'UTC') "
        "GROUP BY cluster, allocation_id ORDER BY g DESC, cluster, allocation_id LIMIT 25",
        s=since, u=until,
    )  # fmt: skip
    rows = table(tab, "t-top")
    assert [r["allocation_id"] for r in rows] == [w[1] for w in want]
    assert [num(r["gap_gpu_h"]) for r in rows] == pytest.approx([w[2] for w in want], abs=0.01)
    # sort by allocated, ascending on a second click
    tab.page.click("#t-top th[data-key='allocated_gpu_h']")
    allocated = [num(r["allocated_gpu_h"]) for r in table(tab, "t-top")]
    assert allocated == sorted(allocated, reverse=True)
    tab.page.click("#t-top th[data-key='allocated_gpu_h']")
    allocated = [num(r["allocated_gpu_h"]) for r in table(tab, "t-top")]
    assert allocated == sorted(allocated)
    # the largest waster's GPUs, hour by hour
    tab.page.click("#t-top th[data-key='gap_gpu_h']")
    cluster, alloc = want[0][0], want[0][1]
    with tab.page.expect_navigation():  # a link: a page of its own
        tab.page.click(f"#t-top a >> text='{alloc}'")
    tab.ready(0)
    assert "view=allocation" in tab.page.url
    assert tab.page.is_hidden("#view-estate")
    gpus = demo_warehouse.rows(
        "SELECT gpu_uuid, sum(gap_gpu_h) FROM v_capacity_gap WHERE cluster = {c:String} "
        "AND allocation_id = {a:String} GROUP BY gpu_uuid ORDER BY gpu_uuid",
        c=cluster, a=alloc,
    )  # fmt: skip
    shown = table(tab, "t-gpus")
    assert sorted(r["gpu_uuid"] for r in shown) == [g[0] for g in gpus]
    by_gpu = {r["gpu_uuid"]: num(r["gap_gpu_h"]) for r in shown}
    assert [by_gpu[g[0]] for g in gpus] == pytest.approx([g[1] for g in gpus], abs=0.01)
    assert tab.page.evaluate(PAINTED, "chart-gpus") > 1000
    assert tab.page.evaluate(POINTS, "chart-gpus") > 0
    screenshot(tab.page, artifacts, "allocation")
    # and back to the estate
    with tab.page.expect_navigation():
        tab.page.click("#back")
    tab.ready(0)
    assert tab.page.is_visible("#view-estate")
    assert tab.errors == []


def test_now_tables_and_padding_are_the_views(tab: Tab, demo_warehouse: DemoWarehouse) -> None:
    tab.open()
    since, until = tab.window()
    for table_id, view in (("t-idle", "v_idle_now"), ("t-gangs", "v_partial_gangs_now"),
                           ("t-alerts", "v_alerts_open")):  # fmt: skip
        n = demo_warehouse.one(f"SELECT count() FROM {view}")
        assert len(table(tab, table_id)) == min(n, 25), table_id
    padded = demo_warehouse.rows(
        "SELECT count(), sum(padding_gpu_h) FROM v_slurm_padding WHERE "
        "end_time >= toDateTime({s:UInt32}, 'UTC') AND end_time < toDateTime({u:UInt32}, 'UTC')",
        s=since, u=until,
    )[0]  # fmt: skip
    assert len(table(tab, "t-padding")) == min(padded[0], 25)
    lost = demo_warehouse.one(
        "SELECT count() FROM (SELECT DISTINCT cause, cluster, queue FROM v_lost_work WHERE "
        "end_time >= toDateTime({s:UInt32}, 'UTC') AND end_time < toDateTime({u:UInt32}, 'UTC'))",
        s=since, u=until,
    )  # fmt: skip
    assert len(table(tab, "t-lost")) == min(lost, 25)
    assert tab.value("sum-padding") == pytest.approx(float(padded[1] or 0), abs=1e-3)
    queues = demo_warehouse.rows(
        "SELECT cluster, queue, sum(gpu_h_waited) FROM v_queue_wait WHERE "
        "start_time >= toDateTime({s:UInt32}, 'UTC') AND start_time < toDateTime({u:UInt32}, "
        "'UTC') GROUP BY cluster, queue",
        s=since, u=until,
    )  # fmt: skip
    shown = {(r["cluster"], r["queue"]): num(r["waited_gpu_h"]) for r in table(tab, "t-queue")}
    assert queues and set(shown) == {(c, q) for c, q, _ in queues}
    for c, q, waited in queues:
        assert shown[c, q] == pytest.approx(waited, abs=0.01), (c, q)
    free = demo_warehouse.rows(
        "SELECT sum(unallocated_gpu_h), sum(unattributed_gpu_h) FROM v_unallocated_hourly "
        "WHERE hour >= toDateTime({s:UInt32}, 'UTC') AND hour < toDateTime({u:UInt32}, 'UTC')",
        s=since, u=until,
    )[0]  # fmt: skip
    assert tab.value("sum-unallocated") == pytest.approx(float(free[0] or 0), rel=1e-6, abs=1e-3)
    assert tab.value("sum-unattributed") == pytest.approx(float(free[1] or 0), rel=1e-6, abs=1e-3)


def test_the_cost_table_shows_egress_and_a_total_and_says_how_to_load_a_card(
    tab: Tab, demo_warehouse: DemoWarehouse
) -> None:
    tab.open()
    heads = tab.page.evaluate(
        "() => Array.from(document.querySelectorAll('#t-cost thead th'), "
        "(th) => [th.dataset.key, th.textContent])"
    )
    keys = [k for k, _ in heads]
    assert {"cluster", "environment", "allocated_gpu_h", "allocated_cost", "unallocated_cost",
            "egress_gib", "egress_cost", "total_cost"} <= set(keys)  # fmt: skip
    assert dict(heads)["egress_gib"] == "egress GiB" and dict(heads)["total_cost"] == "total"
    since, until = tab.window()
    clusters = demo_warehouse.rows(
        "SELECT cluster, sum(allocated_gpu_h) FROM v_capacity_gap WHERE "
        "hour >= toDateTime({s:UInt32}, 'UTC') AND hour < toDateTime({u:UInt32}, 'UTC') "
        "GROUP BY cluster",
        s=since, u=until,
    )  # fmt: skip
    shown = {r["cluster"]: r for r in table(tab, "t-cost")}
    assert set(shown) == {c for c, _ in clusters}
    for c, allocated in clusters:
        assert num(shown[c]["allocated_gpu_h"]) == pytest.approx(allocated, abs=0.01), c
    # the demo has no rate card: every cost is "no rate" (never 0), the totals row too
    assert demo_warehouse.one("SELECT count() FROM rate_card") == 0
    for r in shown.values():
        assert r["total_cost"] == r["allocated_cost"] == "no rate"
    footer = tab.page.evaluate(
        "() => Array.from(document.querySelectorAll('#t-cost tfoot td'), (td) => td.textContent)"
    )
    all_row = dict(zip(keys, footer, strict=True))
    assert all_row["cluster"] == "all" and all_row["total_cost"] == "no rate"
    assert num(all_row["allocated_gpu_h"]) == pytest.approx(sum(a for _, a in clusters), abs=0.05)
    note = tab.page.text_content("#cost-note") or ""
    assert "No rate card" in note and "gpugap cost load" in note
    assert "class filter" in (tab.page.text_content("#cost") or "")
    assert not tab.errors


# what the page's Chart.js charts hold (Chart.getChart: the library's own record of a canvas)
CHART_DATA = """(id) => { const c = Chart.getChart(document.getElementById(id));
  return { labels: c.data.labels, x: c.options.scales.x.title.text || '',
    datasets: c.data.datasets.map((d) => ({ label: d.label, stack: d.stack || '',
      data: d.data })) }; }"""
HOUR_FIGURES = """
SELECT
  (SELECT sum(allocated_gpu_h) FROM v_capacity_gap WHERE hour = toDateTime({h:UInt32}, 'UTC')),
  (SELECT sum(consumed_gpu_h) FROM v_capacity_gap WHERE hour = toDateTime({h:UInt32}, 'UTC')),
  (SELECT sum(gap_gpu_h) FROM v_capacity_gap WHERE hour = toDateTime({h:UInt32}, 'UTC')),
  (SELECT sum(unallocated_gpu_h) FROM v_unallocated_hourly
   WHERE hour = toDateTime({h:UInt32}, 'UTC'))
"""


def bucket_s(labels: list[str]) -> int:
    """The bucket's length, from the chart's own x labels ("YYYY-MM-DD HH:MM", UTC)."""
    t = [calendar.timegm(time.strptime(x, "%Y-%m-%d %H:%M")) for x in labels[:2]]
    return int(t[1] - t[0])


@pytest.mark.parametrize(("hours", "bucket"), [(1, "minute"), (24, "hour"), (30 * 24, "")])
def test_every_range_draws_lines_and_says_its_bucket(
    tab: Tab, demo_warehouse: DemoWarehouse, hours: int, bucket: str
) -> None:
    """Over the last hour, day and 30 days each time chart draws a line of several buckets (the
    last hour per minute, not one hourly point), and its x axis says which bucket."""
    tab.open()
    _, end = tab.window()
    tab.open(f"?preset=custom&from={end - hours * 3600}&to={end}")
    assert tab.window() == (end - hours * 3600, end)
    charts = {c: tab.page.evaluate(CHART_DATA, c) for c in ("chart-time", "chart-free")}
    for chart_id, chart in charts.items():
        assert len(chart["labels"]) > 1, f"{chart_id}: {len(chart['labels'])} bucket(s)"
        lines = [d for d in chart["datasets"] if d["label"] in
                 ("allocated", "consumed", "unallocated")]  # fmt: skip
        assert lines, chart_id
        for d in lines:
            drawn = [v for v in d["data"] if v is not None]
            assert len(drawn) > 1, f"{chart_id} {d['label']}: {len(drawn)} point(s)"
        step = bucket_s(chart["labels"])
        assert "bucket" in chart["x"] and bucket in chart["x"], chart["x"]
        assert len(chart["labels"]) <= max(hours * 3600 // step, 1) + 1
    if hours == 1:
        # one-minute buckets, and they add up to the hour's GPU-hours in the hourly views
        ts, free = charts["chart-time"], charts["chart-free"]
        step_h = bucket_s(ts["labels"]) / 3600
        assert step_h == 1 / 60 and len(ts["labels"]) == 60
        want = [float(v or 0) for v in demo_warehouse.rows(HOUR_FIGURES, h=end - 3600)[0]]
        assert want[0] > 0 and want[3] > 0, "the demo's last hour is empty"

        def total(chart: dict[str, Any], pick: Any) -> float:
            return step_h * sum(v or 0 for d in chart["datasets"] if pick(d) for v in d["data"])

        got = [
            total(ts, lambda d: d["label"] == "allocated"),
            total(ts, lambda d: d["label"] == "consumed"),
            total(ts, lambda d: d["stack"] == "gap"),
            total(free, lambda d: d["label"] == "unallocated"),
        ]
        assert got == pytest.approx(want, rel=1e-3, abs=1e-3)
    assert tab.errors == []
