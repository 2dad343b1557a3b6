"""The AMD exporter scraper against local HTTP servers serving the fake exporter's text
(tests/harness/amd_exporter_text.py) and a recorded scrape (DME PR #316)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers import plugin, run_producer
from gpugap.producers.amd_exporter.producer import AmdExporterProducer, endpoint_url
from gpugap.producers.amd_exporter.settings import AmdExporterSettings
from gpugap.schemas import DeadLetter, NodeSample
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES
from gpugap.services.kafka import free_port
from tests.harness.amd_exporter_text import render
from tests.harness.device_state import DeviceState
from tests.harness.exporters import exporters

FIXTURES = Path(__file__).parents[2] / "fixtures" / "amd"
LOGGER = "gpugap.producers.amd_exporter.producer"


def settings(endpoints: list[str], **amd: Any) -> tuple[Settings, AmdExporterSettings]:
    return Settings(cluster="c1"), AmdExporterSettings(endpoints=endpoints, **amd)


def node(name: str, gpus: int, busy: float = 0.25, **kw: Any) -> list[DeviceState]:
    return [
        DeviceState(
            node=name,
            index=i,
            uuid=f"{i:x}{len(name):x}ff74a1-0000-1000-8037-2ab9e7f4c1d0",
            model="AMD Instinct MI300X",
            busy=busy,
            memory_used_mib=512.0,
            memory_total_mib=196592.0,
            power_w=300.0,
            energy_j=10.0,
            serial=f"6924070051{i:02d}",
            **kw,
        )
        for i in range(gpus)
    ]


def test_registered_and_settings() -> None:
    assert plugin("amd-exporter").load() is AmdExporterProducer
    assert endpoint_url("node-1:5000") == "http://node-1:5000/metrics"
    assert endpoint_url("https://n/custom") == "https://n/custom"
    with pytest.raises(ConfigError, match="GPUGAP_AMD_EXPORTER_ENDPOINTS"):
        AmdExporterProducer(Settings())
    with pytest.raises(ConfigError, match="not an endpoint"):
        AmdExporterProducer(*settings(["http://"]))
    with pytest.raises(ValidationError, match="not a MetricsFieldPrefix"):
        AmdExporterSettings(prefix="amd-")


def test_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_AMD_EXPORTER_ENDPOINTS", "http://n1:5000/metrics, n2:5000")
    monkeypatch.setenv("GPUGAP_AMD_EXPORTER_PREFIX", "amd_")
    producer = AmdExporterProducer(Settings(cluster="c1"))
    assert producer.endpoints == ["http://n1:5000/metrics", "http://n2:5000/metrics"]
    assert producer.amd.prefix == "amd_"


def test_one_round_many_endpoints_one_refused_one_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    cpx = (FIXTURES / "dme_pcie_tx_mi300x_cpx_pr316.prom").read_text()
    routes = {
        "plain": render(node("mi300-01", 8)),
        "prefixed": render(node("mi300-02", 4), prefix="amd_"),
        "cpx": cpx,  # DME PR #316: no gpu_uuid label
        "cut": render(node("mi300-03", 2))[:-7],
        "error": 500,
        "hung": 2.0,
    }

    async def run() -> AmdExporterProducer:
        async with exporters(routes) as urls:
            down = f"http://127.0.0.1:{free_port()}/metrics"
            producer = AmdExporterProducer(*settings([*urls.values(), down], timeout_s=0.5))
            await run_producer(producer, JsonlPublisher(out), once=True)
            return producer

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        producer = asyncio.run(run())
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    samples = [NodeSample.model_validate(x["value"]) for x in lines if x["topic"] == SAMPLES.name]
    letters = [
        DeadLetter.model_validate(x["value"]) for x in lines if x["topic"] == DEAD_LETTER.name
    ]
    assert sorted((s.node, len(s.gpus)) for s in samples) == [("mi300-01", 8), ("mi300-02", 4)]
    assert {g.activity for s in samples for g in s.gpus} == {0.25}
    assert all(s.source == "amd_exporter" and s.interval_s == 15.0 for s in samples)
    by_kind = {d.kind.value: d for d in letters}
    assert sorted(by_kind) == ["malformed", "schema"]
    assert "GPU_UUID" in by_kind["schema"].reason
    assert by_kind["schema"].reason.startswith("amd-device-metrics-exporter http://127.0.0.1:")
    assert base64.b64decode(by_kind["schema"].value_b64).decode() == cpx
    assert "truncated" in by_kind["malformed"].reason
    assert {d.consumer for d in letters} == {"producer-amd-exporter"}
    assert producer.counts == {"scraped": 2, "dead_lettered": 2, "unreachable": 3}
    assert producer.last_round_s < 1.0, "a hung endpoint costs its timeout, not the round"
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 5  # cpx, cut, 500, hung, down: one line each
    assert sum("unreachable" in m for m in logged) == 3


def test_a_device_state_that_changes_between_polls() -> None:
    """The scenario's DeviceStates are replaced between polls; the exporter's answer and the
    samples follow, and a scrape that went bad is dead-lettered while the next is read."""
    state: dict[str, Any] = {"text": render(node("mi300-01", 2, busy=0.1))}

    async def run() -> list[list[Any]]:
        async def serve(request: web.Request) -> web.Response:
            return web.Response(text=state["text"])

        app = web.Application()
        app.router.add_get("/metrics", serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        producer = AmdExporterProducer(*settings([url]))
        got = []
        try:
            for text in (
                state["text"],
                render(node("mi300-01", 2, busy=0.9)),
                "not the text format {\n",
                render(node("mi300-01", 2, busy=0.0)),
            ):
                state["text"] = text
                got.append(list(await producer.poll()))
        finally:
            await producer.close()
            await runner.cleanup()
        return got

    rounds = asyncio.run(run())
    activity = [
        [g.activity for g in r[0].gpus] if isinstance(r[0], NodeSample) else r[0].kind
        for r in rounds
    ]
    assert activity == [[0.1, 0.1], [0.9, 0.9], "malformed", [0.0, 0.0]]
