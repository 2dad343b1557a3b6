"""The dcgm-exporter scraper against local HTTP servers serving recorded scrapes."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpugap.groundfloor.kafka.publish import JsonlPublisher, KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.producers import plugin, run_producer
from gpugap.producers.dcgm.producer import DcgmProducer, endpoint_url
from gpugap.producers.dcgm.settings import DcgmSettings
from gpugap.schemas import DeadLetter, NodeSample
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES
from gpugap.services.kafka import free_port
from tests.harness.exporters import exporters
from tests.harness.topics import create_topics, read_topic

FIXTURES = Path(__file__).parents[2] / "fixtures" / "dcgm"


def settings(endpoints: list[str], **dcgm: Any) -> tuple[Settings, DcgmSettings]:
    return Settings(cluster="c1"), DcgmSettings(endpoints=endpoints, **dcgm)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_registered_and_endpoint_forms() -> None:
    assert plugin("dcgm").load() is DcgmProducer
    assert endpoint_url("node-1:9400") == "http://node-1:9400/metrics"
    assert endpoint_url("http://node-1:9400/") == "http://node-1:9400/metrics"
    assert endpoint_url("https://n/custom/path") == "https://n/custom/path"
    with pytest.raises(ConfigError):
        endpoint_url("http://")
    with pytest.raises(ConfigError, match="--endpoint"):
        DcgmProducer(Settings())


def test_one_round_many_endpoints_one_down_one_hung_one_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    routes = {
        "a100": fixture("a100x8.txt"),
        "mig": fixture("h100x2_mig.txt"),
        "pods": fixture("k8s_pods_new_labels.txt"),
        "old": fixture("k8s_pods_old_labels.txt"),
        "slurm": fixture("slurm_hpc_job.txt"),
        "bad": fixture("malformed_truncated.txt"),
        "error": 500,
        "hung": 2.0,
    }

    async def run() -> DcgmProducer:
        async with exporters(routes) as urls:
            down = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
            producer = DcgmProducer(*settings([*urls.values(), down], timeout_s=0.5))
            await run_producer(producer, JsonlPublisher(out), once=True)
            return producer

    with caplog.at_level(logging.WARNING, logger="gpugap.producers.dcgm.producer"):
        producer = asyncio.run(run())
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    samples = [NodeSample.model_validate(x["value"]) for x in lines if x["topic"] == SAMPLES.name]
    letters = [
        DeadLetter.model_validate(x["value"]) for x in lines if x["topic"] == DEAD_LETTER.name
    ]
    assert sorted(s.node for s in samples) == [
        "dgx-a100-017",
        "gke-inference-pool-7f3a",
        "gpu-a40-021",
        "gpu-h100-mig-03",
        "k8s-gpu-node-12",
    ]
    assert [len(s.gpus) for s in samples] == [8, 5, 4, 2, 4]
    assert all(s.source == "dcgm" and s.interval_s == 15.0 for s in samples)
    [letter] = letters
    assert letter.kind == "malformed" and "truncated" in letter.reason
    assert base64.b64decode(letter.value_b64).decode() == fixture("malformed_truncated.txt")
    assert letter.source_topic == SAMPLES.name and letter.consumer == "producer-dcgm"
    assert producer.counts == {"scraped": 5, "dead_lettered": 1, "unreachable": 3}
    assert producer.last_round_s < 1.0, "a hung endpoint costs its timeout, not the round"
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 4  # bad, 500, hung, down: one line each
    assert any("scrape refused (malformed)" in m for m in logged)
    assert any("unreachable: HTTP 500" in m for m in logged)
    assert sum("unreachable" in m for m in logged) == 3


def test_an_endpoint_going_down_and_back_is_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = {"up": True}

    async def run() -> list[int]:
        async def serve(request: web.Request) -> web.Response:
            if not state["up"]:
                return web.Response(status=503)
            return web.Response(text=fixture("slurm_hpc_job.txt"))

        app = web.Application()
        app.router.add_get("/metrics", serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        producer = DcgmProducer(*settings([url]))
        got = []
        try:
            for up in (True, False, False, False, True, True):
                state["up"] = up
                got.append(len(list(await producer.poll())))
        finally:
            await producer.close()
            await runner.cleanup()
        return got

    with caplog.at_level(logging.WARNING, logger="gpugap.producers.dcgm.producer"):
        assert asyncio.run(run()) == [1, 0, 0, 0, 1, 1]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and "HTTP 503" in logged[0] and "is back" in logged[1]


def test_oversized_scrape_is_refused() -> None:
    async def run() -> DcgmProducer:
        async with exporters({"big": fixture("a100x8.txt")}) as urls:
            producer = DcgmProducer(*settings(list(urls.values()), max_body_bytes=10_000))
            assert list(await producer.poll()) == []
            await producer.close()
            return producer

    assert asyncio.run(run()).counts == {"unreachable": 1}


@pytest.mark.kafka
def test_one_round_to_kafka(kafka: KafkaSettings) -> None:
    async def run() -> tuple[list[NodeSample], list[DeadLetter]]:
        await create_topics(kafka, [SAMPLES.name, DEAD_LETTER.name])
        routes = {"a100": fixture("a100x8.txt"), "bad": fixture("malformed_truncated.txt")}
        async with exporters(routes) as urls:
            producer = DcgmProducer(*settings(list(urls.values())))
            sent = await run_producer(producer, KafkaPublisher(kafka), once=True)
        assert sent == 2
        return await read_topic(kafka, SAMPLES, 1), await read_topic(kafka, DEAD_LETTER, 1)

    samples, letters = asyncio.run(run())
    assert [s.node for s in samples] == ["dgx-a100-017"] and len(samples[0].gpus) == 8
    assert samples[0].gpus[0].activity == 0.934112
    assert [d.kind for d in letters] == ["malformed"]
