"""dcgm-exporter's per-pod rows (>= 4.8.2, PR #594) -> ``GpuSample.measured_use``.

With ``--kubernetes-virtual-gpus`` (and ``hostPID``, to map PIDs to pods) dcgm-exporter writes
``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` twice: first the device's row with no pod
labels, then one row per pod holding the device, labelled ``pod_uid`` (always), ``pod``,
``namespace``, ``container`` and ``vgpu``. A pod's row is the sum over its PIDs of NVML's
``smUtil`` (%) and ``usedGpuMemory`` (MiB). Every other field is the device's value copied to
every pod row, as before #594; exporters older than 4.8.2 write no ``pod_uid`` and are read
exactly as before (no measured use).

- The same pod can come once per ``vgpu`` (an MPS plugin handing one pod several replicas,
  dcgm-exporter issue #725): one value per (GPU, ``pod_uid``), the first row's.
- A pod holding the device with no PID found gets a literal ``0`` (``buildIdlePodValues``).
  On MIG there is no per-process SM time at all: the per-pod GPU_UTIL rows are all ``0`` and
  mean "not measured" (no measured use; a MeasuredUse needs an activity). On a whole GPU, all
  pods at ``0`` while the device is busy is the same "not measured" (no hostPID, PIDs of no
  pod): never split as if the pods were idle.
- The device value minus the pods' is use of processes of no pod (or of pods holding no
  replica of it): an entry naming no pod, only when the pods' values are real.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpugap.schemas import MeasuredUse
from gpugap.schemas.types import MAX_SHARING_PODS

#: the two fields dcgm-exporter measures per pod (``isPerProcessMetric``), by our names
PER_POD_FIELDS = ("util", "fb_used")


@dataclass
class PodRow:
    """One pod's per-pod values of one device."""

    pod: str | None
    namespace: str | None
    values: dict[str, float] = field(default_factory=dict)


def add_row(
    rows: dict[str, PodRow], uid: str, *, pod: str | None, namespace: str | None, ours: str,
    v: float,
) -> None:  # fmt: skip
    """Keep the first value per (device, pod UID) and field: later ``vgpu`` rows repeat it."""
    row = rows.setdefault(uid, PodRow(pod or None, namespace or None))
    row.values.setdefault(ours, v)


def measured_use(
    rows: dict[str, PodRow], device: dict[str, float], *, mig: bool
) -> tuple[MeasuredUse, ...] | None:
    """The device's use per pod, or None when the rows measure nothing (see the module doc).

    ``device``: the device row's values by our field names (``util`` %, ``fb_used`` MiB)."""
    if not rows or mig:
        return None
    if any("util" not in r.values for r in rows.values()):
        return None  # a pod with memory only: no activity to compare it by
    pods_util = sum(r.values["util"] for r in rows.values())
    device_util = device.get("util")
    if pods_util <= 0 and device_util is not None and device_util > 0:
        return None  # zeros for every pod of a busy device: not measured
    kept = sorted(rows.items(), key=lambda kv: (kv[1].namespace or "", kv[1].pod or "", kv[0]))
    kept = kept[:MAX_SHARING_PODS]
    out = [
        MeasuredUse(
            pod_uid=uid,
            pod=row.pod,
            namespace=row.namespace,
            activity=_ratio(row.values["util"]),
            memory_used_mib=row.values.get("fb_used"),
        )
        for uid, row in kept
    ]
    if device_util is not None and device_util > pods_util:
        out.append(
            MeasuredUse(
                activity=_ratio(device_util - pods_util),
                memory_used_mib=_rest(device.get("fb_used"), rows),
            )
        )
    return tuple(out)


def _ratio(percent: float) -> float:
    # the per-process scale can sum past 100 (NVML's sample periods differ from the device's)
    return min(1.0, max(0.0, percent / 100))


def _rest(device_fb: float | None, rows: dict[str, PodRow]) -> float | None:
    """The device's memory not in any pod's row; None when a pod's is unknown."""
    if device_fb is None or any("fb_used" not in r.values for r in rows.values()):
        return None
    return max(0.0, device_fb - sum(r.values["fb_used"] for r in rows.values()))
