"""The mixed estate (gpugap/simulator/mixed.py) as the devices' tools see it: per node and
instant, the vendor-neutral DeviceState each fake renders (amdsmi, NVML, dcgm-exporter, AMD's
and Intel's exporters), the pods' Kubernetes events, and the processes' cgroups in a proc
tree, so one scenario drives every agent and scraper (tests/streams/test_mixed_estate.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpugap.schemas.models import K8sPodEvent
from gpugap.schemas.types import EventSource, PodEventKind, PodPhase, WorkloadClass
from gpugap.simulator import mixed
from tests.harness.device_state import DeviceState, Holder, ProcessState

START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
END_S = mixed.MINUTES * 60
IDLE_W, BUSY_W = 100.0, 600.0


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def ticks() -> list[int]:
    """The instants every agent and scraper reads: each sample describes the 10 s before."""
    return list(range(mixed.INTERVAL_S, END_S + 1, mixed.INTERVAL_S))


def _holder(sc: mixed.Scenario, name: str) -> Holder:
    p = sc.pods[name]
    return Holder(namespace=p.namespace, pod=p.name, container="main", pod_uid=p.uid)


def states(sc: mixed.Scenario, node: str, t: int) -> list[DeviceState]:
    """Node ``node``'s devices over (t - 10 s, t]."""
    minute = (t - 1) // 60
    out = []
    for d in sc.devices:
        if d.node != node:
            continue
        busy = float(d.busy(minute))
        procs = []
        for u in d.uses:
            pod = sc.pods.get(u.pod) if u.pod else None
            procs.append(
                ProcessState(
                    pid=u.pid, busy=float(u.busy[minute]), memory_mib=1024.0,
                    pod_uid=pod.uid if pod else None, pod=pod.name if pod else None,
                    namespace=pod.namespace if pod else None,
                    container="main" if pod else None,
                )
            )  # fmt: skip
        power = IDLE_W + BUSY_W * busy
        out.append(
            DeviceState(
                node=d.node, index=d.index, uuid=d.uuid, model=d.model, busy=busy,
                memory_used_mib=1024.0 * len(procs), memory_total_mib=d.memory_total_mib,
                power_w=power, energy_j=power * t, serial=d.serial,
                pci_bdf=f"0000:{0x10 + d.index:02x}:00.0",
                partition_id=d.partition[0] if d.partition else None,
                partition_mode=d.partition[1] if d.partition else None,
                mig_gi=d.mig[0] if d.mig else None, mig_profile=d.mig[1] if d.mig else None,
                parent_uuid=d.parent_uuid.removeprefix("GPU-") if d.parent_uuid else None,
                tile_busy=tuple(float(x[minute]) for x in d.tiles) if d.tiles else None,
                holders=tuple(_holder(sc, h) for h in d.holders),
                processes=tuple(procs),
            )
        )  # fmt: skip
    return out


def pod_events(sc: mixed.Scenario) -> list[K8sPodEvent]:
    """Each pod bound at the start and terminated at the end, as the pod watcher says."""
    out = []
    for p in sc.pods.values():
        gpus = sum(1 for d in sc.devices if p.name in d.holders)
        for kind, t, phase in (
            (PodEventKind.BOUND, 0, PodPhase.PENDING),
            (PodEventKind.TERMINATED, END_S, PodPhase.SUCCEEDED),
        ):
            out.append(
                K8sPodEvent(
                    event_id=f"k8s/{mixed.CLUSTER}/{p.uid}/{kind.value}", kind=kind, time=at(t),
                    source=EventSource.WATCH, cluster=mixed.CLUSTER, uid=p.uid,
                    namespace=p.namespace, name=p.name, node=p.node, phase=phase, gpus=gpus,
                    workload_class=WorkloadClass.BATCH, owner=p.owner, team=p.team,
                )
            )  # fmt: skip
    return out


def proc_tree(sc: mixed.Scenario, root: Path) -> Path:
    """``root``/<pid>/cgroup for every process, in cgroup v2's systemd form
    (kubepods-burstable-pod<uid with underscores>.slice), as a kubelet with the systemd
    driver writes them; processes of no pod in a user session's scope."""
    for d in sc.devices:
        for u in d.uses:
            pod = sc.pods.get(u.pod) if u.pod else None
            if pod:
                under = pod.uid.replace("-", "_")
                path = (
                    "0::/kubepods.slice/kubepods-burstable.slice/"
                    f"kubepods-burstable-pod{under}.slice/cri-containerd-{u.pid:064x}.scope\n"
                )
            else:
                path = "0::/user.slice/user-1000.slice/session-3.scope\n"
            (root / str(u.pid)).mkdir(parents=True, exist_ok=True)
            (root / str(u.pid) / "cgroup").write_text(path)
    return root


def sysfs(sc: mixed.Scenario, node: str, root: Path) -> Path:
    """The sysfs AMD's device plugin and the agent read for partitions other than 0: per
    partition, ``devices/platform/amdgpu_xcp_<n>/drm/renderD<minor>`` and the KFD topology
    node whose ``drm_render_minor`` is that minor (the fake amdsmi's node of handle ``i`` is
    ``i + 1``)."""
    for i, d in enumerate(s for s in sc.devices if s.node == node):
        if d.partition is None or d.partition[0] == 0:
            continue
        minor = 128 + i
        (root / "devices" / "platform" / xcp_id(i) / "drm" / f"renderD{minor}").mkdir(
            parents=True, exist_ok=True
        )
        props = root / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(i + 1)
        props.mkdir(parents=True, exist_ok=True)
        (props / "properties").write_text(f"cpu_cores_count 0\ndrm_render_minor {minor}\n")
    return root


def xcp_id(position: int) -> str:
    """The AMD device plugin's id of the partition at this handle position."""
    return f"amdgpu_xcp_{position}"


def kubelet_devices(sc: mixed.Scenario, node: str) -> dict[str, list[str]]:
    """pod name -> the device ids the kubelet lists for it on ``node``: NVIDIA's UUIDs
    (``::N`` replicas on a time-sliced GPU), AMD's PCI address or ``amdgpu_xcp_<n>``."""
    out: dict[str, list[str]] = {}
    for i, d in enumerate(s for s in sc.devices if s.node == node):
        for r, pod in enumerate(d.holders):
            if d.vendor == "nvidia":
                name = ("MIG-" if d.mig else "GPU-") + d.uuid
                out.setdefault(pod, []).append(f"{name}::{r}" if len(d.holders) > 1 else name)
            elif d.partition is None or d.partition[0] == 0:
                out.setdefault(pod, []).append(f"0000:{0x10 + d.index:02x}:00.0")
            else:
                out.setdefault(pod, []).append(xcp_id(i))
    return out
