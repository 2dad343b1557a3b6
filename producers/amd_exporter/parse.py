"""AMD Device Metrics Exporter's Prometheus text -> node samples (pure: no I/O).

What is read (names, units and labels: tests/fixtures/amd/NOTES.md section 3, from DME's
``gpuagent_gpu_metrics.go`` and its config docs):

- ``gpu_gfx_activity`` (percent) / 100 is a whole GPU's activity (GFX_ACTIVITY).
- ``gpu_gfx_busy_instantaneous{xcc_index}`` (percent per XCC): a compute partition's activity
  is the mean over its XCCs / 100 (GFX_BUSY_INST). Only partition 0 reports
  ``gpu_gfx_activity``, and it is the device's (XCP 0's) figure, never a partition's.
- ``gpu_used_vram`` / ``gpu_total_vram``: DME's "MB" is MiB (amdsmi's ``vram_total`` of an
  MI300X's 192 GiB reads 196592), stored as is. A partition reports its GPU's VRAM.
- ``gpu_power_usage``, else ``gpu_package_power`` (MI3xx socket power), else
  ``gpu_average_package_power`` (MI2xx), in W. Secondary partitions report 0: not measured.
- ``gpu_energy_consumed`` (µJ, a counter exported as a gauge) / 1000 = ``energy_mj``.
- ``gpu_process_cu_occupancy`` is NOT read: the share of CUs a process occupies is not how
  busy it kept the GPU (a kernel can fill every CU and idle most of the time), so it is no
  ``measured_use``.

Names may carry the exporter's ``MetricsFieldPrefix``, prepended without a separator
(``amd_gpu_gfx_activity``): it is found in the scrape (the part before a known name) or set.

Identity: ``gpu_uuid`` is required (GPU_UUID is optional in DME's Labels; an SR-IOV VF
reports all zeros): without it a device cannot be named, and the scrape is one dead letter
saying what to turn on. A whole GPU is ``AMD-<gpu_uuid>``. Compute partitions
(``gpu_compute_partition_type`` dpx/tpx/qpx/cpx, ``gpu_partition_id``) are grouped into their
GPU by ``serial_number``: each is ``AMD-<uuid of the GPU's partition 0>/<partition id>``
(ROCm >= 7.0 gives each partition a UUID, 6.x one for all: partition 0's names both alike),
with ``DevicePartition.count`` from the mode and the model (``schemas/shares.py``).

Model: ``card_series`` (a market name, optional in Labels) when present, else
``card_model`` (a board part number, always present, "" on VFs).

Attribution: ``pod``/``namespace``/``container`` ("" = none) and ``job_id`` (Slurm, filled
by the exporter's prolog) as dcgm's: several pods on one device are ``shared``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gpugap.producers.dcgm.parse import pods_attribution
from gpugap.producers.prometheus.text import ScrapeError, Series, check_complete, scrape_series
from gpugap.schemas import DevicePartition, GpuSample, NodeSample
from gpugap.schemas.shares import amd_partition_count
from gpugap.schemas.types import (
    ActivityMetric,
    DeadLetterKind,
    PartitionKind,
    SampleSource,
    Vendor,
)

#: DME metric (without prefix) -> our name for it
FIELDS = {
    "gpu_gfx_activity": "gfx_activity",
    "gpu_gfx_busy_instantaneous": "busy_inst",
    "gpu_used_vram": "vram_used",
    "gpu_total_vram": "vram_total",
    "gpu_power_usage": "power",
    "gpu_package_power": "package_power",
    "gpu_average_package_power": "average_package_power",
    "gpu_energy_consumed": "energy",
}
PERCENT_FIELDS = ("gfx_activity", "busy_inst")
SAMPLE_FIELDS = ("activity", "memory_used_mib", "memory_total_mib", "power_w", "energy_mj")
PARTITIONED_MODES = ("dpx", "tpx", "qpx", "cpx")
#: DME's own rule for MetricsFieldPrefix (``metricsutil.GetPrefix``)
PREFIX_PATTERN = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: board part numbers (``card_model``) seen in recorded scrapes, for a CPX partition count
#: when ``card_series`` is off: 102-G30211-0C (silogen/kaiwo's MI300X OAM, SOURCES.md),
#: 102-G30213-0C (DME PR #316's MI300X in CPX)
PART_NUMBERS = {"102-G30211-0C": "AMD Instinct MI300X", "102-G30213-0C": "AMD Instinct MI300X"}
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
LABELS_FIX = "add GPU_UUID to GPUConfig.Labels in the exporter's config.json (or configmap)"


@dataclass
class _Device:
    node: str
    index: int
    labels: Mapping[str, str]
    values: dict[str, float] = field(default_factory=dict)
    #: xcc_index -> busy percent
    busy: dict[str, float] = field(default_factory=dict)
    pods: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def what(self) -> str:
        return f"GPU {self.index} on {self.node}"

    @property
    def mode(self) -> str:
        return (self.labels.get("gpu_compute_partition_type") or "").lower()


def _field_of(name: str, prefix: str | None) -> tuple[str, str] | None:
    """(prefix, our field) of a metric name we read, else None."""
    if prefix is not None:
        return (prefix, FIELDS[name[len(prefix) :]]) if name[len(prefix) :] in FIELDS else None
    for dme, ours in FIELDS.items():
        if name.endswith(dme):
            found = name[: -len(dme)]
            if not found or PREFIX_PATTERN.match(found):
                return found, ours
    return None


def _metric_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0].strip()


def _wanted(line: str, prefix: str | None) -> bool:
    """Whether a line is a series we read. prometheus_client's parser takes ~0.4 ms per
    series with DME's 20 labels, so what is not read is not parsed: busy per XCC of a GPU that
    is not partitioned (8 lines per MI300X in SPX) neither."""
    if line.startswith("#"):
        return False
    found = _field_of(_metric_name(line), prefix)
    if found is None:
        return False
    return found[1] != "busy_inst" or any(f'_type="{m}"' in line for m in PARTITIONED_MODES)


def parse_scrape(
    text: str,
    *,
    cluster: str,
    default_node: str,
    time: datetime,
    interval_s: float | None,
    prefix: str | None = None,
) -> list[NodeSample]:
    """One node sample per node in the scrape (normally one). ``prefix``: the exporter's
    MetricsFieldPrefix ("" for none); None: found in the scrape. Raises ScrapeError."""
    check_complete(text)
    series = scrape_series(text, lambda line: _wanted(line, prefix))
    if not any("gpu_id" in labels for _, labels, _ in series):
        # none of our metrics (turned off in the exporter's Fields, or not DME at all): the
        # other per-GPU series still say which devices are there, or why they cannot be named
        everything = scrape_series(text)
        if prefix is not None:
            other = {_field_of(name, None) for name, _, _ in everything}
            if other - {None}:
                carried = sorted(repr(f[0]) for f in other if f is not None)
                raise ScrapeError(
                    DeadLetterKind.SCHEMA,
                    f"GPUGAP_AMD_EXPORTER_PREFIX is {prefix!r} but the scrape's metric names "
                    f"carry {', '.join(carried)}: set it to the exporter's MetricsFieldPrefix, "
                    "or unset it",
                )
        return _node_samples(
            [s for s in everything if "gpu_id" in s[1]],
            {},
            everything,
            cluster=cluster,
            default_node=default_node,
            time=time,
            interval_s=interval_s,
        )
    fields: dict[str, str] = {}
    prefixes: set[str] = set()
    for name, _, _ in series:
        mapped = _field_of(name, prefix)
        assert mapped is not None  # kept by the filter above
        prefixes.add(mapped[0])
        fields[name] = mapped[1]
    if len(prefixes) > 1:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"metric names carry several prefixes ({', '.join(map(repr, sorted(prefixes)))}): "
            "set GPUGAP_AMD_EXPORTER_PREFIX to the exporter's MetricsFieldPrefix",
        )
    return _node_samples(
        series,
        fields,
        series,
        cluster=cluster,
        default_node=default_node,
        time=time,
        interval_s=interval_s,
    )


def _node_samples(
    series: Sequence[Series],
    fields: Mapping[str, str],
    everything: Sequence[Series],
    *,
    cluster: str,
    default_node: str,
    time: datetime,
    interval_s: float | None,
) -> list[NodeSample]:
    if not series:
        total = [v for name, _, v in everything if name.endswith("gpu_nodes_total")]
        said = f" (gpu_nodes_total says {total[0]:g})" if total else ""
        raise ScrapeError(
            DeadLetterKind.REJECTED,
            f"no per-GPU series (gpu_id label) in the scrape{said}: is it AMD's "
            "device-metrics-exporter, 1.0 or later?",
        )
    devices = _devices(series, fields, default_node)
    _require_uuids(devices)
    samples: dict[str, list[GpuSample]] = {}
    what = "the scrape"
    try:
        parents = _partition_parents(devices)
        for d in devices:
            what = d.what
            samples.setdefault(d.node, []).append(_sample(d, parents))
        what = "the node sample"
        return [
            NodeSample(
                cluster=cluster,
                node=node,
                time=time,
                source=SampleSource.AMD_EXPORTER,
                interval_s=interval_s,
                gpus=tuple(sorted(gpus, key=lambda g: (g.index, g.uuid))),
            )
            for node, gpus in samples.items()
        ]
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors(include_url=False)[:5])
        raise ScrapeError(DeadLetterKind.SCHEMA, f"{what}: {problems}") from None


def _devices(
    series: Sequence[Series], fields: Mapping[str, str], default_node: str
) -> list[_Device]:
    devices: dict[tuple[str, str], _Device] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for name, labels, value in series:
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise ScrapeError(DeadLetterKind.MALFORMED, f"duplicated series {name}{dict(key[1])}")
        seen.add(key)
        node = labels.get("hostname") or default_node
        gpu_id = labels.get("gpu_id", "")
        d = devices.get((node, gpu_id))
        if d is None:
            try:
                index = int(gpu_id)
            except ValueError:
                raise ScrapeError(
                    DeadLetterKind.SCHEMA, f"{name}: gpu_id {gpu_id!r} is not a number"
                ) from None
            d = devices[(node, gpu_id)] = _Device(node, index, labels)
        ours = fields.get(name)
        if ours is None:
            continue  # another metric: it only says the device is there
        if math.isnan(value):
            raise ScrapeError(DeadLetterKind.SCHEMA, f"{name} of {d.what} is NaN")
        if ours in PERCENT_FIELDS and not 0 <= value <= 100:
            raise ScrapeError(
                DeadLetterKind.SCHEMA, f"{name} of {d.what} is {value:g}: not a percent (0-100)"
            )
        if ours == "busy_inst":
            d.busy.setdefault(labels.get("xcc_index", ""), value)
        else:
            d.values.setdefault(ours, value)  # one series per pod holding it: the first
        if labels.get("pod"):
            d.pods.add((labels.get("namespace", ""), labels["pod"], labels.get("container", "")))
    return list(devices.values())


def _require_uuids(devices: Sequence[_Device]) -> None:
    """One error for the scrape: every device needs its UUID to be named."""
    missing = [d for d in devices if not d.labels.get("gpu_uuid")]
    zeros = [d for d in devices if d.labels.get("gpu_uuid") == ZERO_UUID]
    if missing:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"no gpu_uuid label on {len(missing)} of {len(devices)} GPUs (first: "
            f"{missing[0].what}): GPUs cannot be named without it: {LABELS_FIX}",
        )
    if zeros:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"gpu_uuid is all zeros on {len(zeros)} of {len(devices)} GPUs (first: "
            f"{zeros[0].what}): an SR-IOV VF has no UUID, so they cannot be named; scrape "
            "the exporter on the host (the PF) instead",
        )


def _partition_parents(devices: Sequence[_Device]) -> dict[tuple[str, str], str]:
    """(node, serial_number) -> the UUID of that GPU's partition 0, for partitioned GPUs."""
    parents: dict[tuple[str, str], str] = {}
    wanted: list[_Device] = []
    for d in devices:
        if d.mode not in PARTITIONED_MODES:
            continue
        serial = d.labels.get("serial_number") or ""
        if not serial:
            raise ScrapeError(
                DeadLetterKind.SCHEMA,
                f"{d.what} is a {d.mode} partition without serial_number: which GPU it is part "
                "of cannot be told (turn SERIAL_NUMBER on in the exporter's Labels)",
            )
        if _partition_id(d) == 0:
            parents[(d.node, serial)] = d.labels["gpu_uuid"]
        wanted.append(d)
    for d in wanted:
        if (d.node, d.labels["serial_number"]) not in parents:
            raise ScrapeError(
                DeadLetterKind.SCHEMA,
                f"{d.what} is partition {_partition_id(d)} of GPU serial "
                f"{d.labels['serial_number']}, whose partition 0 (the GPU's name) is not in "
                "the scrape",
            )
    return parents


def _partition_id(d: _Device) -> int:
    text = d.labels.get("gpu_partition_id", "")
    try:
        return int(text)
    except ValueError:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"{d.what} is a {d.mode} partition with gpu_partition_id {text!r}",
        ) from None


def _sample(d: _Device, parents: Mapping[tuple[str, str], str]) -> GpuSample:
    v, labels = d.values, d.labels
    model = labels.get("card_series") or labels.get("card_model") or None
    out: dict[str, Any] = {}
    partition = None
    uuid = f"AMD-{labels['gpu_uuid']}"
    if d.mode in PARTITIONED_MODES:
        pid = _partition_id(d)
        parent = f"AMD-{parents[(d.node, labels['serial_number'])]}"
        card_model = labels.get("card_model")
        count = amd_partition_count(d.mode, model) or amd_partition_count(
            d.mode, PART_NUMBERS.get(card_model or "")
        )
        if count is None:
            raise ScrapeError(
                DeadLetterKind.SCHEMA,
                f"{d.what}: how many {d.mode} partitions a {model or 'GPU of no model'} has "
                "is not known: turn CARD_SERIES on in the exporter's Labels (the market name)",
            )
        partition = DevicePartition(
            parent_uuid=parent,
            partition_id=pid,
            kind=PartitionKind.AMD_COMPUTE,
            count=count,
            mode=d.mode.upper(),
        )
        uuid = f"{parent}/{pid}"
        if d.busy:  # never gfx_activity: partition 0's is the whole device's
            busy = sum(d.busy.values()) / len(d.busy) / 100
            out.update(activity=busy, activity_metric=ActivityMetric.GFX_BUSY_INST)
    elif "gfx_activity" in v:
        out.update(activity=v["gfx_activity"] / 100, activity_metric=ActivityMetric.GFX_ACTIVITY)
    if "vram_used" in v:
        out["memory_used_mib"] = float(v["vram_used"])  # DME's MB are MiB
    if "vram_total" in v:
        out["memory_total_mib"] = float(v["vram_total"])
    power = next(
        (v[k] for k in ("power", "package_power", "average_package_power") if k in v), None
    )
    secondary = partition is not None and partition.partition_id != 0
    if power is not None and not (secondary and power == 0):  # secondary's 0: not measured
        out["power_w"] = float(power)
    if "energy" in v:
        out["energy_mj"] = round(v["energy"] / 1000)
    job = labels.get("job_id") or None
    return GpuSample(
        uuid=uuid,
        index=d.index,
        model=model,
        vendor=Vendor.AMD,
        partition=partition,
        unsupported=tuple(f for f in SAMPLE_FIELDS if f not in out),
        attribution=pods_attribution(d.pods, job) if d.pods or job else None,
        **out,
    )


def _problem(e: Any) -> str:
    return f"{'.'.join(map(str, e['loc'])) or '(record)'}: {e['msg']} (got {e.get('input')!r})"
