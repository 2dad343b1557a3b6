"""``/metrics`` of ``gpugap web`` on the demo's warehouse: the gauges equal the views, the
real Prometheus scrapes them and its rule file (deploy/prometheus/gpugap-rules.yaml) loads;
hostile label values stay one label; a warehouse that does not answer is
gpugap_warehouse_up 0, not a failed scrape."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpugap.schemas.errors import RetriableError
from gpugap.web import metrics
from gpugap.web.queries import Query
from tests.harness.prometheus import Prometheus, PrometheusBuildError, ensure_built
from tests.web.conftest import DemoWarehouse

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "gpugap-rules.yaml"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"{url}metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def test_the_gauges_are_the_views(page_url: str, demo_warehouse: DemoWarehouse) -> None:
    got = scrape(page_url)
    assert got["gpugap_warehouse_up"] == [({}, 1.0)]
    # the minute before each cluster's newest, summed here from the minutes themselves
    latest = dict(
        demo_warehouse.rows("SELECT cluster, max(minute) FROM gpu_minutes GROUP BY cluster")
    )
    for cluster, newest in latest.items():
        want = demo_warehouse.rows(
            "SELECT sum(allocated_ms) / 60000, sum(consumed_ms) / 60000, "
            "sum(unallocated_ms) / 60000 FROM gpu_minutes FINAL WHERE cluster = {c:String} "
            "AND minute = {m:DateTime('UTC')} - INTERVAL 1 MINUTE",
            c=cluster, m=newest,
        )[0]  # fmt: skip
        for name, value in zip(
            ("gpugap_gpus_allocated", "gpugap_gpus_consumed", "gpugap_gpus_unallocated"),
            want,
            strict=True,
        ):
            have = sum(v for labels, v in got[name] if labels["cluster"] == cluster)
            assert have == pytest.approx(float(value or 0), abs=1e-6), (name, cluster)
        fresh = [v for labels, v in got["gpugap_data_latest_minute_seconds"]
                 if labels["cluster"] == cluster]  # fmt: skip
        assert fresh == [newest.timestamp()]
    assert sum(v for _, v in got["gpugap_gpus_allocated"]) > 0
    idle = demo_warehouse.rows("SELECT count(), sum(gpus) FROM v_idle_now")[0]
    assert sum(v for _, v in got["gpugap_idle_allocations"]) == idle[0]
    assert sum(v for _, v in got["gpugap_gpus_idle"]) == float(idle[1] or 0)
    alerts = demo_warehouse.one("SELECT count() FROM v_alerts_open")
    assert sum(v for _, v in got["gpugap_alerts_open"]) == alerts
    assert alerts > 0  # the demo day ends with alerts open


def test_prometheus_scrapes_them_and_loads_the_rules(page_url: str, tmp_path: Path) -> None:
    try:
        exe, promtool = ensure_built()
    except (PrometheusBuildError, OSError) as exc:
        pytest.fail(f"could not build Prometheus: {exc}")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(yaml.safe_load(RULES.read_text())["spec"]))
    import subprocess

    check = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    target = urllib.parse.urlparse(page_url).netloc
    prom = Prometheus(exe, tmp_path / "tsdb")
    prom.config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{json.dumps(str(rules))}]\n"
        f"scrape_configs:\n  - job_name: gpugap\n    static_configs:\n"
        f"      - targets: [{json.dumps(target)}]\n"
    )
    want = scrape(page_url)
    allocated = sum(v for _, v in want["gpugap_gpus_allocated"])
    with prom:
        deadline = time.monotonic() + 60
        answer: list[Any] = []
        while time.monotonic() < deadline and not answer:
            answer = query(prom, "gpugap:gpus_allocated:sum_by_cluster")
            time.sleep(0.5)
        assert answer, "no gpugap series in Prometheus after 60 s"
        assert sum(float(r["value"][1]) for r in answer) == pytest.approx(allocated, abs=1e-6)
        assert query(prom, "gpugap_warehouse_up")[0]["value"][1] == "1"
        health = get(prom, "/api/v1/targets")["data"]["activeTargets"][0]
        assert health["health"] == "up", health


def get(prom: Prometheus, path: str) -> Any:
    with urllib.request.urlopen(f"{prom.url}{path}", timeout=10) as r:
        return json.loads(r.read())


def query(prom: Prometheus, expr: str) -> list[Any]:
    result: list[Any] = get(prom, f"/api/v1/query?query={urllib.parse.quote(expr)}")["data"][
        "result"
    ]
    return result


def test_the_series_cut_at_max_series_are_the_same_every_scrape() -> None:
    """Each query orders ties by every label it groups by: which 5,000 series a page keeps
    of more does not change from one scrape to the next."""
    for fam in metrics.FAMILIES:
        order = fam.query.split("ORDER BY", 1)[1].split("LIMIT")[0]
        keys = [k.strip().split()[0] for k in order.split(",")]
        assert set(fam.labels) <= set(keys), f"{fam.name}: ORDER BY {order}"


def test_hostile_label_values_stay_one_label_and_a_dead_warehouse_is_up_0() -> None:
    """A quote, a newline, a carriage return (which Prometheus's parser refused the page for)
    and a 4 kB name (5,000 of them made an 80 MB page): each one bounded label."""
    team = 'x"} 1\ngpugap_fake{a="\\'
    cols = ["cluster", "scheduler", "workload_class", "team", "allocated", "consumed"]
    rows = [
        ["c", "slurm", "batch", team, 2.0, 1.0],
        ["c", "slurm", "batch", "cr\rteam", 1.0, 1.0],
        ["c", "slurm", "batch", "t" * 4096, 1.0, 1.0],
    ]

    async def answers(q: Query) -> tuple[list[str], list[Any]]:
        if q.sql != metrics.FAMILIES[0].query:  # the allocated and consumed GPUs now
            return [], []
        return cols, rows

    text = asyncio.run(metrics.Exporter(answers).text())
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert "gpugap_fake" not in fams
    samples = fams["gpugap_gpus_allocated"].samples
    assert [s.labels["team"] for s in samples] == [
        'x"} 1 gpugap_fake{a="\\',
        "cr team",
        "t" * (metrics.LABEL_MAX - 1) + "…",
    ]
    assert samples[0].value == 2.0
    assert max(len(line) for line in text.splitlines()) < 4 * metrics.LABEL_MAX + 200

    calls = 0

    async def down(q: Query) -> tuple[list[str], list[Any]]:
        nonlocal calls
        calls += 1
        raise RetriableError("ClickHouse is unavailable: connection refused")

    exporter = metrics.Exporter(down)
    text = asyncio.run(exporter.text())
    assert "gpugap_warehouse_up 0" in text and "# TYPE gpugap_gpus_allocated gauge" in text
    first = calls
    asyncio.run(exporter.text())  # within CACHE_S: answered from the copy
    assert calls == first
