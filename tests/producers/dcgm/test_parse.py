"""dcgm-exporter scrapes (tests/fixtures/dcgm/) -> node samples, exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.producers.dcgm.parse import ScrapeError, parse_scrape
from gpugap.schemas import Attribution, GpuSample, MigInstance, NodeSample, SharingPod, encode
from gpugap.schemas.types import MAX_SHARING_PODS, ActivityMetric, DeadLetterKind, SampleSource

FIXTURES = Path(__file__).parents[2] / "fixtures" / "dcgm"
T = datetime(2026, 11, 2, 9, 30, 15, tzinfo=UTC)
SM, GR, UTIL = ActivityMetric.SM_ACTIVE, ActivityMetric.GR_ENGINE_ACTIVE, ActivityMetric.UTILIZATION


def parse(name: str, text: str | None = None) -> list[NodeSample]:
    body = text if text is not None else (FIXTURES / name).read_text()
    return parse_scrape(body, cluster="c1", default_node="10.0.3.7", time=T, interval_s=15.0)


def test_plain_8_gpu_node_prefers_gr_engine_active() -> None:
    [sample] = parse("a100x8.txt")
    uuids = [
        "GPU-6513270e-269e-4d37-b2a7-4de452e6b438",
        "GPU-d23f0824-128b-4f33-8c5c-7fd0a6a3a450",
        "GPU-9531985d-5d9d-49f8-9818-e811892f902b",
        "GPU-36f675cc-81e7-4ef5-a8e2-5d940ed90475",
        "GPU-6b0d549b-6f03-475a-9600-a35a099950d8",
        "GPU-8d116ece-1738-47d9-bd9c-172411e20b8f",
        "GPU-90c192cf-d3ac-44af-8f21-ddb66cad4a26",
        "GPU-a170b338-3926-4059-b28c-105d1fb17c23",
    ]
    gr = [0.934112, 0.921876, 0.951203, 0.887731, 0.929921, 0.913305, 0.0, 0.0]
    util = [0.98, 0.97, 0.99, 0.95, 0.98, 0.96, 0.0, 0.0]
    used = [71234, 70988, 71502, 69876, 71011, 70432, 38912, 0]
    power = [356.211, 341.87, 372.045, 298.733, 349.921, 331.204, 68.412, 61.377]
    energy = [983412775120, 975118203441, 991003827315, 958377115003]
    energy += [979210554871, 970001338012, 611245876110, 402771903256]
    clock = [1410, 1410, 1410, 1395, 1410, 1410, 1410, 210]
    expected = tuple(
        GpuSample(
            uuid=uuids[i],
            index=i,
            model="NVIDIA A100-SXM4-80GB",
            activity=gr[i],
            activity_metric=GR,
            utilization=util[i],
            memory_used_mib=float(used[i]),
            memory_total_mib=81037.0,  # FB_USED + FB_FREE
            power_w=power[i],
            energy_mj=energy[i],
            sm_clock_mhz=clock[i],
        )
        for i in range(8)
    )
    assert sample == NodeSample(
        cluster="c1",
        node="dgx-a100-017",
        time=T,
        source=SampleSource.DCGM,
        interval_s=15.0,
        gpus=expected,
    )


def test_mig_node() -> None:
    [sample] = parse("h100x2_mig.txt")
    parent = "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5"
    lacking = ("utilization", "power_w", "energy_mj", "sm_clock_mhz")  # board-level only
    instances = [("3g.40gb", 2, 0.612287, 12288, 40192), ("2g.20gb", 3, 0.088121, 6120, 19968)]
    instances += [("1g.10gb", 9, 0.0, 13, 9984), ("1g.10gb", 10, 0.0, 12, 9984)]
    expected = [
        GpuSample(
            uuid=f"MIG-{parent}/{gi}/0",
            index=0,
            model="NVIDIA H100 80GB HBM3",
            mig=MigInstance(parent_uuid=parent, gpu_instance_id=gi, profile=profile),
            activity=act,
            activity_metric=GR,
            memory_used_mib=float(used),
            memory_total_mib=float(total),
            unsupported=lacking,
        )
        for profile, gi, act, used, total in instances
    ]
    expected.append(
        GpuSample(
            uuid="GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf",
            index=1,
            model="NVIDIA H100 80GB HBM3",
            activity=0.377019,
            activity_metric=GR,
            utilization=0.42,
            memory_used_mib=30722.0,
            memory_total_mib=80820.0,
            power_w=402.118,
            energy_mj=688015230117,
            sm_clock_mhz=1980,
        )
    )
    assert sample.node == "gpu-h100-mig-03"
    assert sample.gpus == tuple(expected)


def test_pod_labels_new_style_and_sm_active_first() -> None:
    [sample] = parse("k8s_pods_new_labels.txt")
    assert sample.node == "gke-inference-pool-7f3a"  # lowercase 'hostname' (newer exporters)
    llama = Attribution(
        pod="llama-70b-predictor-6d9f8c7b5-x2kqp", namespace="serving", container="kserve-container"
    )
    assert [g.attribution for g in sample.gpus] == [
        llama,
        llama,
        Attribution(pod="jupyter-alice", namespace="notebooks", container="notebook"),
        None,
    ]
    assert [(g.activity, g.activity_metric) for g in sample.gpus] == [
        (0.412, SM),
        (0.398, SM),
        (0.003, SM),
        (0.0, SM),
    ]
    g0 = sample.gpus[0]
    assert (g0.utilization, g0.memory_used_mib, g0.memory_total_mib, g0.power_w) == (
        0.37,
        18211.0,
        22491.0,
        41.2,
    )
    assert g0.unsupported == ("energy_mj",)  # this exporter's field list has no energy counter


def test_pod_labels_old_style_and_gpu_util_last() -> None:
    [sample] = parse("k8s_pods_old_labels.txt")
    assert sample.node == "k8s-gpu-node-12"
    assert [g.attribution for g in sample.gpus] == [
        Attribution(pod="train-resnet-worker-0", namespace="ml-team", container="pytorch"),
        Attribution(pod="train-resnet-worker-1", namespace="ml-team", container="pytorch"),
    ]
    assert [(g.activity, g.activity_metric, g.utilization) for g in sample.gpus] == [
        (0.88, UTIL, 0.88),
        (0.86, UTIL, 0.86),
    ]
    assert sample.gpus[0].energy_mj == 221931772103 and sample.gpus[0].unsupported == ()


def test_hpc_job_is_the_slurm_attribution() -> None:
    [sample] = parse("slurm_hpc_job.txt")
    assert [g.attribution for g in sample.gpus] == [
        Attribution(slurm_job_id="4471123"),
        Attribution(slurm_job_id="4471123"),
        Attribution(slurm_job_id="4471188_17"),
        None,
    ]


def test_no_hostname_label_uses_the_endpoint_host() -> None:
    text = (FIXTURES / "slurm_hpc_job.txt").read_text().replace(',Hostname="gpu-a40-021"', "")
    [sample] = parse("", text)
    assert sample.node == "10.0.3.7"


@pytest.mark.parametrize(
    ("text", "kind", "reason"),
    [
        ((FIXTURES / "malformed_truncated.txt").read_text(), DeadLetterKind.MALFORMED, "truncated"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x" 37\n', DeadLetterKind.MALFORMED, "text format"),
        ("<html><body>502 Bad Gateway</body></html>\n", DeadLetterKind.MALFORMED, "text format"),
        ("# HELP up\nup 1\n", DeadLetterKind.REJECTED, "no DCGM GPU series"),
        (
            (FIXTURES / "a100x8.txt").read_text().replace(" 0.951203\n", " 1.7\n"),
            DeadLetterKind.SCHEMA,
            "GPU 2 (GPU-9531985d-5d9d-49f8-9818-e811892f902b): activity: Input should be less",
        ),
        (
            (FIXTURES / "a100x8.txt").read_text().replace("} 356.211000\n", "} -5\n"),
            DeadLetterKind.SCHEMA,
            "power_w",
        ),
    ],
)
def test_bad_scrapes(text: str, kind: DeadLetterKind, reason: str) -> None:
    with pytest.raises(ScrapeError) as err:
        parse("", text)
    assert err.value.kind is kind
    assert reason in err.value.reason


def test_float_overshoot_is_clamped_not_refused() -> None:
    text = (FIXTURES / "a100x8.txt").read_text().replace(" 0.951203\n", " 1.0000002\n")
    [sample] = parse("", text)
    assert sample.gpus[2].activity == 1.0


SLICED = "GPU-8e81973e-0bec-47b0-b898-d190f9ebdacc"
WHOLE = "GPU-6b4cb242-4a23-4596-a217-beaddbc496cb"


def virtual_gpus(holders: list[tuple[str, str, str, str, str]]) -> str:
    """A scrape as dcgm-exporter with --kubernetes-virtual-gpus writes it: each GPU's series
    once per container holding a replica, with that pod's labels and the replica as vgpu.
    ``holders``: (uuid, namespace, pod, container, vgpu) in the exporter's order."""
    lines = []
    for field, value in (("DCGM_FI_DEV_GPU_UTIL", 61), ("DCGM_FI_PROF_SM_ACTIVE", 0.55)):
        lines += [f"# HELP {field} x", f"# TYPE {field} gauge"]
        for uuid, ns, pod, container, vgpu in holders:
            gpu = 0 if uuid == SLICED else 1
            lines.append(
                f'{field}{{gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA L4",'
                f'Hostname="gke-shared-pool-2",container="{container}",namespace="{ns}",'
                f'pod="{pod}",vgpu="{vgpu}"}} {value}'
            )
    return "\n".join(lines) + "\n"


def test_time_sliced_gpu_reported_once_per_pod_is_one_device_shared() -> None:
    [sample] = parse(
        "",
        virtual_gpus(
            [  # the exporter's order (the kubelet's), not sorted
                (SLICED, "serving", "embed-c", "server", "2"),
                (SLICED, "batch", "score-z", "worker", "0"),
                (SLICED, "serving", "embed-a", "server", "3"),
                (SLICED, "serving", "embed-b", "server", "1"),
                (SLICED, "serving", "embed-b", "metrics", "4"),  # the same pod: one holder
                (SLICED, "serving", "embed-a", "server", "5"),  # a second replica: one holder
                (WHOLE, "ml", "train-0", "pytorch", ""),
            ]
        ),
    )
    assert [g.uuid for g in sample.gpus] == [SLICED, WHOLE]
    sliced, whole = sample.gpus
    assert sliced.attribution == Attribution(
        pod="score-z",
        namespace="batch",
        container="worker",
        shared=(
            SharingPod(pod="embed-a", namespace="serving", container="server"),
            SharingPod(pod="embed-b", namespace="serving", container="metrics"),
            SharingPod(pod="embed-c", namespace="serving", container="server"),
        ),
    )
    assert (sliced.activity, sliced.utilization) == (0.55, 0.61)  # the same GPU each time
    assert whole.attribution == Attribution(pod="train-0", namespace="ml", container="pytorch")
    assert "shared" not in json.loads(encode(whole))


def test_one_pod_with_two_replicas_shares_with_nobody() -> None:
    [sample] = parse(
        "",
        virtual_gpus(
            [
                (SLICED, "serving", "embed-a", "server", "1"),
                (SLICED, "serving", "embed-a", "server", "0"),
                (SLICED, "serving", "embed-a", "loader", "2"),
            ]
        ),
    )
    assert sample.gpus[0].attribution == Attribution(
        pod="embed-a", namespace="serving", container="loader"
    )


def test_more_sharing_pods_than_kept_are_capped() -> None:
    many = MAX_SHARING_PODS + 6
    [sample] = parse(
        "",
        virtual_gpus(
            [(SLICED, "serving", f"embed-{i:03d}", "server", str(i)) for i in range(many)]
        ),
    )
    a = sample.gpus[0].attribution
    assert a is not None and a.pod == "embed-000" and a.shared is not None
    assert [p.pod for p in a.shared] == [f"embed-{i:03d}" for i in range(1, MAX_SHARING_PODS + 1)]
