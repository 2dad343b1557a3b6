"""The XPU Manager scraper against local HTTP servers serving the fake exporter's text
(tests/harness/xpum_text.py: the 1.x shape of the RECONSTRUCTED Max 1550 scrape in
tests/fixtures/intel, and xpumd 2.x's shape from its code) and the recorded issue #112 rows."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers import plugin, run_producer
from gpugap.producers.xpum.producer import XpumProducer
from gpugap.producers.xpum.settings import XpumSettings
from gpugap.schemas import DeadLetter, NodeSample
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES
from gpugap.services.kafka import free_port
from tests.harness.device_state import DeviceState
from tests.harness.exporters import exporters
from tests.harness.xpum_text import xpum_v1_text, xpum_v2_text

FIXTURES = Path(__file__).parents[2] / "fixtures" / "intel"
LOGGER = "gpugap.producers.xpum.producer"


def node(name: str, uuids: list[str], tiles: tuple[float, ...] | None) -> list[DeviceState]:
    return [
        DeviceState(
            node=name,
            index=n,
            uuid=uuid,
            model="Intel(R) Data Center GPU Max 1550",
            busy=0.5,
            memory_used_mib=1024.0,
            memory_total_mib=131072.0,
            power_w=250.0,
            energy_j=5000.0,
            pci_bdf=f"0000:{0x29 + n:02x}:00.0",
            tile_busy=tiles,
        )
        for n, uuid in enumerate(uuids)
    ]


def read(out: Path) -> tuple[list[NodeSample], list[DeadLetter]]:
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    samples = [NodeSample.model_validate(x["value"]) for x in lines if x["topic"] == SAMPLES.name]
    letters = [
        DeadLetter.model_validate(x["value"]) for x in lines if x["topic"] == DEAD_LETTER.name
    ]
    return samples, letters


def test_registered_and_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert plugin("xpum").load() is XpumProducer
    with pytest.raises(ConfigError, match="GPUGAP_XPUM_ENDPOINTS"):
        XpumProducer(Settings())
    with pytest.raises(ConfigError, match="xpum: 'http://' is not an endpoint"):
        XpumProducer(Settings(), XpumSettings(endpoints=["http://"]))
    monkeypatch.setenv("GPUGAP_XPUM_ENDPOINTS", "node-1:29999,node-2:29999")
    monkeypatch.setenv("GPUGAP_XPUM_TILES_AS_DEVICES", "true")
    producer = XpumProducer(Settings())
    assert producer.endpoints == ["http://node-1:29999/metrics", "http://node-2:29999/metrics"]
    assert producer.tiles_as_devices


def test_one_round_v1_v2_bad_and_down(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out.jsonl"
    v1 = node("xe-1", ["a1000000-0000-0000-0000-000000000001"], (0.8, 0.2))
    v2 = node("xe-2", ["a2000000-0000-0000-0000-000000000002"], (0.6, 0.4))
    spiking = xpum_v2_text(node("xe-3", ["a3000000-0000-0000-0000-000000000003"], None))
    spiking = spiking.replace("} 250.0\n", "} 3.69e+12\n")  # issue #130
    issue112 = (FIXTURES / "xpum_per_engine_ratio_flex140_issue112.prom").read_text()
    routes: dict[str, str | int] = {
        "v1": xpum_v1_text(v1),
        "v2": xpum_v2_text(v2),
        "spike": spiking,
        "issue112": issue112,  # recorded: per-engine rows only, no device series
        "error": 500,
    }

    async def run() -> XpumProducer:
        async with exporters(routes) as urls:
            down = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
            config = XpumSettings(endpoints=[*urls.values(), down], timeout_s=0.5)
            producer = XpumProducer(Settings(cluster="c1"), config)
            await run_producer(producer, JsonlPublisher(out), once=True)
            return producer

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        producer = asyncio.run(run())
    samples, letters = read(out)
    by_node = {s.node: s for s in samples}
    assert sorted(by_node) == ["xe-1", "xe-2", "xe-3"]
    assert all(s.source == "xpum" and s.interval_s == 15.0 for s in samples)
    assert [g.activity for g in by_node["xe-1"].gpus] == [0.5]
    assert [g.activity for g in by_node["xe-2"].gpus] == [0.5]
    [spiked] = by_node["xe-3"].gpus
    assert spiked.power_w is None and spiked.activity == 0.5
    [letter] = letters
    assert letter.kind == "rejected" and letter.consumer == "producer-xpum"
    assert letter.reason.startswith("XPU Manager exporter http://127.0.0.1:")
    assert base64.b64decode(letter.value_b64).decode() == issue112
    assert producer.counts == {
        "scraped": 3,
        "dead_lettered": 1,
        "unreachable": 2,
        "power_discarded": 1,
    }
    logged = [r.getMessage() for r in caplog.records]
    assert sum("impossible power discarded" in m and "3690000000000.0 W" in m for m in logged) == 1
    assert sum("unreachable" in m for m in logged) == 2
    assert sum("scrape refused (rejected)" in m for m in logged) == 1


def test_tiles_as_devices_over_http(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    uuids = ["a1000000-0000-0000-0000-000000000001", "a2000000-0000-0000-0000-000000000002"]
    states = node("aurora-x1", uuids, (1.0, 0.0))

    async def run() -> None:
        async with exporters({"v1": xpum_v1_text(states)}) as urls:
            config = XpumSettings(endpoints=list(urls.values()), tiles_as_devices=True)
            await run_producer(XpumProducer(Settings(), config), JsonlPublisher(out), once=True)

    asyncio.run(run())
    [sample], [] = read(out)
    assert [(g.uuid[-2:], g.index, g.activity) for g in sample.gpus] == [
        ("/0", 0, 1.0),
        ("/1", 1, 0.0),
        ("/0", 2, 1.0),
        ("/1", 3, 0.0),
    ]
