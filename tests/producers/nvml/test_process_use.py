"""Measured use per pod on whole GPUs: NVML process utilization + memory, PIDs -> pods by
cgroups (producers/nvml/processes.py, producers/kubelet_cgroup.py).

The recorded outputs are nvidia-smi captures from utkuozdemir/nvidia_gpu_exporter
``internal/captures/`` (tests/fixtures/nvidia_process/SOURCES.md): ``pmon`` reads the same
per-process sampler as nvmlDeviceGetProcessUtilization, ``--query-compute-apps`` the same list
as nvmlDeviceGetComputeRunningProcesses (tests/harness/nvml_processes.py replays them)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import Settings
from gpugap.producers.kubelet_cgroup import pod_uid_of_cgroup, pod_uid_of_pid
from gpugap.producers.nvml.producer import NvmlProducer
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import MeasuredUse, NodeSample
from tests.harness.device_state import DeviceState, ProcessState
from tests.harness.nvml_fake import FakeNvml
from tests.harness.nvml_processes import (
    cgroup_text,
    recorded_gpu,
    render_states,
    write_proc,
)

POD_A = "0b7c3f6e-2a41-4d8e-9c55-1f0e6a7d2b93"
POD_B = "e5d1a9c2-7f38-46b0-8a1e-3c9d4b2f6e07"
UUID = "GPU-5f1c0b3a-8d2e-4c71-9a6b-2e4f8d1c7a90"


def producer(proc: Path, **nvml: Any) -> NvmlProducer:
    cfg = {"node": "gpu-17", "cluster": "k8s-east", "pod_resources_socket": None}
    return NvmlProducer(Settings(), NvmlSettings(**{**cfg, "proc_root": proc, **nvml}))


def tick(p: NvmlProducer) -> NodeSample:
    [sample] = list(asyncio.run(p.poll()))
    assert isinstance(sample, NodeSample)
    return sample


def pods_of(proc: Path, pids: dict[int, str | None], driver: str = "systemd") -> None:
    for pid, uid in pids.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup_text(uid, driver=driver))


def by_pod(uses: tuple[MeasuredUse, ...] | None) -> dict[str | None, MeasuredUse]:
    assert uses is not None
    return {u.pod_uid: u for u in uses}


# --- cgroups -------------------------------------------------------------------------------


@pytest.mark.parametrize("qos", ["burstable", "besteffort"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_cgroup_of_a_pod_process_names_its_uid(driver: str, qos: str) -> None:
    assert pod_uid_of_cgroup(cgroup_text(POD_A, driver=driver, qos=qos)) == POD_A


def test_cgroup_of_a_guaranteed_pod_sits_under_kubepods_itself() -> None:
    v1 = f"11:memory:/kubepods/pod{POD_B}/8c1e0f\n"
    v2 = f"0::/kubepods.slice/kubepods-pod{POD_B.replace('-', '_')}.slice/cri-o-8c1e0f.scope\n"
    assert pod_uid_of_cgroup(v1) == pod_uid_of_cgroup(v2) == POD_B


@pytest.mark.parametrize(
    "text",
    [
        cgroup_text(None, driver="systemd"),
        cgroup_text(None, driver="cgroupfs"),
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice/x.scope\n",
        "0::/system.slice/pod0b7c3f6e2a414d8e9c551f0e6a7d2b93.scope\n",  # not under kubepods
        "0::/kubepods.slice/cri-containerd-pod0b7c3f6e2a414d8e9c551f0e6a7d2b93.scope\n",
        "",
    ],
)
def test_cgroups_of_no_pod(text: str) -> None:
    assert pod_uid_of_cgroup(text) is None


def test_pid_lookup_reads_the_proc_root(tmp_path: Path) -> None:
    pods_of(tmp_path, {41: POD_A, 42: None}, driver="cgroupfs")
    assert pod_uid_of_pid(41, tmp_path) == POD_A
    assert pod_uid_of_pid(42, tmp_path) is None
    assert pod_uid_of_pid(43, tmp_path) is None  # exited, or in another PID namespace


# --- recorded outputs ----------------------------------------------------------------------


def test_h100_load_gpu_burn_pod_busy_memhog_pod_holds_memory(tmp_path: Path) -> None:
    """h100_load_* (H100 80GB HBM3, driver 590.48.01): gpu_burn at 99 % in every pmon sample,
    two memhogs without a sample (0 %) holding 2566 + 1542 MiB."""
    pods_of(tmp_path, {11327: POD_A, 11328: POD_A, 11345: POD_B})
    fake = FakeNvml({"gpus": [recorded_gpu("h100_load", UUID)]})
    with fake.installed():
        [gpu] = tick(producer(tmp_path)).gpus
    use = by_pod(gpu.measured_use)
    assert set(use) == {POD_A, POD_B}
    assert use[POD_B].activity == pytest.approx(0.99)
    assert use[POD_B].memory_used_mib == 15690
    assert (use[POD_A].activity, use[POD_A].memory_used_mib) == (0.0, 2566 + 1542)
    assert gpu.activity == 1.0  # the device's own utilization is untouched


def test_h200_split_sample_and_a_process_of_no_pod(tmp_path: Path) -> None:
    """h200_load_* (H200, 590.48.01): one of five pmon samples splits SM 19 / 79 between a
    memhog and gpu_burn; the other memhog (10293) is in no pod's cgroup: unattributed."""
    pods_of(tmp_path, {10291: POD_A, 10293: None, 10309: POD_B})
    with FakeNvml({"gpus": [recorded_gpu("h200_load", UUID)]}).installed():
        [gpu] = tick(producer(tmp_path)).gpus
    use = by_pod(gpu.measured_use)
    assert use[POD_A].activity == pytest.approx(19 / 5 / 100)
    assert use[POD_B].activity == pytest.approx((99 * 4 + 79) / 5 / 100)
    assert use[None] == MeasuredUse(activity=0.0, memory_used_mib=1542)
    assert [u.pod_uid for u in gpu.measured_use or ()] == [POD_A, POD_B, None]


def test_l40s_two_encoders_in_two_pods(tmp_path: Path) -> None:
    """l40s_load_* (L40S, 595.80): two ffmpeg NVENC processes, both sampled every period."""
    pods_of(tmp_path, {20037: POD_A, 20038: POD_B}, driver="cgroupfs")
    with FakeNvml({"gpus": [recorded_gpu("l40s_load", UUID)]}).installed():
        [gpu] = tick(producer(tmp_path)).gpus
    use = by_pod(gpu.measured_use)
    assert use[POD_A].activity == pytest.approx((2 + 2 + 1 + 0 + 2) / 5 / 100)
    assert use[POD_A].memory_used_mib == 538
    assert use[POD_B].activity == pytest.approx((6 + 5 + 8 + 7 + 5) / 5 / 100)
    assert use[POD_B].memory_used_mib == 681


def test_idle_gpu_not_found_is_measured_and_empty(tmp_path: Path) -> None:
    """h100_idle_* : pmon has no process, query-compute-apps prints its header only; NVML
    answers NotFound, which is an idle GPU, not an error."""
    with FakeNvml({"gpus": [recorded_gpu("h100_idle", UUID)]}).installed():
        [gpu] = tick(producer(tmp_path)).gpus
    assert gpu.measured_use == ()
    assert gpu.unsupported == ("activity", "utilization", "memory_used_mib", "memory_total_mib",
                               "power_w", "energy_mj", "sm_clock_mhz")  # fmt: skip


# --- polls over time (DeviceState) ---------------------------------------------------------


def state(*processes: ProcessState, busy: float = 0.9) -> DeviceState:
    return DeviceState(
        node="gpu-17", index=0, uuid=UUID.removeprefix("GPU-"), model="NVIDIA A100-SXM4-80GB",
        busy=busy, memory_used_mib=30000, memory_total_mib=81920, power_w=300, energy_j=1e6,
        processes=processes,
    )  # fmt: skip


def test_each_poll_reads_only_samples_since_the_last(tmp_path: Path) -> None:
    first = [state(ProcessState(1, 0.6, 1000, POD_A), ProcessState(2, 0.3, 2000, POD_B))]
    then = [state(ProcessState(1, 0.1, 1000, POD_A), ProcessState(2, 0.8, 2000, POD_B))]
    write_proc(tmp_path, first)
    fake = FakeNvml(render_states(first, 1_000_000))
    with fake.installed():
        p = producer(tmp_path)
        one = by_pod(tick(p).gpus[0].measured_use)
        fake.data = render_states(then, 2_000_000, fake.data)
        two = by_pod(tick(p).gpus[0].measured_use)
        nothing_new = by_pod(tick(p).gpus[0].measured_use)  # the processes still hold memory
    assert (one[POD_A].activity, one[POD_B].activity) == (0.6, 0.3)
    assert (two[POD_A].activity, two[POD_B].activity) == (0.1, 0.8)
    assert {u: m.activity for u, m in nothing_new.items()} == {POD_A: 0.0, POD_B: 0.0}
    assert nothing_new[POD_B].memory_used_mib == 2000


# --- what is not measured ------------------------------------------------------------------


def test_not_supported_is_nothing_measured_and_not_asked_again(tmp_path: Path) -> None:
    gpu = recorded_gpu("h100_load", UUID) | {"process_samples": "NOT_SUPPORTED"}
    fake = FakeNvml({"gpus": [gpu]})
    with fake.installed():
        p = producer(tmp_path)
        assert tick(p).gpus[0].measured_use is None
        fake.data["gpus"][0] = recorded_gpu("h100_load", UUID)  # would answer now
        assert tick(p).gpus[0].measured_use is None


def test_unknown_memory_is_none_not_zero(tmp_path: Path) -> None:
    gpu = recorded_gpu("h100_load", UUID)
    gpu["compute_processes"][0]["usedGpuMemory"] = None  # NVML_VALUE_NOT_AVAILABLE (WDDM)
    pods_of(tmp_path, {11327: POD_A, 11328: POD_A, 11345: POD_B})
    with FakeNvml({"gpus": [gpu]}).installed():
        use = by_pod(tick(producer(tmp_path)).gpus[0].measured_use)
    assert use[POD_A].memory_used_mib is None and use[POD_B].memory_used_mib == 15690


def test_mig_instances_have_no_process_use(tmp_path: Path) -> None:
    """NVML attributes no SM time to processes under MIG (h100_mig_load_pmon.txt: all '-')."""
    with FakeNvml("h100x2_mig").installed():
        gpus = tick(producer(tmp_path)).gpus
    assert all(g.measured_use is None for g in gpus if g.mig is not None)


def test_rendered_mig_slices_beside_a_whole_gpu(tmp_path: Path) -> None:
    """DeviceState MIG slices render as a GPU in MIG mode: the slices carry no process use,
    the whole GPU next to them does."""
    parent = "3d2d33ab-c3b2-434c-a80e-26e207780255"
    slices = [
        replace(
            state(ProcessState(5, 0.7, 7000, POD_A)),
            uuid=u,
            mig_gi=gi,
            mig_profile=profile,
            parent_uuid=parent,
        )
        for u, gi, profile in (
            ("68914221-dd79-45a4-b412-961c75951ef0", 2, "3g.40gb"),
            ("0fd630f1-f29d-4da9-953f-48f1a09f76b5", 3, "2g.20gb"),
        )
    ]
    whole = replace(state(ProcessState(9, 0.5, 3000, POD_B)), index=1)
    states = [*slices, whole]
    write_proc(tmp_path, states)
    with FakeNvml(render_states(states, 1_000_000)).installed():
        gpus = tick(producer(tmp_path)).gpus
    assert [(g.uuid, g.mig is not None) for g in gpus] == [
        ("MIG-68914221-dd79-45a4-b412-961c75951ef0", True),
        ("MIG-0fd630f1-f29d-4da9-953f-48f1a09f76b5", True),
        (UUID, False),
    ]
    assert [g.measured_use for g in gpus[:2]] == [None, None]
    assert by_pod(gpus[2].measured_use)[POD_B].activity == 0.5


def test_setting_off_reads_no_process(tmp_path: Path) -> None:
    """The cost of the setting: two NVML calls per whole GPU and poll, none when off."""
    fake = FakeNvml({"gpus": [recorded_gpu("h100_load", UUID)]})
    pods_of(tmp_path, {11327: POD_A, 11328: None, 11345: POD_B})

    def calls_of_a_tick(p: NvmlProducer) -> tuple[int, Any]:
        before = fake.calls
        sample = tick(p)
        return fake.calls - before, sample.gpus[0].measured_use

    with fake.installed():
        off, none = calls_of_a_tick(producer(tmp_path, process_use=False))
        on, measured = calls_of_a_tick(producer(tmp_path))
    assert none is None and measured is not None
    assert on - off == 2


def test_processes_not_visible_measure_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without hostPID the driver's PIDs are not in the agent's /proc: that is no measure,
    not every process being of no pod."""
    fake = FakeNvml({"gpus": [recorded_gpu("h100_load", UUID)]})
    with fake.installed(), caplog.at_level(logging.WARNING):
        p = producer(tmp_path)
        assert tick(p).gpus[0].measured_use is None
        assert tick(p).gpus[0].measured_use is None
    assert sum("hostPID" in r.getMessage() for r in caplog.records) == 1
    pods_of(tmp_path, {11345: POD_B})  # one visible: the others exited or are of no pod
    fake.data = {"gpus": [recorded_gpu("h100_load", UUID)]}
    with fake.installed():
        use = by_pod(tick(producer(tmp_path)).gpus[0].measured_use)
    assert set(use) == {POD_B, None}


def test_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_NVML_PROCESS_USE", "false")
    monkeypatch.setenv("GPUGAP_NVML_PROC_ROOT", "/host/proc")
    cfg = NvmlSettings()
    assert cfg.process_use is False and cfg.proc_root == Path("/host/proc")


def test_pods_past_the_cap_count_as_no_pods_use_never_the_kept_ones(tmp_path: Path) -> None:
    """70 pods' processes on one GPU (a sample keeps 64 holders): the 6 past the cap are
    folded into the no-pod entry, so the kept pods' proportions are not inflated by their use
    and nothing a process measured is lost."""
    uids = [f"{n:08x}-0000-4000-8000-000000000000" for n in range(70)]
    procs = [ProcessState(100 + n, 0.01, 10, uid) for n, uid in enumerate(uids)]
    states = [state(*procs, busy=0.7)]
    write_proc(tmp_path, states)
    with FakeNvml(render_states(states, 1_000_000)).installed():
        uses = by_pod(tick(producer(tmp_path)).gpus[0].measured_use)
    assert len(uses) == 65 and set(uses) == {*uids[:64], None}
    assert uses[None].activity == pytest.approx(0.06)  # the last 6 pods, 1 % each
    assert sum(u.activity for u in uses.values()) == pytest.approx(0.70)
    assert uses[None].memory_used_mib == pytest.approx(60.0)
