"""dcgm-exporter >= 4.8.2 per-pod rows -> measured use (producers/dcgm/per_pod.py).

No recorded post-#594 scrape exists (tests/fixtures/nvidia_process/SOURCES.md, gaps): the
scrapes are rendered by tests/harness/dcgm_text.py in the shape NOTES.md derives from
dcgm-exporter's source. The pre-#594 scrape is recorded (PR #432 comment, SOURCES.md)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.producers.dcgm.parse import parse_scrape
from gpugap.schemas import GpuSample, MeasuredUse
from gpugap.schemas.types import ActivityMetric
from tests.harness.dcgm_text import render
from tests.harness.device_state import DeviceState, Holder, ProcessState

FIXTURES = Path(__file__).parents[2] / "fixtures" / "nvidia_process"
T = datetime(2026, 12, 7, 14, 0, tzinfo=UTC)
POD_A = "0b7c3f6e-2a41-4d8e-9c55-1f0e6a7d2b93"
MIG_UUID = "68914221-dd79-45a4-b412-961c75951ef0"
POD_B = "e5d1a9c2-7f38-46b0-8a1e-3c9d4b2f6e07"
HOLDERS = (
    Holder("research", "trainer-0", "main", POD_A),
    Holder("serving", "vllm-7f9c", "vllm", POD_B),
)


def one_gpu(text: str) -> GpuSample:
    [sample] = parse_scrape(text, cluster="c1", default_node="10.0.0.9", time=T, interval_s=15.0)
    [gpu] = sample.gpus
    return gpu


def state(*processes: ProcessState, busy: float = 0.9, used: float = 30000) -> DeviceState:
    return DeviceState(
        node="gpu-h100-12", index=0, uuid="5f1c0b3a-8d2e-4c71-9a6b-2e4f8d1c7a90",
        model="NVIDIA H100 80GB HBM3", busy=busy, memory_used_mib=used, memory_total_mib=81559,
        power_w=500, energy_j=5e8, holders=HOLDERS, processes=processes,
    )  # fmt: skip


def test_time_sliced_gpu_pods_own_values_and_the_rest_unattributed() -> None:
    s = state(
        ProcessState(11, 0.5, 10000.7, POD_A),
        ProcessState(12, 0.1, 2000.4, POD_A),
        ProcessState(21, 0.2, 8000, POD_B),
        ProcessState(31, 0.1, 4000, None),  # a process of no pod: only in the device row
        busy=0.95,
    )
    gpu = one_gpu(render([s]))
    # the device's own row, not the first pod's
    assert (gpu.utilization, gpu.memory_used_mib) == (0.95, 30000)
    assert gpu.activity == 0.95 and gpu.activity_metric is ActivityMetric.GR_ENGINE_ACTIVE
    assert gpu.measured_use is not None
    a, b, rest = gpu.measured_use
    assert a == MeasuredUse(
        pod_uid=POD_A, pod="trainer-0", namespace="research", activity=0.6, memory_used_mib=12000
    )
    assert (b.pod_uid, b.pod, b.namespace, b.memory_used_mib) == (
        POD_B,
        "vllm-7f9c",
        "serving",
        8000,
    )
    assert b.activity == pytest.approx(0.2)
    assert (rest.pod_uid, rest.pod) == (None, None)
    assert rest.activity == pytest.approx(0.95 - 0.8)
    assert rest.memory_used_mib == 30000 - 12000 - 8000
    assert gpu.attribution is not None and gpu.attribution.pod == "trainer-0"
    assert [p.pod for p in gpu.attribution.shared or ()] == ["vllm-7f9c"]


def test_mps_replicas_of_one_pod_count_once() -> None:
    """dcgm-exporter issue #725: a pod with slots ::5 and ::19 gets its row once per vgpu."""
    s = state(ProcessState(11, 0.4, 5000, POD_A), ProcessState(21, 0.3, 7000, POD_B), busy=0.7)
    text = render([s], replicas={POD_A: ("5", "19")})
    assert text.count(f'pod_uid="{POD_A}",vgpu="19"') == len(text.split("# HELP")) - 1
    use = {u.pod_uid: u for u in one_gpu(text).measured_use or ()}
    assert (use[POD_A].activity, use[POD_A].memory_used_mib) == (0.4, 5000)
    assert None not in use  # 0.4 + 0.3 is all of the device's 70 %


def test_all_pods_zero_on_a_busy_gpu_is_nothing_measured() -> None:
    """No hostPID, or only processes of no pod: every pod row is 0 while the device is busy."""
    gpu = one_gpu(render([state(ProcessState(31, 0.9, 4000, None), busy=0.9)]))
    assert gpu.measured_use is None
    assert gpu.utilization == 0.9  # the device is read as ever


def test_idle_gpu_pods_measured_idle() -> None:
    gpu = one_gpu(render([state(ProcessState(11, 0.0, 900, POD_A), busy=0.0, used=900)]))
    assert gpu.measured_use is not None
    assert [(u.pod_uid, u.activity, u.memory_used_mib) for u in gpu.measured_use] == [
        (POD_A, 0.0, 900),
        (POD_B, 0.0, 0),
    ]


def test_mig_pod_rows_are_zero_and_measure_nothing() -> None:
    """No per-process SM time on MIG: dcgm-exporter's per-pod GPU_UTIL is 0 there."""
    whole = state(ProcessState(11, 0.6, 7484, POD_A), busy=0.6, used=11091)
    s = replace(whole, mig_gi=2, mig_profile="3g.40gb", parent_uuid=whole.uuid, uuid=MIG_UUID)
    gpu = one_gpu(render([s]))
    assert gpu.mig is not None and gpu.mig.gpu_instance_id == 2
    assert gpu.mig.parent_uuid == f"GPU-{whole.uuid}" and gpu.mig.profile == "3g.40gb"
    assert gpu.measured_use is None
    assert gpu.memory_used_mib == 11091 and gpu.activity == 0.6


def test_new_hostname_label_and_pod_rows_before_the_device_row() -> None:
    s = state(ProcessState(11, 0.5, 1000, POD_A), ProcessState(21, 0.25, 1000, POD_B), busy=0.8)
    lines = render([s], hostname_label="hostname").splitlines()
    util = [i for i, line in enumerate(lines) if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    lines[util[0]], lines[util[-1]] = lines[util[-1]], lines[util[0]]  # device row last
    [sample] = parse_scrape("\n".join(lines) + "\n", cluster="c1", default_node="x", time=T,
                            interval_s=15.0)  # fmt: skip
    assert sample.node == "gpu-h100-12"
    [gpu] = sample.gpus
    assert gpu.utilization == 0.8
    assert [u.pod_uid for u in gpu.measured_use or ()] == [POD_A, POD_B, None]


def test_exporters_before_4_8_2_measure_nothing_per_pod() -> None:
    """dcgm_exporter_mps_a100_pre594_pr432.prom (PR #432 comment): both pods get the device's
    15866 MiB and no pod_uid: read as before, the device's value, no measured use."""
    gpu = one_gpu((FIXTURES / "dcgm_exporter_mps_a100_pre594_pr432.prom").read_text())
    assert gpu.measured_use is None
    assert gpu.memory_used_mib == 15866
    assert gpu.attribution is not None and gpu.attribution.shared is not None
