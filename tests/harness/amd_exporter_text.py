"""A fake AMD Device Metrics Exporter: DeviceState -> its /metrics text, in the shape of the
recorded scrapes (tests/fixtures/amd/, NOTES.md section 3):

- label names lower case, sorted as client_golang writes them (the fixtures'
  ``card_model,card_series,card_vendor,cluster_name,container,...,vbios_version`` order),
  Kubernetes and Slurm labels present and ``""`` when empty (#162, #171); the optional ones
  (``gpu_uuid``, ``card_series``...) only when turned on, as DME's ``Labels`` config does
  (PR #316's scrape has neither);
- ``# HELP`` / ``# TYPE`` per family, with DME's help texts (``gpuagent_gpu_metrics.go``);
  families sorted by name, series by their label values, floats as Go's shortest ``'g'``;
- the optional ``MetricsFieldPrefix`` prepended as is (``amd_gpu_gfx_activity``, PR #211);
- a compute partition has its own ``gpu_id`` (PR #316: ``gpu_id="14"`` is partition 6),
  busy per XCC in ``gpu_gfx_busy_instantaneous{xcc_index}``; only partition 0 reports
  ``gpu_gfx_activity`` (XCP 0's figure, DME#139), secondary partitions report power 0 and no
  energy (DME's metric list);
- units: percent, MB (= MiB), W, µJ.

One series per pod holding a device (each with that pod's labels), as a time-sliced GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal

from gpugap.schemas.shares import amd_partition_count, amd_xcds_of
from tests.harness.device_state import DeviceState

HELP = {
    "gpu_energy_consumed": "Accumulated energy consumed by the GPU in uJ",
    "gpu_free_vram": "Free VRAM memory of the GPU (in MB)",
    "gpu_gfx_activity": "Graphics engine usage in Percentage (0-100)",
    "gpu_gfx_busy_instantaneous": "Gfx busy instantaneous per accelerated compute "
    "processor(xcp) per compute core (xcc), as per partitioning of the system",
    "gpu_nodes_total": "Number of GPUs in the node",
    "gpu_package_power": "Current socket power in Watts",
    "gpu_power_usage": "GPU Power usage in Watts",
    "gpu_total_vram": "Total VRAM memory of the GPU (in MB)",
    "gpu_used_vram": "Used VRAM memory of the GPU (in MB)",
}
#: labels that can be turned off in DME's Labels (NOTES.md); GPU_UUID is the one gpugap needs
OPTIONAL_LABELS = (
    *("gpu_uuid", "card_series", "card_vendor", "cluster_name", "driver_version"),
    "vbios_version",
)
#: board part numbers of recorded scrapes (card_model), by market name
PART_NUMBERS = {"AMD Instinct MI300X": "102-G30211-0C"}


def go_float(x: float) -> str:
    """A float as client_golang writes it: Go's shortest ``'g'`` (exponent form from 1e6)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "0"
    sign, digits, exp = Decimal(repr(float(x))).as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    stripped = text.rstrip("0")
    exp += len(text) - len(stripped)
    point = len(stripped) + exp  # digits before the decimal point
    minus = "-" if sign else ""
    e10 = point - 1
    if e10 < -4 or e10 >= 6:
        mantissa = stripped[0] + ("." + stripped[1:] if len(stripped) > 1 else "")
        return f"{minus}{mantissa}e{'+' if e10 >= 0 else '-'}{abs(e10):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{stripped}"
    if point >= len(stripped):
        return f"{minus}{stripped}{'0' * (point - len(stripped))}"
    return f"{minus}{stripped[:point]}.{stripped[point:]}"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(d: DeviceState, on: Iterable[str], cluster: str) -> list[dict[str, str]]:
    """The label set of each series of ``d``: one per holder (one with empty pod labels)."""
    base = {
        "card_model": PART_NUMBERS.get(d.model, ""),
        "card_series": d.model,
        "card_vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
        "cluster_name": cluster,
        "driver_version": "6.12.12",
        "gpu_compute_partition_type": (d.partition_mode or "spx").lower(),
        "gpu_id": str(d.index),
        "gpu_memory_partition_type": "nps1",
        "gpu_partition_id": str(d.partition_id or 0),
        "gpu_uuid": d.uuid,
        "hostname": d.node,
        "job_id": d.slurm_job_id or "",
        "job_partition": "",
        "job_user": "",
        "serial_number": d.serial,
        "vbios_version": "022.040.003.042.000001",
    }
    for name in set(OPTIONAL_LABELS) - set(on):
        del base[name]
    holders = [(h.pod, h.namespace, h.container) for h in d.holders] or [("", "", "")]
    return [
        {**base, "pod": pod, "namespace": namespace, "container": container}
        for pod, namespace, container in holders
    ]


def _xccs(d: DeviceState) -> int:
    """XCCs of a device: its model's XCDs, split among the mode's partitions (0: none known,
    a GPU before MI300 reports no busy per XCC)."""
    xcds = amd_xcds_of(d.model) or 0
    count = amd_partition_count(d.partition_mode, d.model) if d.partition_mode else 1
    return xcds // count if xcds and count else 0


def _values(d: DeviceState) -> dict[str, list[tuple[dict[str, str], float]]]:
    """metric -> (extra labels, value) of one device."""
    secondary = (d.partition_id or 0) != 0
    out: dict[str, list[tuple[dict[str, str], float]]] = {
        "gpu_used_vram": [({}, d.memory_used_mib)],
        "gpu_total_vram": [({}, d.memory_total_mib)],
        "gpu_free_vram": [({}, d.memory_total_mib - d.memory_used_mib)],
        "gpu_power_usage": [({}, 0.0 if secondary else d.power_w)],
        "gpu_package_power": [({}, 0.0 if secondary else d.power_w)],
        "gpu_gfx_busy_instantaneous": [
            ({"xcc_index": str(i)}, round(d.busy * 100, 3)) for i in range(_xccs(d))
        ],
    }
    if not secondary:
        out["gpu_gfx_activity"] = [({}, round(d.busy * 100))]
        out["gpu_energy_consumed"] = [({}, d.energy_j * 1e6)]
    return out


def render(
    states: Sequence[DeviceState],
    *,
    prefix: str = "",
    labels: Iterable[str] = OPTIONAL_LABELS,
    metrics: Iterable[str] = tuple(HELP),
    cluster: str = "amdgpu-k8s-metrics-exporter",
) -> str:
    """One node's /metrics text for ``states`` (one exporter per node: all on one node).
    ``labels``: the optional labels turned on; ``metrics``: the families exported."""
    on, wanted = tuple(labels), set(metrics)
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for d in states:
        for series_labels in _labels(d, on, cluster):
            for metric, values in _values(d).items():
                for extra, value in values:
                    families.setdefault(metric, []).append(({**series_labels, **extra}, value))
    if states:
        node = {"cluster_name": cluster, "hostname": states[0].node}
        if "cluster_name" not in on:
            del node["cluster_name"]
        families["gpu_nodes_total"] = [(node, float(len(states)))]
    lines = []
    for metric in sorted(families):
        if metric not in wanted:
            continue
        name = prefix + metric
        lines += [f"# HELP {name} {HELP[metric]}", f"# TYPE {name} gauge"]
        rows = []
        for series_labels, value in families[metric]:
            names = sorted(series_labels)
            text = ",".join(f'{n}="{_quote(series_labels[n])}"' for n in names)
            rows.append(([series_labels[n] for n in names], f"{name}{{{text}}} {go_float(value)}"))
        lines += [row for _, row in sorted(rows)]
    return "\n".join(lines) + "\n" if lines else ""
