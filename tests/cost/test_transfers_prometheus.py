"""The node-interface source of boundary transfers against a REAL Prometheus (built once into
~/.cache/gpugap, harness/prometheus.py) holding recorded-like node_exporter counters, loaded as
history with ``promtool tsdb create-blocks-from openmetrics``: two nodes with an uplink
(``bond0``, the boundary) and a local interface, a node outside the link, a counter reset
between two steps. Every expected figure is the counters' increase worked out by hand."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.ratecard import RateCard
from gpugap.groundfloor.settings import ClickHouseSettings, Settings
from gpugap.producers import plugin, run_producer
from gpugap.producers.transfers.node_exporter import TransfersPrometheus, chunks, grid, node_name
from gpugap.producers.transfers.prometheus_settings import TransfersPrometheusSettings
from gpugap.schemas.models import Transfer
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from tests.cost.estate import CARD, T0
from tests.cost.test_cost_views import query
from tests.harness.prometheus import (
    Prometheus,
    PrometheusBuildError,
    ensure_built,
    load_openmetrics,
)

pytestmark = pytest.mark.timeout(1800)  # the first test may build Prometheus (about 8 min)

SCRAPE_S = 15
START = int(T0.timestamp()) - 300  # recorded from 5 min before the range
SAMPLES = 35 * 60 // SCRAPE_S + 1  # to 30 min after T0
RESET_AT = int(T0.timestamp()) + 10 * 60 + 30  # hpc-02 reboots between the 10th and 11th step
AFTER_RESET = 700_000  # what its transmit counter says at the first scrape after the reboot
LINK = {"cluster": "hpc", "node": "hpc-.*", "device": "bond0", "matchers": 'job="node"'}
RATES = {"onprem->cloud": 0.05, "cloud->onprem": 0.01}


def counter(base: int, per_scrape: int, reset_at: int | None = None) -> list[tuple[int, int]]:
    """(time, value) every scrape; from ``reset_at`` the counter starts again from 0."""
    out, value = [], base
    for i in range(SAMPLES):
        t = START + i * SCRAPE_S
        if reset_at is not None and t == reset_at:
            value = AFTER_RESET
        else:
            value += per_scrape + (i % 7) * 1_000  # not a constant rate
        out.append((t, value))
    return out


#: (instance, device, "transmit"|"receive") -> the recorded samples
SERIES: dict[tuple[str, str, str], list[tuple[int, int]]] = {
    ("hpc-01:9100", "bond0", "transmit"): counter(10**12, 1_000_000),
    ("hpc-01:9100", "bond0", "receive"): counter(4 * 10**11, 500_000),
    ("hpc-01:9100", "eth1", "transmit"): counter(10**9, 9_000_000),  # local: not the boundary
    ("hpc-01:9100", "eth1", "receive"): counter(10**9, 9_000_000),
    ("hpc-01:9100", "lo", "transmit"): counter(0, 100),
    ("hpc-02:9100", "bond0", "transmit"): counter(5 * 10**11, 2_000_000, RESET_AT),
    ("hpc-02:9100", "bond0", "receive"): counter(10**10, 300_000),
    ("hpc-02:9100", "eth1", "receive"): counter(0, 7_000_000),
    ("login-01:9100", "bond0", "transmit"): counter(0, 3_000_000),  # not a node of the link
}


def openmetrics() -> str:
    lines = []
    for way in ("transmit", "receive"):
        lines.append(f"# HELP node_network_{way}_bytes Network device statistic {way}_bytes.")
        lines.append(f"# TYPE node_network_{way}_bytes counter")
        for (instance, device, w), samples in SERIES.items():
            if w != way:
                continue
            labels = f'device="{device}",instance="{instance}",job="node"'
            lines += [f"node_network_{way}_bytes_total{{{labels}}} {v} {t}" for t, v in samples]
    return "\n".join([*lines, "# EOF", ""])


def by_hand(instance: str, device: str, way: str) -> int:
    """The counter's increase over [T0, T0 + 30 min], a drop being a restart from 0."""
    lo, hi = int(T0.timestamp()), int(T0.timestamp()) + 1800
    samples = [(t, v) for t, v in SERIES[(instance, device, way)] if lo <= t <= hi]
    return sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(samples))


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus on the recorded counters; a build or start that fails fails."""
    try:
        exe, promtool = ensure_built()
    except (PrometheusBuildError, OSError) as exc:
        pytest.fail(f"could not build Prometheus: {exc}")
    root = tmp_path_factory.mktemp("prometheus")
    try:
        load_openmetrics(promtool, openmetrics(), root / "tsdb")
        with Prometheus(exe, root / "tsdb") as prom:
            yield prom
    except (PrometheusBuildError, RuntimeError) as exc:
        pytest.fail(f"could not start Prometheus on the recorded counters: {exc}")


def produce(
    prom: Prometheus, out: Path, links: list[dict[str, Any]] | None = None, **more: Any
) -> list[Transfer]:
    cfg = TransfersPrometheusSettings(
        url=prom.url,
        links=links or [{**LINK, "from_env": "onprem", "to_env": "cloud"}],
        since=T0.isoformat(),
        until=(T0 + timedelta(minutes=30)).isoformat(),
        **more,
    )
    producer = TransfersPrometheus(Settings(), cfg)
    asyncio.run(run_producer(producer, JsonlPublisher(out)))
    return [
        Transfer.model_validate(json.loads(line)["value"]) for line in out.read_text().splitlines()
    ]


def totals(records: list[Transfer]) -> dict[tuple[str, str, str, str], int]:
    out: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for r in records:
        out[(r.node or "", r.interface or "", r.from_env, r.to_env)] += r.bytes
    return dict(out)


def test_transfers_are_the_counters_increases(prometheus: Prometheus, tmp_path: Path) -> None:
    records = produce(prometheus, tmp_path / "t.jsonl")
    assert totals(records) == {
        ("hpc-01", "bond0", "onprem", "cloud"): by_hand("hpc-01:9100", "bond0", "transmit"),
        ("hpc-01", "bond0", "cloud", "onprem"): by_hand("hpc-01:9100", "bond0", "receive"),
        ("hpc-02", "bond0", "onprem", "cloud"): by_hand("hpc-02:9100", "bond0", "transmit"),
        ("hpc-02", "bond0", "cloud", "onprem"): by_hand("hpc-02:9100", "bond0", "receive"),
    }  # only the link's interfaces on the link's nodes: no eth1, lo or login-01
    # one record per node, interface, direction and step of the half hour
    assert len(records) == 4 * 30
    assert {r.interval_s for r in records} == {60.0}
    assert {r.time for r in records} == {T0 + timedelta(minutes=m) for m in range(30)}
    assert {(r.cluster, r.source) for r in records} == {("hpc", "node_exporter")}
    # the reset: the step over it counts what was sent before the reboot and after it
    step = next(
        r
        for r in records
        if r.node == "hpc-02" and r.to_env == "cloud" and r.time == T0 + timedelta(minutes=10)
    )
    before = dict(SERIES[("hpc-02:9100", "bond0", "transmit")])
    t10 = int(T0.timestamp()) + 600
    assert step.bytes == (before[t10 + 15] - before[t10]) + AFTER_RESET + (
        before[t10 + 45] - AFTER_RESET
    ) + (before[t10 + 60] - before[t10 + 45])


def test_chunked_queries_and_reruns_give_the_same_ids(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    first = produce(prometheus, tmp_path / "a.jsonl")
    # 7 steps per query: the half hour in 5 chunks, the counters carried across them
    again = produce(prometheus, tmp_path / "b.jsonl", points_per_query=7)
    assert sorted((r.event_id, r.bytes) for r in again) == sorted(
        (r.event_id, r.bytes) for r in first
    )
    assert len({r.event_id for r in first}) == len(first)
    # two adjacent runs cover the range once: no overlap, no hole
    halves = [
        *produce_window(prometheus, tmp_path / "c.jsonl", 0, 13),
        *produce_window(prometheus, tmp_path / "d.jsonl", 13, 30),
    ]
    assert sorted(r.event_id for r in halves) == sorted(r.event_id for r in first)


def produce_window(prom: Prometheus, out: Path, start_min: int, end_min: int) -> list[Transfer]:
    cfg = TransfersPrometheusSettings(
        url=prom.url,
        links=[{**LINK, "from_env": "onprem", "to_env": "cloud"}],
        since=(T0 + timedelta(minutes=start_min)).isoformat(),
        until=(T0 + timedelta(minutes=end_min)).isoformat(),
    )
    asyncio.run(run_producer(TransfersPrometheus(Settings(), cfg), JsonlPublisher(out)))
    return [
        Transfer.model_validate(json.loads(line)["value"]) for line in out.read_text().splitlines()
    ]


def test_bounds_are_errors_not_truncation(prometheus: Prometheus, tmp_path: Path) -> None:
    from gpugap.producers.transfers.node_exporter import PrometheusError

    with pytest.raises(PrometheusError, match="max_series"):
        produce(prometheus, tmp_path / "s.jsonl", max_series=1)
    with pytest.raises(PrometheusError, match="max_response_bytes"):
        produce(prometheus, tmp_path / "r.jsonl", max_response_bytes=200)
    with pytest.raises(PrometheusError, match="max_points"):
        produce(prometheus, tmp_path / "p.jsonl", max_points=40)


def test_the_sink_stores_them_and_the_daily_view_prices_them(
    prometheus: Prometheus, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    records = produce(prometheus, tmp_path / "t.jsonl")
    raw = copy.deepcopy(CARD)
    raw["clusters"]["hpc"]["egress_per_gib"] = RATES
    card = RateCard.model_validate(raw)

    async def store() -> None:
        sink = ClickHouseSink(clickhouse, rate_card=(card, "test"))
        await sink.start()
        await sink.write(records)
        await sink.write(records[:50])  # a re-run of part of the range: changes nothing
        await sink.close()

    asyncio.run(store())
    rows = query(
        clickhouse,
        "SELECT from_env, to_env, transfers, bytes, cost, rate_status FROM v_transfers_daily "
        f"WHERE cluster = 'hpc' AND day = '{T0.date()}'",
    )
    got = {(r["from_env"], r["to_env"]): r for r in rows}
    for (src, dst), way in (("onprem", "cloud"), "transmit"), (("cloud", "onprem"), "receive"):
        moved = by_hand("hpc-01:9100", "bond0", way) + by_hand("hpc-02:9100", "bond0", way)
        row = got[(src, dst)]
        assert (row["transfers"], row["bytes"], row["rate_status"]) == (60, moved, "rated")
        assert row["cost"] == pytest.approx(moved / 2**30 * RATES[f"{src}->{dst}"])


def test_configuration() -> None:
    assert plugin("transfers-prometheus").load() is TransfersPrometheus
    assert node_name("hpc-01:9100", "instance") == "hpc-01"
    assert node_name("[::1]:9100", "instance") == "::1"
    assert node_name("hpc-01", "nodename") == "hpc-01"
    first, last = grid(T0 + timedelta(seconds=1), T0 + timedelta(minutes=3, seconds=5), 60)
    assert (first, last) == (int(T0.timestamp()) + 60, int(T0.timestamp()) + 180)
    assert chunks(0, 600, 60, 4) == [(0, 180), (240, 420), (480, 600)]
    with pytest.raises(ValueError, match="differ"):
        TransfersPrometheusSettings(links=[{**LINK, "from_env": "cloud", "to_env": "cloud"}])
    with pytest.raises(ValueError, match="matcher"):
        TransfersPrometheusSettings(
            links=[{**LINK, "matchers": "job=node}", "from_env": "a", "to_env": "b"}]
        )
