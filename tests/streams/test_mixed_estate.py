"""A mixed estate end to end (issue 53): NVIDIA whole + MIG + a time-sliced GPU with per-process
measures, AMD whole + a CPX-partitioned MI300X, an Intel Max 1550 with 2 tiles
(gpugap/simulator/mixed.py), read twice:

- by the node agents (NVML with the kubelet and /proc, amdsmi with the kubelet, /proc and
  sysfs), each through its fake library rendering the scenario as the recorded real outputs
  show it (tests/harness/nvml_fake.py, amdsmi_fake.py);
- by the exporter scrapers (dcgm-exporter 4.8.2 with per-pod rows, AMD's device-metrics
  exporter, Intel's XPU Manager 1.x) over real local HTTP servers serving the scenario as the
  recorded scrapes show it (tests/harness/dcgm_text.py, amd_exporter_text.py, xpum_text.py);

then through the worker's core and the real ClickHouse sink into the views, where every
allocation's allocated, consumed and measured GPU-seconds, the unattributed use and the
unallocated capacity equal the scenario's truth by share; and once more the scrapers' samples
through the real broker, ``gpugap worker`` and the sink reading Kafka. The producers stamp
samples with the wall clock: the test stamps each round with the scenario's instant (ten
minutes run in a few seconds)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, Settings
from gpugap.producers.amd_exporter.producer import AmdExporterProducer
from gpugap.producers.amd_exporter.settings import AmdExporterSettings
from gpugap.producers.amdsmi.producer import AmdSmiProducer
from gpugap.producers.amdsmi.settings import AmdSmiSettings
from gpugap.producers.dcgm.producer import DcgmProducer
from gpugap.producers.dcgm.settings import DcgmSettings
from gpugap.producers.nvml.kubelet import api_pb2, api_pb2_grpc
from gpugap.producers.nvml.producer import NvmlProducer
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.producers.xpum.producer import XpumProducer
from gpugap.producers.xpum.settings import XpumSettings
from gpugap.schemas import TOPICS, DeadLetter, GpuMinute, K8sPodEvent, NodeSample, Record
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import K8S_PODS, SAMPLES
from gpugap.schemas.types import ShareSource
from gpugap.simulator import mixed
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.streams.process import Processor
from gpugap.warehouse.client import connect
from tests.harness import amd_exporter_text, dcgm_text, xpum_text
from tests.harness import mixed_estate as estate
from tests.harness.amdsmi_fake import FakeAmdSmi, failing_import
from tests.harness.commands import run_worker
from tests.harness.exporters import exporters
from tests.harness.nvml_fake import FakeNvml
from tests.harness.nvml_processes import render_states, write_proc
from tests.harness.topics import create_topics
from tests.harness.warehouse import store

NODES = ("nv-01", "amd-01", "xpu-01")


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, response: Any) -> None:
        self.response = response

    async def List(self, request: Any, context: Any) -> Any:
        return self.response


def _response(sc: mixed.Scenario, node: str, resource: str) -> Any:
    pods = []
    for name, ids in estate.kubelet_devices(sc, node).items():
        pod = sc.pods[name]
        devices = [api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)]
        container = api_pb2.ContainerResources(name="main", devices=devices)
        pods.append(
            api_pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=[container])
        )
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


@asynccontextmanager
async def kubelet(socket: Path, response: Any) -> AsyncIterator[None]:
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(Kubelet(response), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(None)


def _stamped(records: Any, t: int, out: list[NodeSample], dead: list[DeadLetter]) -> None:
    for r in records:
        if isinstance(r, NodeSample):
            out.append(r.model_copy(update={"time": estate.at(t), "interval_s": 10.0}))
        elif isinstance(r, DeadLetter):
            dead.append(r)


async def _agents(sc: mixed.Scenario, tmp: Path) -> tuple[list[NodeSample], list[DeadLetter]]:
    samples: list[NodeSample] = []
    dead: list[DeadLetter] = []
    settings = Settings(cluster=mixed.CLUSTER)
    proc = tmp / "proc"
    for node in ("nv-01", "amd-01"):
        write_proc(proc, estate.states(sc, node, 10))
    sys_root = estate.sysfs(sc, "amd-01", tmp / "sys")
    nv_sock, amd_sock = tmp / "nv.sock", tmp / "amd.sock"
    nvml = FakeNvml(render_states(estate.states(sc, "nv-01", 0), 0))
    amd = FakeAmdSmi(estate.states(sc, "amd-01", 0))
    async with (
        kubelet(nv_sock, _response(sc, "nv-01", "nvidia.com/gpu")),
        kubelet(amd_sock, _response(sc, "amd-01", "amd.com/gpu")),
    ):
        with nvml.installed(), amd.installed():
            nv_agent = NvmlProducer(
                settings,
                NvmlSettings(node="nv-01", pod_resources_socket=nv_sock, proc_root=proc),
            )
            amd_cfg = AmdSmiSettings(
                node="amd-01", pod_resources_socket=amd_sock, proc_root=proc, sys_root=sys_root
            )
            amd_agent = AmdSmiProducer(settings, amd_cfg)
            amd_agent.sampler.clock = amd.clock  # the fake's clock: engine time grows by it
            try:
                for t in estate.ticks():
                    nv_states = estate.states(sc, "nv-01", t)
                    nvml.data = render_states(nv_states, t * 1_000_000, nvml.data)
                    amd.set(estate.states(sc, "amd-01", t), 10.0)
                    _stamped(await nv_agent.poll(), t, samples, dead)
                    _stamped(await amd_agent.poll(), t, samples, dead)
            finally:
                await nv_agent.close()
                await amd_agent.close()
    return samples, dead


def _texts(sc: mixed.Scenario, t: int, amd_labels: tuple[str, ...]) -> dict[str, str]:
    amd = estate.states(sc, "amd-01", t)
    return {
        "nv-01": dcgm_text.render(estate.states(sc, "nv-01", t)),
        "amd-01": amd_exporter_text.render(amd, prefix="amd_", labels=amd_labels),
        "xpu-01": xpum_text.xpum_v1_text(estate.states(sc, "xpu-01", t)),
    }


async def _scrapers(
    sc: mixed.Scenario, amd_labels: tuple[str, ...] = amd_exporter_text.OPTIONAL_LABELS
) -> tuple[list[NodeSample], list[DeadLetter]]:
    samples: list[NodeSample] = []
    dead: list[DeadLetter] = []
    settings = Settings(cluster=mixed.CLUSTER)
    texts = _texts(sc, estate.ticks()[0], amd_labels)
    now = {node: (lambda node=node: texts[node]) for node in texts}  # the text as it is now
    async with exporters(now) as urls:
        scrapers = [
            DcgmProducer(settings, DcgmSettings(endpoints=[urls["nv-01"]])),
            AmdExporterProducer(settings, AmdExporterSettings(endpoints=[urls["amd-01"]])),
            XpumProducer(settings, XpumSettings(endpoints=[urls["xpu-01"]])),
        ]
        try:
            for t in estate.ticks():
                texts.update(_texts(sc, t, amd_labels))
                for scraper in scrapers:
                    _stamped(await scraper.poll(), t, samples, dead)
        finally:
            for scraper in scrapers:
                await scraper.close()
    return samples, dead


def pod_events(sc: mixed.Scenario, path: mixed.Path) -> list[K8sPodEvent]:
    """The pods on the nodes ``path`` reads (the agents read no Intel node: there is no
    Level Zero agent)."""
    read = {d.node for d in sc.devices if d.vendor in path.vendors}
    return [e for e in estate.pod_events(sc) if e.node in read]


def through_the_worker(
    sc: mixed.Scenario, path: mixed.Path, samples: list[NodeSample]
) -> list[GpuMinute]:
    records: list[Record] = [*pod_events(sc, path), *samples]
    records.sort(key=lambda r: r.time)  # type: ignore[attr-defined]
    proc = Processor()
    rows: list[GpuMinute] = []
    for r in records:
        rows += proc.handle(r).minutes
    return rows + proc.advance(proc.cfg.lateness_ms).minutes


def sums(rows: list[GpuMinute]) -> dict[str, tuple[float, float, float, float]]:
    got: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        g = got[r.allocation_id or ""]
        g[0] += r.allocated_s
        g[1] += r.consumed_gpu_s
        g[2] += r.measured
        g[3] += r.unallocated_s
    return {k: (a, c, m, u) for k, (a, c, m, u) in got.items()}


def want(sc: mixed.Scenario, path: mixed.Path) -> dict[str, tuple[float, float, float, float]]:
    return {
        k: (float(f.allocated_s), float(f.consumed_s), float(f.measured_s), float(f.unallocated_s))
        for k, f in mixed.truth(sc, path).items()
    }


@pytest.mark.parametrize("path", [mixed.AGENTS, mixed.SCRAPERS], ids=lambda p: p.name)
def test_every_figure_of_the_mixed_estate_equals_its_truth_by_share(
    path: mixed.Path, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    sc = mixed.build()
    if path is mixed.AGENTS:
        samples, dead = asyncio.run(_agents(sc, tmp_path))
    else:
        samples, dead = asyncio.run(_scrapers(sc))
    assert not dead, [d.reason for d in dead]
    assert {s.node for s in samples} == {
        n for n in NODES if path is mixed.SCRAPERS or n != "xpu-01"
    }
    rows = through_the_worker(sc, path, samples)
    truth = want(sc, path)
    got = sums(rows)
    assert set(got) == set(truth)
    for key, figures in truth.items():
        assert got[key] == pytest.approx(figures, abs=1e-6), key
    shared = {r.share_source for r in rows if r.gpu_uuid.endswith(sc.devices[3].uuid)}
    assert shared == {ShareSource.MEASURED}

    store(clickhouse, [*pod_events(sc, path), *rows])
    views_equal_truth(clickhouse, sc, path)


def views_equal_truth(clickhouse: ClickHouseSettings, sc: mixed.Scenario, path: mixed.Path) -> None:
    """Each allocation in v_top_waste and each vendor in v_vendor_daily equal the truth."""
    truth = want(sc, path)
    client = connect(clickhouse)
    top = {
        r[0]: r[1:]
        for r in client.query(
            "SELECT allocation_id, allocated_gpu_h, consumed_gpu_h FROM v_top_waste"
        ).result_rows
    }
    # the warehouse keeps whole milliseconds per row: 10 rows of 60/7 s are 4 ms short
    ms_h = 0.001 * mixed.MINUTES / 3600
    assert set(top) == {k for k in truth if k}
    for key, (allocated, consumed, _, _) in truth.items():
        if key:
            assert top[key] == pytest.approx((allocated / 3600, consumed / 3600), abs=ms_h), key
    vendors = {
        r[0]: r[1:]
        for r in client.query(
            "SELECT vendor, allocated_gpu_h, consumed_gpu_h, unattributed_gpu_h, "
            "unallocated_gpu_h FROM v_vendor_daily"
        ).result_rows
    }
    assert set(vendors) == set(path.vendors)
    for vendor in path.vendors:
        own = mixed.truth(sc, path, vendor)
        nobody = own.pop("", mixed.Figures())
        totals = (
            sum((f.allocated_s for f in own.values()), Fraction(0)) / 3600,
            sum((f.consumed_s for f in own.values()), Fraction(0)) / 3600,
            nobody.consumed_s / 3600,
            nobody.unallocated_s / 3600,
        )
        assert vendors[vendor] == pytest.approx(tuple(map(float, totals)), abs=8 * ms_h), vendor


@pytest.mark.kafka
def test_the_scraped_mixed_estate_through_kafka_and_the_worker(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings
) -> None:
    """The scrapers' samples and the pods' events published to the real broker, joined by
    ``gpugap worker`` (the Faust app, in a child process) and stored by the sink from Kafka:
    the views equal the truth as the in-process run's do."""
    sc = mixed.build()
    samples, dead = asyncio.run(_scrapers(sc))
    assert not dead

    async def publish_and_store() -> None:
        await create_topics(kafka, list(TOPICS))
        async with KafkaPublisher(kafka) as out:
            for event in pod_events(sc, mixed.SCRAPERS):
                await out.send(K8S_PODS, event)
            for sample in samples:
                await out.send(SAMPLES, sample)
        worker = await asyncio.to_thread(run_worker, kafka, timeout=600)
        assert not worker.dead, worker.dead
        sink = ClickHouseSink(clickhouse, max_age_s=0.5)
        async with KafkaPublisher(kafka) as dlq:
            await sink.run(kafka, DeadLetters(dlq, "sink", kafka.topic_prefix), idle_timeout_s=3.0)

    asyncio.run(publish_and_store())
    views_equal_truth(clickhouse, sc, mixed.SCRAPERS)


def test_an_exporter_missing_a_label_is_a_dead_letter_and_nothing_else_stops() -> None:
    """AMD's exporter without GPU_UUID in its labels (its default config leaves it optional:
    tests/fixtures/amd/dme_pcie_tx_mi300x_cpx_pr316.prom): every round of that endpoint is one
    dead letter naming the fix, and the NVIDIA and Intel nodes' figures still equal the truth."""
    sc = mixed.build()
    without = tuple(x for x in amd_exporter_text.OPTIONAL_LABELS if x != "gpu_uuid")
    samples, dead = asyncio.run(_scrapers(sc, without))
    assert len(dead) == len(estate.ticks())
    assert all("gpu_uuid" in d.reason and "GPU_UUID" in d.reason for d in dead), dead[0].reason
    assert {s.node for s in samples} == {"nv-01", "xpu-01"}
    others = mixed.Path("scrapers", frozenset({"nvidia", "intel"}), True, frozenset({"nvidia"}))
    got = sums(through_the_worker(sc, others, samples))
    for key, figures in want(sc, others).items():
        assert got[key] == pytest.approx(figures, abs=1e-6), key


def test_a_wrong_amdsmi_for_the_hosts_rocm_is_one_clear_error_and_nvml_goes_on(
    tmp_path: Path,
) -> None:
    """The PyPI amdsmi newer than the host's ROCm fails at import with an undefined symbol
    (tests/fixtures/amd/amdsmi_error_undefined_symbol_issue186.txt): the AMD agent stops at
    start with one error naming the package, the library error and the fix; the node's NVIDIA
    agent is another process and reads on."""
    sc = mixed.build()
    library = "/opt/rocm-7.0.1/lib/libamd_smi.so"
    symbol = f"{library}: undefined symbol: amdsmi_get_gpu_partition_metrics_info"
    with (
        failing_import(AttributeError(symbol), version="7.2.0"),
        pytest.raises(ConfigError) as refused,
    ):
        AmdSmiProducer(Settings(cluster=mixed.CLUSTER), AmdSmiSettings(node="amd-01"))
    message = str(refused.value)
    assert "7.2.0" in message and "undefined symbol" in message
    assert "/opt/rocm/share/amd_smi" in message
    assert "Traceback" not in message
    fake = FakeNvml(render_states(estate.states(sc, "nv-01", 10), 10_000_000))

    async def poll() -> list[Any]:
        agent = NvmlProducer(Settings(cluster=mixed.CLUSTER), NvmlSettings(node="nv-01"))
        try:
            return list(await agent.poll())
        finally:
            await agent.close()

    with fake.installed():
        [sample] = asyncio.run(poll())
    assert len(sample.gpus) == 4  # GPU 0, two MIG slices of GPU 1, GPU 2
