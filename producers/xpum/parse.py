"""Intel XPU Manager exporter text -> node samples (pure: no I/O).

Two exporters, told apart by their metric names (tests/fixtures/intel/NOTES.md §1-3):

- 1.x (``xpum_*``, the Python exporter beside ``xpumd``): a device per ``uuid``, its tiles by
  ``sub_dev``; ``src`` is ``direct`` or the exporter's own tile -> device aggregate (``avg``,
  ``sum``), which is skipped: gpugap aggregates the tiles itself. Rows without ``uuid`` (the
  ``card=``/``src="sum"`` board rows) cannot be given to a device (a Flex 140 board holds two
  devices) and are skipped.
- 2.x (``hw_*``, ``xpumd`` in Go, OpenTelemetry): a device per ``hw_id``, which xpumd fills
  with the device's Level Zero UUID (xpumanager@v2.x ``xpumd/receiver/intelxpu/sysman/
  device.go``: ``HwID: props.Core.Uuid.Id.String()``; every engine, memory and power series
  of the device carries it), its tiles by ``com_intel_subdevice_id`` (empty: not on a tile),
  the model from ``hw_gpu_info``.

Activity is the compute engine group per tile (1.x ``xpum_engine_group_ratio{type="compute"}``,
2.x ``hw_gpu_utilization_ratio{hw_gpu_task="compute-all"}``, the mean of a tile's series if
several), else all engines (``xpum_engine_ratio`` / ``hw_gpu_task="all"``); a card's is the
mean of its tiles' (the exporter's own ``src="avg"`` rule). gpugap uses the compute engine
group: not the busiest engine (what ``xpu-smi stats`` reports since xpu-smi 2.2.0) and never
the mean across engine groups or engines, which understates a compute-only workload (one
busy group of five reads 20 %). A ratio above 1 is an exporter reporting percent: the scrape
is refused (SCHEMA), never rescaled by guess.

A card is one device: memory and energy are the sum of its tiles', power the device row (the
sum of its tiles' where there is none). With ``tiles_as_devices`` (FLAT hierarchy: each tile
is a GPU to Slurm and Level Zero) each tile is a device ``XPU-<uuid>/<tile>`` carrying a
DevicePartition; its index is its card's index times the tiles per card plus the tile.
Indexes: no label carries xpu-smi's device id, so the cards of a node are numbered in PCI
address order, the order Level Zero enumerates them with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from gpugap.producers.prometheus.text import ScrapeError, Series, check_complete, scrape_series
from gpugap.producers.xpum.devices import MAX_POWER_W, Card, devices, schema_error
from gpugap.schemas import NodeSample
from gpugap.schemas.types import (
    DeadLetterKind,
    SampleSource,
)

__all__ = ["MAX_POWER_W", "ScrapeError", "XpumScrape", "parse_scrape"]

#: (metric name) -> our field; 2.x engine groups by hw_gpu_task below
_V1 = {
    "xpum_engine_group_ratio": "compute",  # only type="compute"
    "xpum_engine_ratio": "all",
    "xpum_memory_used_bytes": "memory",
    "xpum_power_watts": "power",
    "xpum_energy_joules_total": "energy",
}
_V2 = {
    "hw_gpu_utilization_ratio": "engine",
    "hw_memory_usage_bytes": "memory",
    "hw_memory_size_bytes": "memory_total",
    "hw_power_watts": "power",
    "hw_energy_joules_total": "energy",
    "hw_gpu_info": "info",
    "hw_gpu_info_ratio": "info",
}
#: ratio rounding slack, as dcgm's
_SLACK = 1e-3
_V2_TASKS = {"compute-all": "compute", "all": "all"}
_WANTED = tuple(_V1) + tuple(_V2)
_RATIOS = ("compute", "all")
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


@dataclass
class XpumScrape:
    """What one scrape gave: its node samples and what was noticed on the way."""

    samples: list[NodeSample]
    #: "1.x" (xpum_*) or "2.x" (hw_*)
    family: str
    #: series the exporter printed more than once (the last value was kept; issue #112)
    duplicates: int = 0
    #: impossible power readings dropped (issue #130), one line each for the log
    discarded_power: list[str] = field(default_factory=list)


def _ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def _uuid(raw: str, what: str) -> str:
    text = raw.strip().lower()
    if _HEX32.match(text):
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    if not _UUID.match(text):
        raise ScrapeError(DeadLetterKind.SCHEMA, f"{what}: {raw!r} is not a device UUID")
    if set(text) <= {"0", "-"}:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"{what}: the UUID is all zeros (an SR-IOV VF or a device XPU Manager cannot read): "
            "gpugap names an Intel device by its UUID and does not invent one",
        )
    return text


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_scrape(
    text: str,
    *,
    cluster: str,
    default_node: str,
    time: datetime,
    interval_s: float | None,
    tiles_as_devices: bool = False,
) -> XpumScrape:
    """The node samples in one XPU Manager scrape (1.x or 2.x). Raises ScrapeError."""
    check_complete(text)
    series = scrape_series(text, lambda line: line.startswith(_WANTED))
    if not series:  # nothing of ours: is the rest the text format at all? (rare: parse it all)
        scrape_series(text)
    out = XpumScrape(samples=[], family="")
    cards = _collect(series, default_node, out)
    by_node: dict[str, list[Card]] = {}
    for card in cards:
        by_node.setdefault(card.node, []).append(card)
    for node, node_cards in by_node.items():
        gpus = devices(node_cards, tiles_as_devices)
        try:
            out.samples.append(
                NodeSample(
                    cluster=cluster,
                    node=node,
                    time=time,
                    source=SampleSource.XPUM,
                    interval_s=interval_s,
                    gpus=tuple(gpus),
                )
            )
        except ValidationError as exc:
            raise schema_error(f"the node sample of {node}", exc) from None
    return out


def _field(name: str, labels: Mapping[str, str]) -> str | None:
    """Which of our fields a series is (None: not one gpugap reads)."""
    if name in _V2:
        ours = _V2[name]
        if ours == "engine":  # media, copy, render, single engines: not the busy figure
            return _V2_TASKS.get(labels.get("hw_gpu_task", ""))
        if ours.startswith("memory") and "system" in labels.get("hw_memory_location", ""):
            return None  # host memory, not the device's
        return ours
    v1 = _V1.get(name)
    if v1 == "compute" and labels.get("type") != "compute":
        return None
    if labels.get("src", "direct") != "direct":
        return None  # the exporter's own tile -> device aggregate
    return v1


def _collect(series: Iterable[Series], default_node: str, out: XpumScrape) -> list[Card]:
    cards: dict[tuple[str, str], Card] = {}
    families = set()
    for name, labels, value in series:
        ours = _field(name, labels)
        if ours is None or math.isnan(value):
            continue
        v2 = name in _V2
        raw_id = labels.get("hw_id" if v2 else "uuid", "")
        bdf = labels.get("pci_bdf", "")
        if not raw_id:
            if labels.get("card") or not bdf:
                continue  # a board row (1.x card=): no device of its own
            raise ScrapeError(
                DeadLetterKind.SCHEMA,
                f"{_series_text(name, labels)}: the device at {bdf} has no "
                f"{'hw_id' if v2 else 'uuid'} label, and gpugap names an Intel device by its "
                "UUID (upgrade XPU Manager)",
            )
        families.add("2.x" if v2 else "1.x")
        uuid = _uuid(raw_id, f"device at {bdf or '?'}")
        node = labels.get("node") or default_node
        card = cards.get((node, uuid))
        if card is None:
            card = cards[(node, uuid)] = Card(node=node, uuid=uuid, bdf=bdf)
        _add(card, ours, (name, labels, value), out)
    if not cards:
        raise ScrapeError(
            DeadLetterKind.REJECTED,
            "no XPU Manager device series in the scrape (xpum_engine_ratio, "
            "hw_gpu_utilization_ratio...): is it XPU Manager's exporter?",
        )
    out.family = "+".join(sorted(families))
    return list(cards.values())


def _add(card: Card, ours: str, series: Series, out: XpumScrape) -> None:
    """One series' value into its card (or its card's description)."""
    name, labels, value = series
    if ours == "info":
        card.model = labels.get("hw_model") or card.model
        count = labels.get("com_intel_subdevice_count", "")
        card.subdevices = int(count) if count.isdigit() else card.subdevices
        return
    card.model = labels.get("dev_name") or card.model
    pod = labels.get("kube_pod") or labels.get("pod")
    if pod and card.pod is None:
        ns = labels.get("kube_namespace") or labels.get("namespace") or ""
        card.pod = (ns, pod, labels.get("kube_container") or labels.get("container") or "")
    card.job = card.job or labels.get("job_id") or None
    if ours in _RATIOS and not -_SLACK <= value <= 1 + _SLACK:
        raise ScrapeError(
            DeadLetterKind.SCHEMA,
            f"{_series_text(name, labels)} = {value}: not a ratio 0..1 (an exporter that "
            "reports percent, e.g. an old XPU Manager); gpugap does not guess the scale",
        )
    if ours == "power" and not 0 <= value <= MAX_POWER_W:
        card.power_bad = True
        out.discarded_power.append(f"{_series_text(name, labels)} = {value} W")
        return
    tile_text = labels.get("com_intel_subdevice_id" if name in _V2 else "sub_dev", "")
    if tile_text and not tile_text.isdigit():
        raise ScrapeError(
            DeadLetterKind.SCHEMA, f"{_series_text(name, labels)}: the tile is not a number"
        )
    key = (ours, int(tile_text) if tile_text else None, tuple(sorted(labels.items())))
    out.duplicates += key in card.values
    card.values[key] = value  # a repeated series (issue #112): the last value
