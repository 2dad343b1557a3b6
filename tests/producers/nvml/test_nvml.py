"""The NVML node agent against a fake NVML fed with fixture values (tests/harness/nvml_fake.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpugap.cli import main
from gpugap.groundfloor.kafka.publish import JsonlPublisher, KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.producers import plugin, run_producer
from gpugap.producers.nvml.producer import NvmlProducer
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import GpuSample, MigInstance, NodeSample
from gpugap.schemas.errors import ConfigError, FatalError
from gpugap.schemas.topics import SAMPLES
from gpugap.schemas.types import ActivityMetric, SampleSource
from tests.harness.nvml_fake import FakeNvml
from tests.harness.topics import create_topics, read_topic

MIB = 1 << 20
ALL = (
    "activity",
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
)


def settings(**nvml: Any) -> tuple[Settings, NvmlSettings]:
    base = {"node": "dgx-a100-017", "pod_resources_socket": None, "cluster": "hpc-east"}
    return Settings(), NvmlSettings(**{**base, **nvml})


def tick(producer: NvmlProducer) -> NodeSample | None:
    records = list(asyncio.run(producer.poll()))
    assert len(records) <= 1
    return records[0] if records else None  # type: ignore[return-value]


def whole(gpu: dict[str, Any], index: int) -> GpuSample:
    """What the agent must report for a fully supported GPU of a fixture."""
    util = gpu["utilization"]["gpu"] / 100
    return GpuSample(
        uuid=gpu["uuid"],
        index=index,
        model=gpu["name"],
        activity=util,
        activity_metric=ActivityMetric.UTILIZATION,
        utilization=util,
        memory_used_mib=gpu["memory"]["used"] / MIB,
        memory_total_mib=gpu["memory"]["total"] / MIB,
        power_w=gpu["power_mw"] / 1000,
        energy_mj=gpu["energy_mj"],
        sm_clock_mhz=gpu["sm_clock_mhz"],
    )


def test_registered() -> None:
    assert plugin("nvml").load() is NvmlProducer


def test_a100_node_one_sample_with_every_gpu() -> None:
    fake = FakeNvml("a100x8")
    with fake.installed():
        producer = NvmlProducer(*settings(interval_s=5.0))
        sample = tick(producer)
        asyncio.run(producer.close())
    assert sample is not None
    assert (sample.cluster, sample.node, sample.source) == ("hpc-east", "dgx-a100-017", "nvml")
    assert sample.interval_s == 5.0
    assert sample.gpus == tuple(whole(g, i) for i, g in enumerate(fake.gpus))
    g0 = sample.gpus[0]  # the numbers themselves, once, against the fixture file
    assert (g0.activity, g0.power_w, g0.memory_total_mib, g0.sm_clock_mhz) == (
        0.97,
        356.211,
        81920.0,
        1410,
    )
    assert sample.gpus[6].activity == 0.0 and sample.gpus[6].memory_used_mib > 38000  # held, idle
    assert fake.initialized == 0, "close() shuts NVML down"


def test_h100_mig_instances_are_the_devices_and_say_what_nvml_lacks() -> None:
    fake = FakeNvml("h100x2_mig")
    with fake.installed():
        producer = NvmlProducer(*settings(node="gpu-h100-mig-03"))
        first = tick(producer)
        calls = fake.calls
        second = tick(producer)
        per_tick = fake.calls - calls
    assert first is not None and second is not None
    parent = fake.gpus[0]
    expected = [
        GpuSample(
            uuid=m["uuid"],
            index=0,
            model="NVIDIA H100 80GB HBM3",
            mig=MigInstance(
                parent_uuid=parent["uuid"],
                gpu_instance_id=m["gpu_instance_id"],
                compute_instance_id=0,
                profile=m["name"].rsplit(" ", 1)[1],
            ),
            memory_used_mib=m["memory"]["used"] / MIB,
            memory_total_mib=m["memory"]["total"] / MIB,
            unsupported=("activity", "utilization", "power_w", "energy_mj", "sm_clock_mhz"),
        )
        for m in parent["mig"]
    ] + [whole(fake.gpus[1], 1)]
    assert first.gpus == tuple(expected)
    assert [g.mig.profile for g in first.gpus[:4]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert second.gpus == first.gpus
    # NotSupported is remembered: per tick, 5 calls for the whole GPU, 1 (memory) per instance
    assert per_tick == 5 + 4


def test_gpu_lost_mid_run_then_back_then_gone(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml("a100x8")
    now = [0.0]
    with fake.installed():
        producer = NvmlProducer(*settings())
        producer.sampler.clock = lambda: now[0]
        assert tick(producer) is not None
        fake.lose(3)  # Xid 79: fallen off the bus
        with caplog.at_level(logging.WARNING):
            lost = tick(producer)
            still = tick(producer)  # rediscovered: still counted, cannot be opened
        assert lost is not None and still is not None
        for sample in (lost, still):
            g3 = sample.gpus[3]
            assert g3 == GpuSample(
                uuid=fake.gpus[3]["uuid"], index=3, model=g3.model, unsupported=ALL
            )
            assert [g.uuid for g in sample.gpus] == [g["uuid"] for g in fake.gpus]
            assert sample.gpus[:3] == tuple(whole(g, i) for i, g in enumerate(fake.gpus[:3]))
        assert sum("is lost" in r.getMessage() for r in caplog.records) == 1
        fake.lost.clear()  # reset by the operator: it answers again
        back = tick(producer)
        assert back is not None and back.gpus[3] == whole(fake.gpus[3], 3)
        gone_uuid = fake.gpus[7]["uuid"]
        fake.remove(7)  # unbound from the driver
        now[0] += 61  # the next periodic re-discovery
        with caplog.at_level(logging.WARNING):
            after = tick(producer)
        assert after is not None and [g.index for g in after.gpus] == list(range(7))
        assert any(f"{gone_uuid} (index 7) is gone" in r.getMessage() for r in caplog.records)
        asyncio.run(producer.close())


def test_transient_errors_are_flagged_for_that_tick_only() -> None:
    fake = FakeNvml("a100x8")
    with fake.installed():
        producer = NvmlProducer(*settings())
        fake.fail(2, "power_mw", "UNKNOWN")
        fake.fail(2, "energy_mj", "TIMEOUT")
        fake.fail(5, "utilization", "NO_PERMISSION")
        bad = tick(producer)
        fake.heal()
        good = tick(producer)
    assert bad is not None and good is not None
    expected2 = whole(fake.gpus[2], 2).model_copy(
        update={"power_w": None, "energy_mj": None, "unsupported": ("power_w", "energy_mj")}
    )
    assert bad.gpus[2] == expected2
    assert bad.gpus[5].activity is None and bad.gpus[5].unsupported == ("activity", "utilization")
    assert good.gpus == tuple(whole(g, i) for i, g in enumerate(fake.gpus))


def test_no_driver_fails_with_one_clear_message() -> None:
    with FakeNvml("a100x8", driver=False).installed(), pytest.raises(FatalError) as err:
        NvmlProducer(*settings())
    assert "libnvidia-ml.so.1 not found" in str(err.value)
    assert "--allow-no-gpu" in str(err.value)


def test_no_driver_here_is_the_real_library_saying_so() -> None:
    """On this GPU-less machine the real nvidia-ml-py raises what the fake imitates."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # a machine with a driver: nothing to learn here
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(FatalError, match=r"libnvidia-ml\.so\.1 not found"):
        NvmlProducer(*settings())


def test_cli_no_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.jsonl"
    with FakeNvml("a100x8", driver=False).installed():
        assert main(["produce", "nvml", "--out", str(out), "--once"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gpugap: error: NVML: libnvidia-ml.so.1")
        assert main(["produce", "nvml", "--out", str(out), "--once", "--allow-no-gpu"]) == 0
    assert not out.exists() or out.read_text() == ""


def test_allow_no_gpu_waits_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml("a100x8", driver=False)
    with fake.installed(), caplog.at_level(logging.WARNING):
        producer = NvmlProducer(*settings(allow_no_gpu=True))
        assert tick(producer) is None
        assert tick(producer) is None
        fake.driver = True  # the driver got installed / loaded
        sample = tick(producer)
    waiting = [r.getMessage() for r in caplog.records if "waiting for a driver" in r.getMessage()]
    assert len(waiting) == 1
    assert any("driver found, 8 devices" in r.getMessage() for r in caplog.records)
    assert sample is not None and len(sample.gpus) == 8


def test_interval_below_one_second_is_refused() -> None:
    with FakeNvml("a100x8").installed():
        producer = NvmlProducer(*settings())
        producer.interval_s = 0.5
        with pytest.raises(ConfigError, match="at least 1 s"):
            tick(producer)
    with pytest.raises(ValueError):
        NvmlSettings(interval_s=0.5)


def test_slurm_job_map(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("4471123\n")
    (jobs / "1").write_text("4471123\n")
    (jobs / "5").write_text("4471188_17\n4471190\n")  # shared: the first job
    (jobs / "6").write_text("\n")  # written, emptied by an epilog: nobody
    (jobs / "README").write_text("not a GPU index\n")
    fake = FakeNvml("a100x8")
    with fake.installed():
        sample = tick(NvmlProducer(*settings(job_mapping_dir=jobs)))
    assert sample is not None
    got = {g.index: g.attribution.slurm_job_id for g in sample.gpus if g.attribution}
    assert got == {0: "4471123", 1: "4471123", 5: "4471188_17"}


def test_missing_job_map_dir_is_no_job(tmp_path: Path) -> None:
    with FakeNvml("a100x8").installed():
        sample = tick(NvmlProducer(*settings(job_mapping_dir=tmp_path / "absent")))
    assert sample is not None and all(g.attribution is None for g in sample.gpus)


def test_jsonl_through_the_runner(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    fake = FakeNvml("h100x2_mig")
    with fake.installed():
        sent = asyncio.run(run_producer(NvmlProducer(*settings()), JsonlPublisher(out), once=True))
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sent == 1 and lines[0]["topic"] == "gpu.samples.v1"
    assert lines[0]["key"] == "hpc-east/dgx-a100-017"
    value = NodeSample.model_validate(lines[0]["value"])
    assert value.source is SampleSource.NVML and len(value.gpus) == 5


@pytest.mark.kafka
def test_one_tick_to_kafka(kafka: KafkaSettings) -> None:
    fake = FakeNvml("h100x2_mig")

    async def run() -> tuple[int, list[NodeSample]]:
        await create_topics(kafka, [SAMPLES.name])
        with fake.installed():
            producer = NvmlProducer(*settings(node="gpu-h100-mig-03"))
            sent = await run_producer(producer, KafkaPublisher(kafka), once=True)
        return sent, await read_topic(kafka, SAMPLES, 1, settle_s=0.5)

    sent, got = asyncio.run(run())
    assert sent == 1 and len(got) == 1
    [sample] = got
    assert (sample.cluster, sample.node, sample.source) == ("hpc-east", "gpu-h100-mig-03", "nvml")
    assert [g.uuid for g in sample.gpus] == [m["uuid"] for m in fake.gpus[0]["mig"]] + [
        fake.gpus[1]["uuid"]
    ]
    assert sample.gpus[4] == whole(fake.gpus[1], 1)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_NVML_POD_RESOURCES_SOCKET", "")
    monkeypatch.setenv("GPUGAP_NVML_JOB_MAPPING_DIR", "/run/gpugap/jobs")
    monkeypatch.setenv("GPUGAP_DCGM_ENDPOINTS", "http://n1:9400/metrics, n2:9400")
    nvml = plugin("nvml").config()
    assert isinstance(nvml, NvmlSettings)
    assert nvml.pod_resources_socket is None
    assert nvml.job_mapping_dir == Path("/run/gpugap/jobs")
    dcgm = plugin("dcgm").config()
    assert dcgm is not None
    assert dcgm.model_dump()["endpoints"] == ["http://n1:9400/metrics", "n2:9400"]
    # a flag overrides the environment, validated the same way (a str becomes a Path)
    args = argparse.Namespace(opt_job_mapping_dir="/srv/jobs", opt_allow_no_gpu=False)
    flagged = plugin("nvml").config(args)
    assert isinstance(flagged, NvmlSettings) and flagged.job_mapping_dir == Path("/srv/jobs")
    monkeypatch.setenv("GPUGAP_NVML_INTERVAL_S", "0.2")
    with pytest.raises(ConfigError, match="GPUGAP_NVML_INTERVAL_S"):
        plugin("nvml").config()
