"""The AMD node agent against the fake amdsmi (tests/harness/amdsmi_fake.py), driven by
DeviceState scenarios built from recorded real outputs (tests/fixtures/amd/SOURCES.md)."""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import Settings
from gpugap.producers.amdsmi.producer import AmdSmiProducer
from gpugap.producers.amdsmi.settings import AmdSmiSettings
from gpugap.producers.amdsmi.usage import ProcessReading, UsageTracker
from gpugap.schemas import GpuSample, NodeSample
from gpugap.schemas.types import ActivityMetric, PartitionKind, SampleSource, Vendor
from tests.harness.amdsmi_fake import STATUS_NOT_SUPPORTED, FakeAmdSmi, write_proc
from tests.harness.device_state import DeviceState, ProcessState

FIXTURES = Path(__file__).parents[2] / "fixtures" / "amd"
MIB = 1 << 20
POD_A = "6f1c2a4e-1b2d-4c3e-9f10-0a1b2c3d4e5f"
POD_B = "0d9e8f7a-6b5c-4d3e-8f2a-112233445566"


def mi300x_node() -> list[DeviceState]:
    """8x MI300X as recorded in the ROCm blog "Getting to Know Your GPU: A Deep Dive into AMD
    SMI" (2024-09-17): power and GFX_UTIL per GPU from `amd-smi monitor -putm`
    (amdsmi_monitor_putm_mi300x8.txt), VRAM size 196592 MB from `amd-smi static --json`
    (amdsmi_static_vram_mi300x.json), one process per GPU from `amd-smi process --csv`
    (amdsmi_process_mi300x8.csv)."""
    vram_total = json.loads((FIXTURES / "amdsmi_static_vram_mi300x.json").read_text())
    total = float(vram_total["size"]["value"])
    monitor = (FIXTURES / "amdsmi_monitor_putm_mi300x8.txt").read_text().splitlines()[1:]
    with open(FIXTURES / "amdsmi_process_mi300x8.csv", newline="") as fh:
        rows = {int(r["gpu"]): r for r in csv.DictReader(fh)}
    out = []
    for line in monitor:
        f = re.split(r"\s{2,}", line.strip())
        gpu, power, util = int(f[0]), float(f[1].split()[0]), float(f[4].split()[0]) / 100
        proc = rows[gpu]
        vram_mib = int(proc["vram_mem"]) / MIB
        out.append(
            DeviceState(
                node="mi300x-01",
                index=gpu,
                uuid=f"{gpu:02x}ff74a1-0000-1000-8047-f09ed7fb6fd7",
                model="AMD Instinct MI300X",
                busy=util,
                memory_used_mib=round(vram_mib),
                memory_total_mib=total,
                power_w=power,
                energy_j=1_000_000.0 + gpu,
                serial=f"{0x5D1234567890AB00 + gpu:x}",
                processes=(ProcessState(int(proc["pid"]), util, vram_mib, name=proc["name"]),),
            )
        )
    return out


def cpx_gpu(busy: tuple[float, ...], *, shared_uuid: bool) -> list[DeviceState]:
    """One MI300X in CPX: 8 partitions of one XCD each (NOTES.md: partition.md). ROCm 6.x gives
    every partition the GPU's UUID; 7.0 on, one each (shared_uuid=False)."""
    out = []
    for i, b in enumerate(busy):
        uuid = (
            "7bff74a1-0000-1000-80e9-b4f8e1b0b8cd"
            if shared_uuid or i == 0
            else (f"7bff74a1-000{i}-1000-80e9-b4f8e1b0b8cd")
        )
        out.append(
            DeviceState(
                node="mi300x-02",
                index=i,
                uuid=uuid,
                model="AMD Instinct MI300X",
                busy=b,
                memory_used_mib=1024.0 * i,
                memory_total_mib=24574.0,
                power_w=650.0,
                energy_j=5000.0,
                serial="5d1234567890ab77",
                partition_id=i,
                partition_mode="CPX",
            )
        )
    return out


def producer(tmp_path: Path, fake: FakeAmdSmi, **cfg: Any) -> AmdSmiProducer:
    base = {"node": "mi300x-01", "cluster": "hpc-east", "pod_resources_socket": None}
    p = AmdSmiProducer(Settings(), AmdSmiSettings(**{"proc_root": tmp_path, **base, **cfg}))
    p.sampler.clock = fake.clock  # engine-time deltas over the fake's wall time
    p.sampler.usage.forget(())
    return p


def tick(p: AmdSmiProducer) -> NodeSample:
    records = list(asyncio.run(p.poll()))
    assert len(records) == 1
    sample = records[0]
    assert isinstance(sample, NodeSample)
    return sample


def test_mi300x_node_as_recorded(tmp_path: Path) -> None:
    states = mi300x_node()
    fake = FakeAmdSmi(states, engine_time=False)  # as recorded: gfx 0 ns for compute
    with fake.installed():
        p = producer(tmp_path, fake)
        first = tick(p)
        fake.set(states, 10.0)
        second = tick(p)
    assert first.source is SampleSource.AMDSMI and len(first.gpus) == 8
    for s, g in zip(states, first.gpus, strict=True):
        assert g == GpuSample(
            uuid=f"AMD-{s.uuid}",
            index=s.index,
            model="AMD Instinct MI300X",
            vendor=Vendor.AMD,
            activity=s.busy,
            activity_metric=ActivityMetric.GFX_ACTIVITY,
            memory_used_mib=float(int(s.memory_used_mib)),
            memory_total_mib=196592.0,  # "MB" stored as MiB: 192 GiB
            power_w=s.power_w,
            energy_mj=int(int(s.energy_j * 1e6 / 15.259) * 15.259 / 1000),
        )
    assert first.gpus[0].activity == 0.83 and first.gpus[0].power_w == 182.0
    by_index = {g.index: g for g in second.gpus}
    # GPU 0 is 83 % busy but its process's engine time stayed 0: nothing measured
    assert by_index[0].measured_use is None and by_index[1].measured_use is None
    # GPU 2 is idle: a real measurement of no use, its process holding its VRAM
    idle = by_index[2].measured_use
    assert idle is not None and len(idle) == 1
    assert idle[0].pod_uid is None and idle[0].activity == 0.0
    assert idle[0].memory_used_mib == pytest.approx(7889575936 / MIB)


def test_cpx_partitions_each_an_eighth(tmp_path: Path) -> None:
    busy = (0.9, 0.1, 0.0, 0.5, 1.0, 0.0, 0.25, 0.0)
    for shared in (True, False):
        fake = FakeAmdSmi(cpx_gpu(busy, shared_uuid=shared))
        with fake.installed():
            sample = tick(producer(tmp_path, fake))
        parent = "AMD-7bff74a1-0000-1000-80e9-b4f8e1b0b8cd"
        assert [g.uuid for g in sample.gpus] == [f"{parent}/{i}" for i in range(8)]
        for i, g in enumerate(sample.gpus):
            assert g.partition is not None
            assert g.partition.parent_uuid == parent and g.partition.partition_id == i
            assert g.partition.kind is PartitionKind.AMD_COMPUTE and g.partition.mode == "CPX"
            assert g.partition.share == 1 / 8
            # its own XCC's gfx_busy_inst, never partition 0's device-wide gfx_activity
            assert g.activity == busy[i] and g.activity_metric is ActivityMetric.GFX_BUSY_INST
            assert g.memory_used_mib == 1024.0 * i
            if i == 0:
                assert g.power_w == 650.0 and g.energy_mj is not None
            else:  # the device's power counted once, on partition 0
                assert g.power_w is None and set(g.unsupported) == {"power_w", "energy_mj"}


def test_partition_without_busy_inst_has_no_activity(tmp_path: Path) -> None:
    fake = FakeAmdSmi(cpx_gpu((0.5,) * 8, shared_uuid=True))
    fake.amdsmi_get_gpu_metrics_info = lambda h: {"xcp_stats.gfx_busy_inst": "N/A"}  # type: ignore[method-assign]
    with fake.installed():
        sample = tick(producer(tmp_path, fake))
    for g in sample.gpus:
        assert g.activity is None and "activity" in g.unsupported


def test_process_deltas_become_use_per_pod(tmp_path: Path) -> None:
    gpu = mi300x_node()[0]
    procs = (
        ProcessState(101, 0.5, 4096.0, pod_uid=POD_A),
        ProcessState(102, 0.2, 1024.0, pod_uid=POD_A),
        ProcessState(201, 0.25, 2048.0, pod_uid=POD_B),
        ProcessState(301, 0.05, 512.0),  # a process of no pod
    )
    state = replace(gpu, busy=1.0, processes=procs)
    for systemd in (True, False):
        proc_root = tmp_path / f"proc-{systemd}"
        write_proc(proc_root, [state], systemd=systemd)
        fake = FakeAmdSmi([state])
        with fake.installed():
            p = producer(proc_root, fake)
            assert tick(p).gpus[0].measured_use is None  # one reading: no interval yet
            fake.set([state], 10.0)
            used = tick(p).gpus[0].measured_use
            # a process that starts later: all its engine time falls in the interval
            late = replace(state, processes=(*procs, ProcessState(202, 0.1, 64.0, pod_uid=POD_B)))
            write_proc(proc_root, [late], systemd=systemd)
            fake.set([late], 5.0)
            later = tick(p).gpus[0].measured_use
        assert used is not None
        # pods by UID, the processes of no pod last
        assert [(u.pod_uid, u.memory_used_mib) for u in used] == [
            (POD_B, 2048.0),
            (POD_A, 5120.0),
            (None, 512.0),
        ]
        assert [u.activity for u in used] == pytest.approx([0.25, 0.7, 0.05])
        assert later is not None and later[0].pod_uid == POD_B
        assert later[0].activity == pytest.approx(0.35)


def test_not_available_fields_are_listed(tmp_path: Path) -> None:
    state = mi300x_node()[3]
    fake = FakeAmdSmi([state])
    power = fake.amdsmi_get_power_info

    def activity(h: Any) -> dict[str, Any]:  # a virtual machine guest's (py-api doc)
        return {"gfx_activity": "N/A", "umc_activity": "N/A", "mm_activity": "N/A"}

    def navi_power(h: Any) -> dict[str, Any]:  # MI200 and older: average_socket_power only
        return {**power(h), "current_socket_power": "N/A", "average_socket_power": 310}

    fake.amdsmi_get_gpu_activity = activity  # type: ignore[method-assign]
    fake.amdsmi_get_power_info = navi_power  # type: ignore[method-assign]
    fake.fail(0, "amdsmi_get_energy_count", STATUS_NOT_SUPPORTED)
    with fake.installed():
        p = producer(tmp_path, fake)
        g = tick(p).gpus[0]
        fake.heal()
        again = tick(p).gpus[0]
    assert g.activity is None and g.power_w == 310.0  # average_socket_power: the fallback
    assert g.memory_total_mib == 196592.0
    assert set(g.unsupported) == {"activity", "energy_mj"}
    assert again.energy_mj is None  # NOT_SUPPORTED is remembered: not asked again


def test_busy_error_costs_one_tick(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAmdSmi([mi300x_node()[0]])
    fake.fail(0, "amdsmi_get_gpu_vram_usage")
    with fake.installed(), caplog.at_level(logging.WARNING):
        p = producer(tmp_path, fake)
        g = tick(p).gpus[0]
        fake.heal()
        again = tick(p).gpus[0]
    assert {"memory_used_mib", "memory_total_mib"} <= set(g.unsupported)
    assert again.memory_total_mib == 196592.0 and not again.unsupported
    assert any("AMDSMI_STATUS_BUSY" in r.getMessage() for r in caplog.records)


def test_zero_uuid_is_not_invented(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    vf = replace(mi300x_node()[1], uuid="00000000-0000-0000-0000-000000000000")
    fake = FakeAmdSmi([mi300x_node()[0], vf])
    with fake.installed(), caplog.at_level(logging.ERROR):
        p = producer(tmp_path, fake)
        sample = tick(p)
        p.sampler.discover()
    assert [g.index for g in sample.gpus] == [0]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "has no UUID" in errors[0] and "SR-IOV" in errors[0]


def _cli_buildable() -> None:
    # the CLI imports every registered producer's declaration; the AMD and Intel scrapers are
    # registered ahead of their code (producers/__init__.py)
    for name in ("amd_exporter", "xpum"):
        if importlib.util.find_spec(f"gpugap.producers.{name}") is None:
            pytest.skip(f"the CLI needs gpugap.producers.{name}, not in this tree yet")


def test_cli_writes_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cli_buildable()
    out = tmp_path / "s.jsonl"
    monkeypatch.setenv("GPUGAP_AMDSMI_POD_RESOURCES_SOCKET", "")
    with FakeAmdSmi(mi300x_node()).installed():
        assert main(["produce", "amdsmi", "--out", str(out), "--once"]) == 0
    sample = NodeSample.model_validate(json.loads(out.read_text().splitlines()[0])["value"])
    assert len(sample.gpus) == 8 and sample.gpus[0].uuid.startswith("AMD-")


def test_cli_no_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cli_buildable()
    out = tmp_path / "s.jsonl"
    with FakeAmdSmi(mi300x_node(), driver=False).installed():
        assert main(["produce", "amdsmi", "--out", str(out), "--once"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("gpugap: error: amdsmi: amdsmi_init failed"), err
        assert main(["produce", "amdsmi", "--out", str(out), "--once", "--allow-no-gpu"]) == 0


def test_pods_past_the_cap_count_as_no_pods_use() -> None:
    """70 pods' processes on one device: the 64 busiest are kept, the rest's engine time is
    the no-pod entry's (unattributed), never dropped into the kept pods' proportions."""
    pods = {1000 + n: f"{n:08x}-0000-4000-8000-000000000000" for n in range(70)}
    tracker = UsageTracker(pod_of=pods.get)
    before = [ProcessReading(pid, 0, 0) for pid in pods]
    assert tracker.measure("AMD-x", 0.0, before, 0.5) is None  # the first reading: no delta
    # pod n kept the device busy (n + 1) ms of the 10 s: the 6 least busy are past the cap
    after = [ProcessReading(pid, (n + 1) * 1_000_000, 1 << 20) for n, pid in enumerate(pods)]
    uses = tracker.measure("AMD-x", 10.0, after, 0.5)
    assert uses is not None and len(uses) == 65
    by_uid = {u.pod_uid: u for u in uses}
    assert set(by_uid) == {*list(pods.values())[6:], None}
    assert by_uid[None].activity == pytest.approx(sum(range(1, 7)) * 1e-3 / 10)
    assert sum(u.activity for u in uses) == pytest.approx(sum(range(1, 71)) * 1e-3 / 10)
