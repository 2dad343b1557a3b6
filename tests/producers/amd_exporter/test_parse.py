"""AMD Device Metrics Exporter scrapes -> node samples: the recorded scrapes
(tests/fixtures/amd/dme_*.prom, each test names its source from SOURCES.md) and the fake
exporter's (tests/harness/amd_exporter_text.py) for what no recording shows."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.producers.amd_exporter.parse import parse_scrape
from gpugap.producers.prometheus.text import ScrapeError
from gpugap.schemas import Attribution, DevicePartition, GpuSample, NodeSample, SharingPod
from gpugap.schemas.types import (
    ActivityMetric,
    DeadLetterKind,
    PartitionKind,
    SampleSource,
    Vendor,
)
from tests.harness.amd_exporter_text import HELP, OPTIONAL_LABELS, render
from tests.harness.device_state import DeviceState, Holder

FIXTURES = Path(__file__).parents[2] / "fixtures" / "amd"
T = datetime(2026, 11, 2, 9, 30, 15, tzinfo=UTC)
ALL_UNSUPPORTED = ("activity", "memory_used_mib", "memory_total_mib", "power_w", "energy_mj")
MI300X = "AMD Instinct MI300X"
GPU_UUID = "6cff74a1-0000-1000-8037-2ab9e7f4c1d0"


def parse(text: str, prefix: str | None = None) -> list[NodeSample]:
    return parse_scrape(
        text, cluster="c1", default_node="10.0.3.7", time=T, interval_s=15.0, prefix=prefix
    )


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def refused(text: str, kind: DeadLetterKind, prefix: str | None = None) -> str:
    with pytest.raises(ScrapeError) as caught:
        parse(text, prefix)
    assert caught.value.kind is kind, caught.value.reason
    return caught.value.reason


def gpu(index: int, **kw: object) -> DeviceState:
    fields: dict[str, object] = dict(
        node="mi300-01",
        index=index,
        uuid=f"{index:x}cff74a1-0000-1000-8037-2ab9e7f4c1d0",
        model=MI300X,
        busy=0.5,
        memory_used_mib=1024.0,
        memory_total_mib=196592.0,  # an MI300X's 192 GiB in amd-smi's "MB"
        power_w=400.0,
        energy_j=1000.0,
        serial=f"69240700512{index}",
    )
    fields.update(kw)
    return DeviceState(**fields)  # type: ignore[arg-type]


def partitions(
    mode: str, count: int, *, shared_uuid: bool = False, **kw: object
) -> list[DeviceState]:
    """One GPU's partitions, indexes 1.. (ROCm 7 gives each a UUID, 6.x one for all)."""
    states = []
    for p in range(count):
        fields: dict[str, object] = dict(
            uuid=GPU_UUID if shared_uuid else f"7cff74a1-0000-1000-8037-2ab9e7f4c1d{p}",
            serial="692407005127",
            partition_id=p,
            partition_mode=mode,
            busy=p / 10,
        )
        states.append(gpu(1 + p, **{**fields, **kw}))
    return states


# -- recorded scrapes ---------------------------------------------------------------------


def test_mi325x_vf_with_prefix_pr211_all_zero_uuid_is_one_dead_letter() -> None:
    """ROCm/device-metrics-exporter PR #211: a VF's gpu_uuid is all zeros."""
    reason = refused(fixture("dme_gfx_activity_mi325x_vf_prefix_pr211.prom"), DeadLetterKind.SCHEMA)
    assert "all zeros" in reason and "SR-IOV VF" in reason


def test_mi325x_vf_prefix_pr211_with_a_uuid_reads_the_prefixed_activity() -> None:
    """PR #211's line with only its all-zero gpu_uuid replaced: the `amd_` prefix is found in
    the scrape and its gfx_activity 83 (percent) is 0.83; kfd_process_id is not a measure."""
    text = fixture("dme_gfx_activity_mi325x_vf_prefix_pr211.prom").replace(
        "00000000-0000-0000-0000-000000000000", GPU_UUID
    )
    [sample] = parse(text)
    assert sample.node == "mi325x8-110.atl1.do.cpe.ice.amd.com"
    assert (
        sample.gpus
        == (
            GpuSample(
                uuid=f"AMD-{GPU_UUID}",
                index=0,
                model="Aqua Vanjaram [Instinct MI325X VF]",  # card_series; card_model is ""
                vendor=Vendor.AMD,
                activity=0.83,
                activity_metric=ActivityMetric.GFX_ACTIVITY,
                unsupported=ALL_UNSUPPORTED[1:],
            ),
        )
    )
    assert parse(text, prefix="amd_") == [sample]
    assert "GPUGAP_AMD_EXPORTER_PREFIX is ''" in refused(text, DeadLetterKind.SCHEMA, prefix="")


def test_mi300x_vf_issue171_is_a_device_with_nothing_read() -> None:
    """ROCm/device-metrics-exporter issue #171 (partial: an edge temperature, a bare
    gpu_free_vram family): the device is there, none of the fields read are."""
    [sample] = parse(fixture("dme_mi300x_vf_issue171.prom"))
    assert sample == NodeSample(
        cluster="c1",
        node="master-1",
        time=T,
        source=SampleSource.AMD_EXPORTER,
        interval_s=15.0,
        gpus=(
            GpuSample(
                uuid="AMD-17ff74b5-0000-1000-805c-37b0fbe69430",
                index=0,
                model="Aqua Vanjaram [Instinct MI300X VF]",
                vendor=Vendor.AMD,
                unsupported=ALL_UNSUPPORTED,
            ),
        ),
    )


def test_mi250x_slurm_issue162_no_pod_labels_outside_kubernetes() -> None:
    """ROCm/device-metrics-exporter issue #162 (Apptainer, Slurm labels empty, no pod labels
    at all; gpu_compute_partition_type "none" is not partitioned)."""
    [sample] = parse(fixture("dme_xgmi_mi250x_slurm_issue162.prom"))
    [g] = sample.gpus
    assert sample.node == "node"
    assert g.uuid == "AMD-cfff7408-0000-1000-8050-da21f871599b"
    assert g.model == "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2"
    assert g.partition is None and g.attribution is None


def test_mi300x_cpx_pr316_without_gpu_uuid_names_the_fix() -> None:
    """ROCm/device-metrics-exporter PR #316: a newer exporter's default labels have no
    gpu_uuid (nor card_series): the devices cannot be named."""
    reason = refused(fixture("dme_pcie_tx_mi300x_cpx_pr316.prom"), DeadLetterKind.SCHEMA)
    assert "no gpu_uuid label on 1 of 1 GPUs (first: GPU 14 on 723be48b185a)" in reason
    assert "add GPU_UUID to GPUConfig.Labels" in reason


def test_nodes_total_pr367_alone_has_no_gpu() -> None:
    """ROCm/device-metrics-exporter PR #367: only amd_gpu_nodes_total."""
    reason = refused(fixture("dme_nodes_total_prefix_pr367.prom"), DeadLetterKind.REJECTED)
    assert "gpu_nodes_total says 8" in reason


def test_the_fake_has_the_recorded_label_sets() -> None:
    """The fake's labels are PR #211's and issue #171's, less the labels they turned on that
    the fake does not (kfd_process_id; issue #171's ExtraPodLabels), in the same order."""

    def names(line: str) -> list[str]:
        inner = line.split("{", 1)[1].rsplit("}", 1)[0]
        return [pair.split("=", 1)[0] for pair in inner.split('",') if pair]

    fake = [x for x in render([gpu(0)]).splitlines() if x.startswith("gpu_gfx_activity{")]
    pr211 = fixture("dme_gfx_activity_mi325x_vf_prefix_pr211.prom").splitlines()[0]
    issue171 = fixture("dme_mi300x_vf_issue171.prom").splitlines()[2]
    assert names(fake[0]) == [n for n in names(pr211) if n != "kfd_process_id"]
    extra = ("usergroup_id", "workload_id")
    assert names(fake[0]) == [n for n in names(issue171) if n not in extra]
    # PR #316's newer default: no gpu_uuid, card_series, card_vendor, driver or vbios labels
    bare = render([gpu(0)], labels=()).splitlines()
    pr316 = fixture("dme_pcie_tx_mi300x_cpx_pr316.prom").splitlines()[0]
    line = next(x for x in bare if x.startswith("gpu_used_vram{"))
    assert names(line) == [n for n in names(pr316)]


# -- the fake exporter's scrapes ------------------------------------------------------------


def test_whole_gpus_units_and_pods() -> None:
    holders = (Holder("ml", "train-0", "main", "u0"), Holder("ml", "train-1", "side", "u1"))
    states = [gpu(0, holders=holders), gpu(1, busy=0.0, slurm_job_id="4242", energy_j=2.5e6)]
    [sample] = parse(render(states))
    assert sample.node == "mi300-01" and sample.source == SampleSource.AMD_EXPORTER
    shared = (SharingPod(pod="train-1", namespace="ml", container="side"),)
    assert sample.gpus == (
        GpuSample(
            uuid="AMD-0cff74a1-0000-1000-8037-2ab9e7f4c1d0",
            index=0,
            model=MI300X,
            vendor=Vendor.AMD,
            activity=0.5,
            activity_metric=ActivityMetric.GFX_ACTIVITY,
            memory_used_mib=1024.0,
            memory_total_mib=196592.0,
            power_w=400.0,
            energy_mj=1_000_000,  # 1000 J = 1e9 µJ
            attribution=Attribution(pod="train-0", namespace="ml", container="main", shared=shared),
        ),
        GpuSample(
            uuid="AMD-1cff74a1-0000-1000-8037-2ab9e7f4c1d0",
            index=1,
            model=MI300X,
            vendor=Vendor.AMD,
            activity=0.0,
            activity_metric=ActivityMetric.GFX_ACTIVITY,
            memory_used_mib=1024.0,
            memory_total_mib=196592.0,
            power_w=400.0,
            energy_mj=2_500_000_000,
            attribution=Attribution(slurm_job_id="4242"),
        ),
    )


@pytest.mark.parametrize("prefix", ["", "amd_", "site_GPU_"])
def test_the_prefix_is_found_or_set(prefix: str) -> None:
    text = render([gpu(0)], prefix=prefix)
    assert parse(text) == parse(text, prefix=prefix) == parse(render([gpu(0)]))


def test_cpx_partitions_named_by_partition_0_activity_from_their_xccs() -> None:
    states = [gpu(0), *partitions("CPX", 8)]
    [sample] = parse(render(states))
    whole, *parts = sample.gpus
    assert whole.partition is None and whole.uuid == "AMD-0cff74a1-0000-1000-8037-2ab9e7f4c1d0"
    parent = "AMD-7cff74a1-0000-1000-8037-2ab9e7f4c1d0"  # partition 0's own UUID
    assert [g.uuid for g in parts] == [f"{parent}/{p}" for p in range(8)]
    assert [g.index for g in parts] == list(range(1, 9))
    assert [g.partition for g in parts] == [
        DevicePartition(
            parent_uuid=parent, partition_id=p, kind=PartitionKind.AMD_COMPUTE, count=8, mode="CPX"
        )
        for p in range(8)
    ]
    assert [g.activity for g in parts] == pytest.approx([p / 10 for p in range(8)])
    assert {g.activity_metric for g in parts} == {ActivityMetric.GFX_BUSY_INST}
    # only partition 0 measures power and energy; the others' 0 W is "not measured"
    assert [g.power_w for g in parts] == [400.0] + [None] * 7
    assert [g.energy_mj for g in parts] == [1_000_000] + [None] * 7
    assert parts[1].unsupported == ("power_w", "energy_mj")


def test_a_partition_activity_is_the_mean_of_its_xccs_never_gfx_activity() -> None:
    """DPX on an MI300X: 4 XCCs per partition; partition 0 also reports gfx_activity (the
    device's XCP 0 figure), which must not become its activity."""
    text = render(partitions("DPX", 2))
    busy = [x for x in text.splitlines() if x.startswith("gpu_gfx_busy_instantaneous{")]
    assert len(busy) == 8
    p0 = [x for x in busy if 'gpu_partition_id="0"' in x]
    for xcc, value in zip(range(4), (10, 20, 30, 60), strict=True):
        old = next(x for x in p0 if f'xcc_index="{xcc}"' in x)
        text = text.replace(old, old.rsplit(" ", 1)[0] + f" {value}")
    text = text.replace("} 0\n# HELP gpu_gfx_busy", "} 97\n# HELP gpu_gfx_busy")
    assert "} 97\n" in text  # partition 0's gfx_activity, now far from its XCCs
    [sample] = parse(text)
    assert [g.activity for g in sample.gpus] == pytest.approx([0.3, 0.1])


def test_partitions_without_busy_per_xcc_have_no_activity() -> None:
    """An exporter before v1.3.1 (no gpu_gfx_busy_instantaneous): partition 0's
    gfx_activity is the device's, so no partition has an activity."""
    metrics = [m for m in HELP if m != "gpu_gfx_busy_instantaneous"]
    [sample] = parse(render(partitions("QPX", 4), metrics=metrics))
    assert [g.activity for g in sample.gpus] == [None] * 4
    assert all("activity" in g.unsupported for g in sample.gpus)
    assert [g.partition.count for g in sample.gpus if g.partition] == [4] * 4


def test_rocm6_partitions_sharing_one_uuid_are_named_alike() -> None:
    [sample] = parse(render(partitions("QPX", 4, shared_uuid=True)))
    assert [g.uuid for g in sample.gpus] == [f"AMD-{GPU_UUID}/{p}" for p in range(4)]


def test_cpx_count_from_the_part_number_or_a_clear_refusal() -> None:
    labels = [n for n in OPTIONAL_LABELS if n != "card_series"]
    [sample] = parse(render(partitions("CPX", 8), labels=labels))  # 102-G30211-0C: an MI300X
    assert sample.gpus[0].model == "102-G30211-0C"
    assert {g.partition.count for g in sample.gpus if g.partition} == {8}
    mi300a = partitions("CPX", 6, model="AMD Instinct MI300A")  # no part number recorded
    assert len(parse(render(mi300a))[0].gpus) == 6
    reason = refused(render(mi300a, labels=labels), DeadLetterKind.SCHEMA)
    assert "turn CARD_SERIES on" in reason


def test_partitions_need_their_gpu_named() -> None:
    no_p0 = partitions("DPX", 2)[1:]
    assert "whose partition 0" in refused(render(no_p0), DeadLetterKind.SCHEMA)
    no_serial = partitions("DPX", 2, serial="")
    assert "without serial_number" in refused(render(no_serial), DeadLetterKind.SCHEMA)
    too_many = partitions("DPX", 3)  # a partition 2 of a 2-partition mode
    assert "partition_id 2 of only 2" in refused(render(too_many), DeadLetterKind.SCHEMA)


def test_gpu_uuid_turned_off_is_one_dead_letter_naming_the_fix() -> None:
    labels = [n for n in OPTIONAL_LABELS if n != "gpu_uuid"]
    reason = refused(render([gpu(0), gpu(1)], labels=labels), DeadLetterKind.SCHEMA)
    assert "no gpu_uuid label on 2 of 2 GPUs" in reason and "GPU_UUID" in reason


# -- what a scrape must not do ------------------------------------------------------------


def test_bad_scrapes_are_dead_letters() -> None:
    text = render([gpu(0), gpu(1)])
    line = next(x for x in text.splitlines() if x.startswith("gpu_used_vram{"))
    reason = refused(text.replace(line, f"{line}\n{line}"), DeadLetterKind.MALFORMED)
    assert reason.startswith("duplicated series gpu_used_vram")
    nan = line.rsplit(" ", 1)[0] + " NaN"
    assert "is NaN" in refused(text.replace(line, nan), DeadLetterKind.SCHEMA)
    activity = next(x for x in text.splitlines() if x.startswith("gpu_gfx_activity{"))
    over = activity.rsplit(" ", 1)[0] + " 150"
    assert "not a percent" in refused(text.replace(activity, over), DeadLetterKind.SCHEMA)
    assert "truncated" in refused(text[:-20], DeadLetterKind.MALFORMED)
    html = "<html><body>502 Bad Gateway</body></html>\n"
    assert "not Prometheus text" in refused(html, DeadLetterKind.MALFORMED)
    assert "not a number" in refused(
        text.replace('gpu_id="1"', 'gpu_id="x"'), DeadLetterKind.SCHEMA
    )
    mixed = render([gpu(0)]) + render([gpu(1)], prefix="amd_")  # two exporters' answers
    assert "several prefixes" in refused(mixed, DeadLetterKind.SCHEMA)


def test_process_cu_occupancy_is_not_a_measured_use() -> None:
    """gpu_process_cu_occupancy (percent of CUs per process) says how many CUs a process
    holds, not how busy it kept them: no measured_use comes of it."""
    text = render([gpu(0)])
    labels = next(x for x in text.splitlines() if x.startswith("gpu_used_vram{"))
    labels = labels.split("{", 1)[1].rsplit("}", 1)[0]
    text += f'gpu_process_cu_occupancy{{{labels},process_id="4242"}} 100\n'
    [sample] = parse(text)
    assert sample.gpus[0].measured_use is None


def test_a_bigger_node_keeps_its_order() -> None:
    states = [
        dataclasses.replace(gpu(i), uuid=f"{i:02x}ff74a1-0000-1000-8037-2ab9e7f4c1d0")
        for i in range(12)
    ]
    [sample] = parse(render(states))
    assert [g.index for g in sample.gpus] == list(range(12))  # "10" sorts before "2" in text
