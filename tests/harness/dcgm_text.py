"""dcgm-exporter >= 4.8.2 ``/metrics`` text rendered from DeviceState.

The shape is that of dcgm-exporter with ``--kubernetes-virtual-gpus`` after PR #594
(tests/fixtures/nvidia_process/NOTES.md, from ``internal/pkg/transformation/kubernetes.go``
``createPerProcessMetrics`` and ``process_metrics.go``): every metric's device row first, with
no pod labels, then one row per pod holding the device, adding ``container``, ``namespace``,
``pod``, ``pod_uid`` and ``vgpu`` after the device labels (the label order of the recorded
tests/fixtures/nvidia_process/dcgm_exporter_mps_a100_pre594_pr432.prom). Only
``DCGM_FI_DEV_GPU_UTIL`` (sum of the pod's PIDs' smUtil %) and ``DCGM_FI_DEV_FB_USED`` (sum of
their MiB, each truncated) are the pod's own; every other field is the device's value copied.
A pod with no process gets ``0``, processes of no holding pod are dropped from the pod rows
(the device row still counts them). A MIG slice (DeviceState.mig_gi) is labelled with its
parent's UUID, GPU_I_ID and GPU_I_PROFILE; there is no per-process SM time under MIG, so its
GPU_UTIL is ``0`` in the device row and in every pod row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tests.harness.device_state import DeviceState

#: (metric, HELP text, TYPE) in dcgm-exporter's default-counters order
METRICS = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge"),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "counter",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gauge"),
)
PER_POD = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")


def _labels(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


def _device_values(s: DeviceState, mig: bool) -> dict[str, str]:
    return {
        "DCGM_FI_DEV_SM_CLOCK": "1980",
        "DCGM_FI_DEV_POWER_USAGE": f"{s.power_w:.6f}",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(round(s.energy_j * 1000)),
        "DCGM_FI_DEV_GPU_UTIL": "0" if mig else str(round(s.busy * 100)),
        "DCGM_FI_DEV_FB_FREE": str(int(s.memory_total_mib - s.memory_used_mib)),
        "DCGM_FI_DEV_FB_USED": str(int(s.memory_used_mib)),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": f"{s.busy:.6f}",
    }


def _pod_value(metric: str, s: DeviceState, pod_uid: str, mig: bool) -> str:
    mine = [p for p in s.processes if p.pod_uid == pod_uid]
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return "0" if mig else str(sum(round(p.busy * 100) for p in mine))
    return str(sum(math.floor(p.memory_mib) for p in mine))


def render(
    states: list[DeviceState],
    *,
    hostname_label: str = "Hostname",
    replicas: Mapping[str, tuple[str, ...]] | None = None,
) -> str:
    """The /metrics text of one exporter for these devices.

    ``hostname_label``: ``hostname`` for exporters after #655. ``replicas``: pod UID
    -> the ``vgpu`` ids the device plugin gave it (several: the repeated rows of issue #725);
    by default each holder has one, its position among the holders."""
    out: list[str] = []
    for metric, help_text, kind in METRICS:
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for s in states:
            instance = s.mig_gi
            device = [
                ("gpu", str(s.index)),
                ("UUID", f"GPU-{s.uuid if instance is None else s.parent_uuid}"),
                ("pci_bus_id", s.pci_bdf or f"00000000:{s.index + 7:02x}:00.0"),
                ("device", f"nvidia{s.index}"),
                ("modelName", s.model),
            ]
            if instance is not None:
                device += [("GPU_I_PROFILE", s.mig_profile or ""), ("GPU_I_ID", str(instance))]
            device += [(hostname_label, s.node), ("DCGM_FI_DRIVER_VERSION", "590.48.01")]
            value = _device_values(s, instance is not None)[metric]
            out.append(f"{metric}{{{_labels(device)}}} {value}")
            for i, h in enumerate(s.holders):
                pod_value = (
                    _pod_value(metric, s, h.pod_uid, instance is not None)
                    if metric in PER_POD
                    else value
                )
                for vgpu in (replicas or {}).get(h.pod_uid, (str(i),)):
                    pod = [
                        ("container", h.container),
                        ("namespace", h.namespace),
                        ("pod", h.pod),
                        ("pod_uid", h.pod_uid),
                        ("vgpu", vgpu),
                    ]
                    out.append(f"{metric}{{{_labels(device + pod)}}} {pod_value}")
    return "\n".join(out) + "\n"
