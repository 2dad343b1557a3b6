"""XPU Manager cards -> device samples (pure): a card, or with ``tiles_as_devices`` each of
its tiles, with activity, memory, power and energy as producers/xpum/parse.py explains."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from pydantic import ValidationError

from gpugap.producers.prometheus.text import ScrapeError
from gpugap.schemas import Attribution, DevicePartition, GpuSample
from gpugap.schemas.types import (
    GPU_UUID_PATTERN,
    ActivityMetric,
    DeadLetterKind,
    PartitionKind,
    Vendor,
)

#: a power reading above this is not a real one (issue #130: 3.69e12 W for one scrape after
#: D3->D0, a stale energy timestamp); the largest Intel card draws about 600 W
MAX_POWER_W = 5000.0
_MIB = float(1 << 20)
SAMPLE_FIELDS = (
    "activity",
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "energy_mj",
)
#: power and energy domains, most to least whole-device (2.x hw_sensor_location, lower-cased
#: Level Zero power domain names; 1.x has none)
_DOMAINS = ("card", "package", "gpu", "stack", "")


@dataclass
class Card:
    node: str
    uuid: str
    bdf: str
    model: str | None = None
    subdevices: int | None = None
    pod: tuple[str, str, str] | None = None
    job: str | None = None
    #: (field, tile or None, series labels) -> value; a repeated series overwrites
    values: dict[tuple[str, int | None, tuple[tuple[str, str], ...]], float] = field(
        default_factory=dict
    )
    power_bad: bool = False

    def rows(self, name: str, tile: int | None) -> list[tuple[Mapping[str, str], float]]:
        return [(dict(k), v) for (f, t, k), v in self.values.items() if f == name and t == tile]

    def tiles(self) -> list[int]:
        return sorted({t for (_, t, _) in self.values if t is not None})


def _ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def devices(cards: list[Card], tiles_as_devices: bool) -> list[GpuSample]:
    """One node's devices: cards in PCI address order, or their tiles."""
    gpus: list[GpuSample] = []
    first = 0  # the index of this card's first tile, for tiles as devices
    for index, card in enumerate(sorted(cards, key=lambda c: (c.bdf, c.uuid))):
        tiles = card.tiles()
        count = max(card.subdevices or 0, (tiles[-1] + 1) if tiles else 0)
        try:
            if tiles_as_devices and count > 1:
                gpus.extend(_tile(card, t, count, first + t) for t in range(count))
            else:  # a one-tile card is a device as it is, tiles or not
                gpus.append(_card(card, first if tiles_as_devices else index))
        except ValidationError as exc:
            raise schema_error(f"device {index} (XPU-{card.uuid}, {card.bdf})", exc) from None
        first += max(count, 1)
    return gpus


def schema_error(what: str, exc: ValidationError) -> ScrapeError:
    problems = "; ".join(_problem(e) for e in exc.errors(include_url=False)[:5])
    return ScrapeError(DeadLetterKind.SCHEMA, f"{what}: {problems}")


def _problem(e: Any) -> str:
    msg = e["msg"]
    if e["type"] == "string_pattern_mismatch" and e.get("ctx", {}).get("pattern") == (
        GPU_UUID_PATTERN
    ):
        msg = "should be a device UUID ('XPU-<uuid>')"
    return f"{'.'.join(map(str, e['loc'])) or '(record)'}: {msg} (got {e.get('input')!r})"


def _mean(card: Card, name: str, tile: int | None) -> float | None:
    values = [v for _, v in card.rows(name, tile)]
    return _ratio(fmean(values)) if values else None


def _total(card: Card, name: str, tile: int | None) -> float | None:
    values = [v for _, v in card.rows(name, tile)]
    return sum(values) if values else None


def _domain(card: Card, name: str, tile: int | None) -> float | None:
    """Power or energy of one place: the most whole-device domain's row(s)."""
    rows = card.rows(name, tile)
    for domain in _DOMAINS:
        picked = [v for labels, v in rows if domain in labels.get("hw_sensor_location", "")]
        if picked:
            return sum(picked)
    return None


def _activity(card: Card, tiles: list[int | None]) -> dict[str, Any]:
    """Activity and utilization over some tiles (None: the device's own rows), each tile's
    own first. Compute engine group first, all engines as the fallback."""
    out: dict[str, Any] = {}
    for name, metric in (
        ("compute", ActivityMetric.COMPUTE_ENGINE_GROUP),
        ("all", ActivityMetric.ALL_ENGINES),
    ):
        per_tile = [m for t in tiles if (m := _mean(card, name, t)) is not None]
        if name == "all" and per_tile:
            out["utilization"] = fmean(per_tile)
        if per_tile and "activity" not in out:
            out.update(activity=fmean(per_tile), activity_metric=metric)
    return out


def _attribution(card: Card) -> Attribution | None:
    if card.pod is None and card.job is None:
        return None
    ns, pod, container = card.pod or ("", "", "")
    return Attribution(
        pod=pod or None, namespace=ns or None, container=container or None, slurm_job_id=card.job
    )


def _finish(card: Card, uuid: str, index: int, values: dict[str, Any], **extra: Any) -> GpuSample:
    if card.power_bad:  # part of this card's power was impossible: report none this time
        values.pop("power_w", None)
    values = {k: v for k, v in values.items() if v is not None}
    return GpuSample(
        uuid=uuid,
        index=index,
        model=card.model,
        vendor=Vendor.INTEL,
        unsupported=tuple(f for f in SAMPLE_FIELDS if f not in values),
        attribution=_attribution(card),
        **values,
        **extra,
    )


def _sum_tiles(card: Card, pick: Any, name: str) -> float | None:
    parts = [pick(card, name, t) for t in card.tiles()]
    found = [p for p in parts if p is not None]
    return sum(found) if found else None


def _card(card: Card, index: int) -> GpuSample:
    tiles: list[int | None] = list(card.tiles())
    activity = _activity(card, tiles) if tiles else {}
    if "activity" not in activity:
        activity = _activity(card, [None]) or activity
    power = _domain(card, "power", None)
    energy = _domain(card, "energy", None)
    memory = _sum_tiles(card, _total, "memory")
    total = _sum_tiles(card, _total, "memory_total")
    values = {
        **activity,
        "memory_used_mib": (memory if memory is not None else _total(card, "memory", None)),
        "memory_total_mib": (total if total is not None else _total(card, "memory_total", None)),
        "power_w": power if power is not None else _sum_tiles(card, _domain, "power"),
        "energy_j": energy if energy is not None else _sum_tiles(card, _domain, "energy"),
    }
    return _finish(card, f"XPU-{card.uuid}", index, _units(values))


def _tile(card: Card, tile: int, count: int, index: int) -> GpuSample:
    values = {
        **_activity(card, [tile]),
        "memory_used_mib": _total(card, "memory", tile),
        "memory_total_mib": _total(card, "memory_total", tile),
        "power_w": _domain(card, "power", tile),
        "energy_j": _domain(card, "energy", tile),  # 1.x: per device only
    }
    parent = f"XPU-{card.uuid}"
    partition = DevicePartition(
        parent_uuid=parent, partition_id=tile, kind=PartitionKind.INTEL_TILE, count=count
    )
    return _finish(card, f"{parent}/{tile}", index, _units(values), partition=partition)


def _units(values: dict[str, Any]) -> dict[str, Any]:
    """Bytes -> MiB, joules -> millijoules."""
    out = dict(values)
    for name in ("memory_used_mib", "memory_total_mib"):
        if out.get(name) is not None:
            out[name] = out[name] / _MIB
    energy = out.pop("energy_j", None)
    if energy is not None:
        out["energy_mj"] = round(energy * 1000)
    return out
