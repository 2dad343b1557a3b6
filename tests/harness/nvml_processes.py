"""Per-process data for the fake NVML (tests/harness/nvml_fake.py): from recorded nvidia-smi
outputs, or rendered from DeviceState.

Recorded outputs (tests/fixtures/nvidia_process/, sources in its SOURCES.md: nvidia-smi
captures of utkuozdemir/nvidia_gpu_exporter, driver 590.48.01 / 595.80):

- ``<name>_pmon.txt`` (``nvidia-smi pmon -c 5``) reads the same per-process sampler as
  ``nvmlDeviceGetProcessUtilization``: each row with an ``sm`` value is one NVML sample; a
  ``-`` is a process without a sample in that period (NVML returns none for a process at 0 %).
  A sample period ends when a PID comes round again. Columns are found by the ``# gpu`` header.
- ``<name>_query_compute_apps.csv`` is ``nvmlDeviceGetComputeRunningProcesses``: pid and
  ``used_gpu_memory`` (MiB there; bytes in NVML).
- ``<name>_nvidia_smi.txt`` (the default table) gives the device's utilization and memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.harness.device_state import DeviceState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_process"
MIB = 1 << 20
#: pmon's sample period (one second) in NVML's µs timestamps
PERIOD_US = 1_000_000
#: an arbitrary CPU time (µs) the recorded samples start at
START_US = 1_784_016_773_000_000


def pmon_samples(
    text: str, *, start_us: int = START_US, period_us: int = PERIOD_US
) -> dict[int, list[dict[str, Any]]]:
    """GPU index -> NVML process samples, from ``nvidia-smi pmon`` output."""
    header = next(line for line in text.splitlines() if line.startswith("# gpu"))
    cols = header.lstrip("#").split()
    at = {name: cols.index(name) for name in ("gpu", "pid", "sm", "mem")}
    out: dict[int, list[dict[str, Any]]] = {}
    period: dict[int, int] = {}
    seen: dict[int, set[int]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cells = line.split()
        gpu = int(cells[at["gpu"]])
        if cells[at["pid"]] == "-":  # an idle GPU: a row with no process
            period[gpu] = period.get(gpu, -1) + 1
            seen[gpu] = set()
            continue
        pid = int(cells[at["pid"]])
        if gpu not in period or pid in seen[gpu]:  # the PID comes round: the next period
            period[gpu] = period.get(gpu, -1) + 1
            seen[gpu] = set()
        seen[gpu].add(pid)
        sm, mem = cells[at["sm"]], cells[at["mem"]]
        if sm == "-":
            continue
        out.setdefault(gpu, []).append(
            {
                "pid": pid,
                "timeStamp": start_us + period[gpu] * period_us,
                "smUtil": int(sm),
                "memUtil": 0 if mem == "-" else int(mem),
            }
        )
    return out


def compute_apps(text: str) -> dict[str, list[dict[str, Any]]]:
    """GPU UUID -> running compute processes, from ``--query-compute-apps ... --format=csv``."""
    lines = [line for line in text.splitlines() if line.strip()]
    cols = [c.strip() for c in lines[0].split(",")]
    uuid_at, pid_at = cols.index("gpu_uuid"), cols.index("pid")
    mem_at = cols.index("used_gpu_memory [MiB]")
    out: dict[str, list[dict[str, Any]]] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        mem = cells[mem_at]
        used = int(mem.removesuffix(" MiB")) * MIB if mem.endswith(" MiB") else None
        out.setdefault(cells[uuid_at], []).append(
            {"pid": int(cells[pid_at]), "usedGpuMemory": used}
        )
    return out


def recorded_gpu(
    name: str, uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
) -> dict[str, Any]:
    """A fake-NVML GPU from the recorded outputs ``<name>_*`` (e.g. ``h100_load``): its process
    samples and processes, and where the default table was recorded its utilization and
    memory. The captures mask UUIDs to zeros: ``uuid`` names the GPU instead."""
    apps = compute_apps((FIXTURES / f"{name}_query_compute_apps.csv").read_text())
    gpu: dict[str, Any] = {
        "uuid": uuid,
        "name": name,
        "mig_mode": [0, 0],
        "process_samples": pmon_samples((FIXTURES / f"{name}_pmon.txt").read_text()).get(0, []),
        "compute_processes": next(iter(apps.values()), []),
    }
    table = FIXTURES / f"{name}_nvidia_smi.txt"
    if table.exists():
        used, total, util = map(
            int,
            re.search(r"(\d+)MiB /\s*(\d+)MiB \|\s+(\d+)%", table.read_text()).groups(),  # type: ignore[union-attr]
        )
        gpu["utilization"] = {"gpu": util, "memory": 0}
        gpu["memory"] = {"used": used * MIB, "total": total * MIB, "free": (total - used) * MIB}
    return gpu


def _memory(used_mib: float, total_mib: float) -> dict[str, int]:
    return {
        "used": round(used_mib * MIB),
        "total": round(total_mib * MIB),
        "free": round((total_mib - used_mib) * MIB),
    }


def _whole(s: DeviceState, samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{s.uuid}",
        "name": s.model,
        "mig_mode": [0, 0],
        "utilization": {"gpu": round(s.busy * 100), "memory": 0},
        "memory": _memory(s.memory_used_mib, s.memory_total_mib),
        "power_mw": round(s.power_w * 1000),
        "energy_mj": round(s.energy_j * 1000),
        "sm_clock_mhz": 1980,
        "process_samples": samples,
        "compute_processes": [
            {"pid": p.pid, "usedGpuMemory": round(p.memory_mib * MIB)} for p in s.processes
        ],
    }


def _mig_parent(slices: list[DeviceState]) -> dict[str, Any]:
    """A GPU in MIG mode as the h100x2_mig fixture has it: no utilization anywhere, and no
    per-process utilization (tests/fixtures/nvidia_process/h100_mig_load_pmon.txt: all '-');
    the slices' processes with their memory."""
    first = slices[0]
    return {
        "uuid": f"GPU-{first.parent_uuid}",
        "name": first.model,
        "mig_mode": [1, 1],
        "max_mig_devices": 7,
        "utilization": "NOT_SUPPORTED",
        "memory": _memory(sum(s.memory_used_mib for s in slices), first.memory_total_mib),
        "power_mw": round(sum(s.power_w for s in slices) * 1000),
        "energy_mj": round(sum(s.energy_j for s in slices) * 1000),
        "sm_clock_mhz": 1980,
        "mig": [
            {
                "slot": slot,
                "uuid": f"MIG-{s.uuid}",
                "name": f"{s.model} MIG {s.mig_profile}",
                "gpu_instance_id": s.mig_gi,
                "compute_instance_id": 0,
                "memory": _memory(s.memory_used_mib, s.memory_total_mib),
                "process_samples": "NOT_SUPPORTED",
                "compute_processes": [
                    {
                        "pid": p.pid,
                        "usedGpuMemory": round(p.memory_mib * MIB),
                        "gpuInstanceId": s.mig_gi,
                        "computeInstanceId": 0,
                    }
                    for p in s.processes
                ],
            }
            for slot, s in enumerate(slices)
        ],
    }


def render_states(
    states: list[DeviceState], time_us: int, before: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A fake-NVML fixture for these devices at ``time_us``, GPUs in index order (one node).

    On a whole GPU each busy process adds one sample (smUtil = busy %) to the GPU's buffer,
    kept from ``before`` (the fixture of the previous poll) as the driver keeps it. MIG slices
    (``mig_gi`` set) are grouped under their parent GPU, which NVML sees in MIG mode."""
    kept = {g["uuid"]: g.get("process_samples", []) for g in (before or {}).get("gpus", [])}
    by_index: dict[int, list[DeviceState]] = {}
    for s in states:
        by_index.setdefault(s.index, []).append(s)
    gpus = []
    for index in sorted(by_index):
        group = by_index[index]
        if group[0].mig_gi is not None:
            gpus.append(_mig_parent(sorted(group, key=lambda s: s.mig_gi or 0)))
            continue
        [s] = group
        samples = list(kept.get(f"GPU-{s.uuid}", [])) + [
            {"pid": p.pid, "timeStamp": time_us, "smUtil": round(p.busy * 100), "memUtil": 0}
            for p in s.processes
            if round(p.busy * 100) > 0
        ]
        gpus.append(_whole(s, samples))
    return {"description": "rendered from DeviceState", "gpus": gpus}


def cgroup_text(pod_uid: str | None, *, driver: str = "systemd", qos: str = "burstable") -> str:
    """``/proc/<pid>/cgroup`` as a node writes it for a process of ``pod_uid`` (None: a
    process of no pod, a host service): cgroup v2 with the kubelet's systemd driver, or
    cgroup v1 with the cgroupfs driver (several hierarchies)."""
    container = "4f1a0c3e9b2d" * 5 + "7a8b"  # a 64-hex container id
    if pod_uid is None:
        if driver == "systemd":
            return "0::/user.slice/user-0.slice/session-3.scope\n"
        return "12:memory:/user.slice\n1:name=systemd:/user.slice/user-0.slice/session-3.scope\n"
    if driver == "systemd":
        slug = pod_uid.replace("-", "_")
        return (
            f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice/"
            f"cri-containerd-{container}.scope\n"
        )
    path = f"/kubepods/{qos}/pod{pod_uid}/{container}"
    return "".join(
        f"{n}:{c}:{path}\n" for n, c in ((12, "memory"), (4, "cpu,cpuacct"), (1, "name=systemd"))
    )


def write_proc(root: Path, states: list[DeviceState], *, driver: str = "systemd") -> Path:
    """A /proc with a cgroup file for every process of these states."""
    for s in states:
        for p in s.processes:
            (root / str(p.pid)).mkdir(parents=True, exist_ok=True)
            (root / str(p.pid) / "cgroup").write_text(cgroup_text(p.pod_uid, driver=driver))
    return root
