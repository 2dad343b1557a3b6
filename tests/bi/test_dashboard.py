"""The Grafana dashboard shipped in deploy/grafana/: its JSON and provisioning hold together
with docker-compose.yml, and every panel's SQL, expanded as Grafana and its ClickHouse plugin
expand it (tests/bi/grafana.py: interval and template variables; tests/bi/go/macros.go: the
$__ macros), runs through clickhouse-go v2.47.0 opened as the plugin opens it (HTTP, gzip), as
the read-only user, on the demo's warehouse (tests/harness/demo_data.py), and returns rows."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from gpugap.groundfloor.settings import ClickHouseSettings
from tests.bi import grafana
from tests.bi.conftest import built, run_json
from tests.harness import bi_drivers as drivers
from tests.harness.warehouse import READER_PASSWORD, DemoWarehouse

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "gpugap.json").read_text())
DATASOURCES = yaml.safe_load(
    (GRAFANA / "provisioning" / "datasources" / "clickhouse.yaml").read_text()
)
PROVIDERS = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "gpugap.yaml").read_text())
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PLUGIN = "grafana-clickhouse-datasource"
PANEL_WIDTH = 1000  # max data points when a panel sets none: its width in pixels
REPEAT = 7  # runs of each panel query; the median is the figure
LIMIT_MS = 200.0
# what the demo's warehouse must show with every variable on "All": panels answering "now"
# have rows because the demo day ends with idle allocations and open alerts in it
EXPECTED_EMPTY: set[str] = set()


def panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def variables() -> list[dict[str, Any]]:
    return list(DASHBOARD["templating"]["list"])


# --- the files -----------------------------------------------------------------------------


def test_dashboard_json_structure() -> None:
    [ds] = DATASOURCES["datasources"]
    ref = {"type": PLUGIN, "uid": ds["uid"]}
    assert ds["type"] == PLUGIN
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 36
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert {v["name"] for v in variables()} == {"cluster", "team", "class"}
    for v in variables():
        assert v["type"] == "query" and v["datasource"] == ref, v["name"]
        assert v["multi"] and v["includeAll"], v["name"]
        assert isinstance(v["query"], str) and v["query"].strip(), v["name"]
    titles = [p["title"] for p in panels()]
    assert len(titles) == len(set(titles)), "panel titles repeat"
    for p in panels():
        assert p["datasource"] == ref, p["title"]
        assert p["targets"], f"{p['title']}: no target"
        for t in p["targets"]:
            assert t["datasource"] == ref, p["title"]
            assert t["editorType"] == "sql" and t["rawSql"].strip(), p["title"]
            assert t["format"] in (0, 1), p["title"]  # sqlds: time series, table
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


def test_provisioning_matches_compose() -> None:
    service = COMPOSE["services"]["grafana"]
    assert service["image"].startswith("grafana/grafana:")
    env = service["environment"]
    plugins = env.get("GF_PLUGINS_PREINSTALL_SYNC") or env.get("GF_PLUGINS_PREINSTALL") or ""
    assert any(p.split("@")[0] == PLUGIN for p in plugins.split(",")), plugins
    mounted = {c["target"]: COMPOSE["configs"][c["source"]]["file"] for c in service["configs"]}
    for target, source in mounted.items():
        assert (ROOT / source).is_file(), f"{target}: {source} is not in the repository"
    provisioned = {Path(t).parent.name: Path(s).resolve() for t, s in
                   ((t, ROOT / s) for t, s in mounted.items())}  # fmt: skip
    assert provisioned["datasources"] == (GRAFANA / "provisioning/datasources/clickhouse.yaml")
    assert provisioned["dashboards"] == (GRAFANA / "provisioning/dashboards/gpugap.yaml")
    [provider] = PROVIDERS["providers"]
    json_target = next(t for t in mounted if t.endswith(".json"))
    assert Path(json_target).parent == Path(provider["options"]["path"])
    assert ROOT / mounted[json_target] == GRAFANA / "dashboards" / "gpugap.json"
    # the datasource: the compose ClickHouse over HTTP, credentials from Grafana's environment
    [ds] = DATASOURCES["datasources"]
    j = ds["jsonData"]
    assert j["protocol"] == "http" and j["port"] == 8123 and j["defaultDatabase"] == "gpugap"
    for key, value in (("host", j["host"]), ("username", j["username"]),
                       ("password", ds["secureJsonData"]["password"])):  # fmt: skip
        name = value.removeprefix("${").removesuffix("}")
        assert name in env, f"{key}: {value} is not set in the grafana service"
    assert env["CLICKHOUSE_HOST"] == "clickhouse" and "clickhouse" in COMPOSE["services"]
    # the compose ClickHouse server has one user (its image makes no read-only one)
    assert (
        COMPOSE["services"]["clickhouse"]["environment"]["CLICKHOUSE_USER"]
        == env["CLICKHOUSE_USER"]
    )
    assert set(service["depends_on"]) <= set(COMPOSE["services"])


# --- the expansion -------------------------------------------------------------------------


def _go(steps: list[dict[str, Any]], **conn: str) -> list[dict[str, Any]]:
    script = {"addr": conn.get("addr", "127.0.0.1:1"), "user": conn.get("user", "default"),
              "password": conn.get("password", ""), "database": conn.get("database", ""),
              "compression": "gzip", "steps": steps}  # fmt: skip
    binary = str(built(drivers.clickhouse_go))
    out = run_json([binary], json.dumps(script), "the clickhouse-go program")
    assert isinstance(out, list) and len(out) == len(steps), out
    return out


def _range(start: datetime, end: datetime, interval: int) -> dict[str, Any]:
    return {"from": start.isoformat().replace("+00:00", "Z"),
            "to": end.isoformat().replace("+00:00", "Z"), "interval_ms": interval}  # fmt: skip


def test_macro_expansion_follows_the_plugin() -> None:
    """The plugin's own test expectations (pkg/macros/macros_test.go, v4.20.0) for the macros
    the dashboard uses, and macropro's rules: longest name first, comments blanked."""
    start = datetime(2026, 11, 2, tzinfo=UTC)
    end = start + timedelta(days=1)
    cases = {
        "$__timeFilter(hour)": "hour >= toDateTime(1793577600) AND hour <= toDateTime(1793664000)",
        "$__timeInterval(hour)": "toStartOfInterval(toDateTime(hour), INTERVAL 3600 second)",
        "$__interval_s": "3600",
        "$__interval_ms": "3600000",
        "$__interval": "1h",
        "$__fromTime, $__toTime": "toDateTime(1793577600), toDateTime(1793664000)",
        "$__fromTime_ms": "fromUnixTimestamp64Milli(1793577600000)",
        "$__timeFilter_ms(t)": (
            "t >= fromUnixTimestamp64Milli(1793577600000) AND "
            "t <= fromUnixTimestamp64Milli(1793664000000)"
        ),
        "$__dateFilter(d)": "d >= toDate('2026-11-02') AND d <= toDate('2026-11-03')",
        "$__timeGroup(t, '5m')": "toStartOfInterval(toDateTime(t), INTERVAL 300 second)",
        "$__timeInterval_ms(t)": (
            "toStartOfInterval(toDateTime64(t, 3), INTERVAL 3600000 millisecond)"
        ),
        "x -- $__timeFilter(a)\ny": "x " + " " * len("-- $__timeFilter(a)") + "\ny",
        "$__unknown(a) $__timeFromX": "$__unknown(a) $__timeFromX",
        "f(toDate($__fromTime))": "f(toDate(toDateTime(1793577600)))",
    }  # fmt: skip
    out = _go([{"op": "expand", "sql": sql, "grafana": _range(start, end, 3600000)}
               for sql in cases])  # fmt: skip
    for (sql, want), got in zip(cases.items(), out, strict=True):
        assert not got["error"], (sql, got["error"])
        assert got["expanded"] == want, sql
    [bad] = _go([{"op": "expand", "sql": "$__timeFilter(a, b)", "grafana": _range(start, end, 1)}])
    assert "expected 1 argument(s), received 2" in bad["error"]


def test_template_variables_as_grafana_replaces_them() -> None:
    vs = {
        "cluster": grafana.Variable("cluster", ["hpc", "k8s"]),
        "team": grafana.Variable("team", ["nlp", "vision"], current=["nlp", "vision"]),
        "class": grafana.Variable("class", ["batch"], current=["batch"]),
    }
    raw = ("WHERE $__conditionalAll(cluster IN ($cluster), $cluster) "
           "AND $__conditionalAll(team IN ($team), $team) AND c IN (${class}) "
           "AND x IN ($cluster) AND $__timeFilter(t) AND i = '$__interval'")  # fmt: skip
    start = datetime(2026, 11, 2, tzinfo=UTC)
    got = grafana.panel_sql(raw, vs, start, start + timedelta(days=1), 3600000)
    assert got == (
        "WHERE 1=1 AND team IN ('nlp','vision') AND c IN ('batch') "
        "AND x IN ('hpc','k8s') AND $__timeFilter(t) AND i = '1h'"
    )
    assert grafana.calculate_interval(start, start + timedelta(days=1), 1000, "1h") == 3600000
    assert grafana.calculate_interval(start, start + timedelta(hours=1), 1000, None) == 5000
    assert grafana.calculate_interval(start, start + timedelta(days=30), 1000, "1h") == 3600000


# --- on the demo's data --------------------------------------------------------------------


@dataclass
class Demo:
    settings: ClickHouseSettings
    addr: str
    start: datetime
    end: datetime
    loaded: dict[str, Any]


@pytest.fixture(scope="module")
def demo(demo_warehouse: DemoWarehouse) -> Demo:
    """The session's demo warehouse (tests/conftest.py), which the panels only read."""
    from urllib.parse import urlparse

    from gpugap.simulator import scenario

    settings = demo_warehouse.settings
    sc = scenario.load("demo").scenario
    start = sc.start.astimezone(UTC)
    url = urlparse(settings.url)
    return Demo(settings, f"{url.hostname}:{url.port or 8123}", start,
                start + timedelta(seconds=sc.duration), demo_warehouse.loaded)  # fmt: skip


def _reader(demo: Demo, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As the provisioned datasource connects: the read-only user, the default database."""
    s = demo.settings
    pw = s.readonly_password.get_secret_value() if s.readonly_password else READER_PASSWORD
    return _go(steps, addr=demo.addr, user=s.readonly_user, password=pw, database=s.database)


def _resolve_variables(demo: Demo, current: dict[str, list[str]]) -> dict[str, grafana.Variable]:
    """Run each variable's query in dashboard order (a later one may use an earlier one), as
    the plugin's metricFindQuery does: the frontend's replacement, then the backend's."""
    out: dict[str, grafana.Variable] = {}
    rng = _range(demo.start, demo.end, grafana.round_interval(
        (demo.end - demo.start).total_seconds() * 1000 / PANEL_WIDTH))  # fmt: skip
    for v in variables():
        sql = grafana.panel_sql(v["query"], out, demo.start, demo.end, rng["interval_ms"])
        [res] = _reader(demo, [{"op": "query", "sql": sql, "grafana": rng}])
        assert not res["error"], f"variable {v['name']}: {res['error']}\n{res['expanded']}"
        options = [r[0] for r in res["rows"]]
        assert options, f"variable {v['name']} has no options on the demo's data"
        out[v["name"]] = grafana.Variable(v["name"], options, current.get(v["name"], [grafana.ALL]))
    return out


def _run_panels(demo: Demo, vs: dict[str, grafana.Variable]) -> dict[str, dict[str, Any]]:
    steps, titles = [], []
    for p in panels():
        interval = grafana.calculate_interval(
            demo.start, demo.end, p.get("maxDataPoints") or PANEL_WIDTH, p.get("interval")
        )
        for t in p["targets"]:
            sql = grafana.panel_sql(t["rawSql"], vs, demo.start, demo.end, interval)
            steps.append({"op": "query", "sql": sql, "repeat": REPEAT,
                          "grafana": _range(demo.start, demo.end, interval)})  # fmt: skip
            titles.append(f"{p['title']} [{t['refId']}]")
    return dict(zip(titles, _reader(demo, steps), strict=True))


def _report(label: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{label}: rows, median / max of {REPEAT} runs (ms), clickhouse-go HTTP gzip")
    for title, r in results.items():
        ms = r["elapsed_ms"] or [float("nan")]
        rows = len(r["rows"] or [])
        print(f"  {title:<60} {rows:>5} rows {statistics.median(ms):>7.1f} {max(ms):>7.1f}")


def test_every_panel_answers_on_the_demo(demo: Demo) -> None:
    print(f"\ndemo warehouse: {demo.loaded}")
    results = _run_panels(demo, _resolve_variables(demo, {}))
    _report("every variable on All", results)
    for title, r in results.items():
        assert not r["error"], f"{title}: {r['error']}\n--- expanded\n{r['expanded']}"
        assert "$" not in r["expanded"], f"{title}: left unexpanded:\n{r['expanded']}"
        if title.split(" [")[0] not in EXPECTED_EMPTY:
            assert r["rows"], f"{title}: no rows on the demo's data\n{r['expanded']}"
    medians = {t: statistics.median(r["elapsed_ms"]) for t, r in results.items()}
    slow = {t: ms for t, ms in medians.items() if ms >= LIMIT_MS}
    assert not slow, f"panels at or over {LIMIT_MS:.0f} ms (median of {REPEAT}): {slow}"


def test_panels_with_a_selection(demo: Demo) -> None:
    """One cluster, two teams, one class: the multi-value quoting ('a','b') reaches
    ClickHouse and narrows the answers."""
    everything = _resolve_variables(demo, {})
    pick = {
        "cluster": everything["cluster"].options[:1],
        "team": everything["team"].options[:2],
        "class": everything["class"].options[:1],
    }
    vs = _resolve_variables(demo, pick)
    results = _run_panels(demo, vs)
    _report(f"cluster={pick['cluster']} team={pick['team']} class={pick['class']}", results)
    raw = {f"{p['title']} [{t['refId']}]": t["rawSql"] for p in panels() for t in p["targets"]}
    teams = "'" + "','".join(pick["team"]) + "'"
    for title, r in results.items():
        assert not r["error"], f"{title}: {r['error']}\n--- expanded\n{r['expanded']}"
        if "($team)" in raw[title]:
            assert f"IN ({teams})" in r["expanded"], title
    totals = results["GPU-hours in the range [A]"]
    [[allocated, *_]] = totals["rows"]
    all_totals = _run_panels(demo, everything)["GPU-hours in the range [A]"]
    [[all_allocated, *_]] = all_totals["rows"]
    assert 0 < float(allocated) < float(all_allocated)
