"""One amdsmi sampling tick: the GPUs and compute partitions of this node.

Every call goes through the ``amdsmi`` module given at construction, looked up by name at
call time (``getattr(amdsmi, "amdsmi_get_gpu_activity")``), so a test can hand in a fake
module (tests/harness/amdsmi_fake.py) that returns what the real package returns: dicts,
``"N/A"`` strings for what a device lacks, ``AmdSmiLibraryException`` on errors.

Devices (tests/fixtures/amd/NOTES.md): every processor handle is a device -- a whole GPU, or
in DPX/QPX/CPX one compute partition with its own handle. Partitions of one GPU are grouped
by ``asic_serial`` (or, where that is "N/A", by the PCI bus and device of their BDF) and
named ``AMD-<uuid of partition 0>/<partition id>``: ROCm 6.x gives every partition the GPU's
UUID and 7.0 on one each, so the name of partition 0 is the stable one.

What is read, per device:
- activity: a whole GPU's ``gfx_activity`` / 100; a partition's mean of its XCCs'
  ``gfx_busy_inst`` / 100 from partition 0's ``gpu_metrics`` (``xcp_stats.gfx_busy_inst``
  [partition id], one entry per XCC, "N/A" for unused slots): only partition 0 has the
  device's metrics, and its ``gfx_activity`` is the device's, never one partition's.
- memory: ``vram_used``/``vram_total``. amdsmi says MB, but the numbers are MiB (an MI300X's
  192 GiB reads 196592: tests/fixtures/amd/amdsmi_static_vram_mi300x.json), stored as is.
- power: ``current_socket_power`` (MI300+), else ``average_socket_power``; energy:
  ``energy_accumulator * counter_resolution`` µJ, in mJ. Both are the device's, reported on
  partition 0 only: other partitions list them as unsupported, so a sum over partitions
  counts the device once.
- processes: engine time and VRAM per process, for measured use per pod (usage.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from gpugap.producers.amdsmi.usage import UsageTracker, readings
from gpugap.schemas import DevicePartition, GpuSample, MeasuredUse
from gpugap.schemas.types import ActivityMetric, PartitionKind, Vendor

log = logging.getLogger(__name__)

ACTIVITY = ("activity",)
MEMORY = ("memory_used_mib", "memory_total_mib")
POWER = ("power_w",)
ENERGY = ("energy_mj",)
PROCESSES = ("measured_use",)
ALL_FIELDS = (*ACTIVITY, *MEMORY, *POWER, *ENERGY)
#: amdsmi_status_t AMDSMI_STATUS_NOT_SUPPORTED (amdsmi.h): the device will not change its mind
NOT_SUPPORTED = 2
#: partitions of one device per mode where the mode alone says (CPX: one per XCD, counted)
MODE_COUNT = {"DPX": 2, "TPX": 3, "QPX": 4}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class NoDriver(Exception):
    """amdsmi cannot start on this machine: the amdgpu driver is not loaded, no permission."""


def describe(exc: BaseException) -> str:
    """An amdsmi exception on one line (its text is "Error code:\n\t<code> | <info>")."""
    return " ".join(str(exc).split())


def na(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().upper() in ("N/A", ""))


def number(value: Any) -> float | None:
    """A numeric amdsmi value, or None for "N/A" and the like."""
    if isinstance(value, bool) or na(value):
        return None
    if isinstance(value, dict):  # some versions wrap values as {"value": N, "unit": "W"}
        return number(value.get("value"))
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Device:
    """One sampled unit: a whole GPU, or one compute partition (``partition`` set)."""

    handle: Any
    index: int
    raw_uuid: str
    model: str | None
    bdf: str
    serial: str | None
    mode: str | None
    partition_id: int | None
    kfd_node: int | None
    identity: str = ""
    partition: DevicePartition | None = None
    #: the handle whose gpu_metrics carry this device's partition stats (partition 0's)
    primary: Any = None
    not_supported: set[str] = field(default_factory=set)

    @property
    def group(self) -> str:
        if self.serial:
            return f"serial:{self.serial}"
        return "bdf:" + self.bdf.rsplit(".", 1)[0]  # domain:bus:device, any function


class AmdSmiSampler:
    def __init__(
        self,
        amdsmi: ModuleType,
        rediscover_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        proc_root: Path = Path("/proc"),
        processes: bool = True,
    ) -> None:
        self.amdsmi = amdsmi
        self.rediscover_s = rediscover_s
        self.clock = clock
        self.devices: list[Device] = []
        self.started = False
        self.processes = processes
        self.usage = UsageTracker(proc_root)
        self._discovered_at = float("-inf")
        self._unnamed: set[str] = set()

    def _call(self, fn: str, *args: Any) -> Any:
        return getattr(self.amdsmi, fn)(*args)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        try:
            flags = getattr(getattr(self.amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            self._call("amdsmi_init", *(() if flags is None else (flags,)))
        except self.amdsmi.AmdSmiException as exc:
            raise NoDriver(f"amdsmi_init failed ({describe(exc)})") from None
        self.started = True
        self.discover()

    def stop(self) -> None:
        if self.started:
            self.started = False
            try:
                self._call("amdsmi_shut_down")
            except self.amdsmi.AmdSmiException as exc:
                log.debug("amdsmi_shut_down: %s", describe(exc))

    # --- inventory -----------------------------------------------------------------------

    def discover(self) -> None:
        try:
            handles = list(self._call("amdsmi_get_processor_handles"))
        except self.amdsmi.AmdSmiException as exc:
            log.warning(
                "amdsmi: cannot list GPUs (%s); keeping the previous inventory", describe(exc)
            )
            return
        before = {d.identity: d for d in self.devices}
        found = [d for i, h in enumerate(handles) if (d := self._open(i, h)) is not None]
        self._name(found)
        for d in found:
            old = before.get(d.identity)
            if old is not None:
                d.not_supported |= old.not_supported
        gone = sorted(set(before) - {d.identity for d in found})
        if gone:
            log.warning("amdsmi: gone: %s", ", ".join(gone))
        new = [d.identity for d in found if d.identity not in before]
        if before and new:
            log.warning("amdsmi: new devices %s", ", ".join(new))
        self.devices = found
        self.usage.forget(d.identity for d in found)
        self._discovered_at = self.clock()

    def _optional(self, fn: str, handle: Any) -> Any:
        try:
            return self._call(fn, handle)
        except (self.amdsmi.AmdSmiException, AttributeError):  # older package, no such call
            return None

    def _open(self, index: int, handle: Any) -> Device | None:
        try:
            uuid = str(self._call("amdsmi_get_gpu_device_uuid", handle)).strip().lower()
            asic = self._call("amdsmi_get_gpu_asic_info", handle)
        except self.amdsmi.AmdSmiException as exc:
            log.warning("amdsmi: GPU index %d cannot be opened (%s); skipped", index, describe(exc))
            return None
        bdf = str(self._optional("amdsmi_get_gpu_device_bdf", handle) or "").lower()
        if not _UUID.match(uuid) or not uuid.strip("0-"):
            key = f"{index}:{bdf}"
            if key not in self._unnamed:  # once per device, not every rediscovery
                log.error(
                    "amdsmi: GPU index %d (%s) has no UUID (%r; an SR-IOV VF reads zeros): it "
                    "cannot be named and is not sampled. Run the agent where amdsmi gives the "
                    "UUID (bare metal or the host), or scrape device-metrics-exporter",
                    index, bdf or "no BDF", uuid,
                )  # fmt: skip
                self._unnamed.add(key)
            return None
        mode = self._optional("amdsmi_get_gpu_compute_partition", handle)
        mode = None if na(mode) else str(mode).strip().upper()
        kfd = self._optional("amdsmi_get_gpu_kfd_info", handle) or {}
        pid = number(kfd.get("current_partition_id")) if isinstance(kfd, dict) else None
        node = number(kfd.get("node_id")) if isinstance(kfd, dict) else None
        serial = asic.get("asic_serial")
        model = asic.get("market_name")
        return Device(
            handle=handle,
            index=index,
            raw_uuid=uuid,
            model=None if na(model) else str(model)[:256],
            bdf=bdf,
            serial=None if na(serial) or not str(serial).strip("0x") else str(serial).lower(),
            mode=mode,
            partition_id=None if pid is None or mode in (None, "SPX") else int(pid),
            kfd_node=None if node is None else int(node),
        )

    def _name(self, found: list[Device]) -> None:
        """Give each device its identity; group partitions of one GPU under partition 0's UUID."""
        groups: dict[str, list[Device]] = {}
        for d in found:
            if d.partition_id is None:
                d.identity = f"AMD-{d.raw_uuid}"
            else:
                groups.setdefault(d.group, []).append(d)
        for members in groups.values():
            members.sort(key=lambda m: m.partition_id or 0)
            first = members[0]
            if first.partition_id != 0:
                log.warning(
                    "amdsmi: partition 0 of %s is not visible; its partitions are named after "
                    "partition %d's UUID", first.bdf, first.partition_id,
                )  # fmt: skip
            mode = first.mode or ""
            count = max(
                len(members), MODE_COUNT.get(mode, 0), max(m.partition_id or 0 for m in members) + 1
            )
            parent = f"AMD-{first.raw_uuid}"
            for m in members:
                m.identity = f"{parent}/{m.partition_id}"
                m.primary = first.handle
                m.partition = DevicePartition(
                    parent_uuid=parent,
                    partition_id=m.partition_id or 0,
                    kind=PartitionKind.AMD_COMPUTE,
                    count=count,
                    mode=mode or None,
                )

    # --- sampling ------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        if self.clock() - self._discovered_at >= self.rediscover_s:
            self.discover()
        metrics: dict[int, Any] = {}  # partition 0's gpu_metrics, read once per tick
        return [self._read(d, metrics) for d in self.devices]

    def _get(self, d: Device, fields: tuple[str, ...], failed: set[str], fn: str) -> Any:
        if fields[0] in d.not_supported:
            return None
        try:
            return self._call(fn, d.handle)
        except self.amdsmi.AmdSmiException as exc:
            if getattr(exc, "err_code", None) == NOT_SUPPORTED:
                d.not_supported.update(fields)
            else:  # busy, timeout, a GPU in reset: this tick only
                log.warning("amdsmi: %s %s: %s", d.identity, fn, describe(exc))
                failed.update(fields)
            return None

    def _read(self, d: Device, metrics: dict[int, Any]) -> GpuSample:
        failed: set[str] = set()
        values: dict[str, Any] = {}
        values.update(self._activity(d, failed, metrics))
        vram = self._get(d, MEMORY, failed, "amdsmi_get_gpu_vram_usage") or {}
        used, total = number(vram.get("vram_used")), number(vram.get("vram_total"))
        if used is not None and total is not None:
            values.update(memory_used_mib=used, memory_total_mib=total)  # "MB" that are MiB
        if d.partition is None or d.partition.partition_id == 0:
            values.update(self._power(d, failed))
        measured = self._measured(d, failed, values.get("activity")) if self.processes else None
        missing = [f for f in ALL_FIELDS if f not in values]
        unsupported = tuple(missing + [f for f in PROCESSES if f in failed | d.not_supported])
        return GpuSample(
            uuid=d.identity,
            index=d.index,
            model=d.model,
            vendor=Vendor.AMD,
            partition=d.partition,
            unsupported=unsupported,
            measured_use=measured,
            **values,
        )

    def _activity(self, d: Device, failed: set[str], metrics: dict[int, Any]) -> dict[str, Any]:
        if d.partition is None:
            act = self._get(d, ACTIVITY, failed, "amdsmi_get_gpu_activity") or {}
            gfx = number(act.get("gfx_activity"))
            if gfx is None:
                return {}
            return {"activity": min(1.0, gfx / 100), "activity_metric": ActivityMetric.GFX_ACTIVITY}
        key = id(d.primary)
        if key not in metrics:
            primary = next((x for x in self.devices if x.handle is d.primary), d)
            metrics[key] = self._get(primary, ACTIVITY, set(), "amdsmi_get_gpu_metrics_info")
        busy = xcc_busy(metrics[key], d.partition.partition_id)
        if busy is None:
            return {}
        return {"activity": min(1.0, busy / 100), "activity_metric": ActivityMetric.GFX_BUSY_INST}

    def _power(self, d: Device, failed: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        power = self._get(d, POWER, failed, "amdsmi_get_power_info") or {}
        for key in ("current_socket_power", "average_socket_power"):
            watts = number(power.get(key))
            if watts is not None and watts >= 0:
                out["power_w"] = watts
                break
        energy = self._get(d, ENERGY, failed, "amdsmi_get_energy_count") or {}
        acc, res = (
            number(energy.get("energy_accumulator")),
            number(energy.get("counter_resolution")),
        )
        if acc is not None and res is not None and acc >= 0 and res > 0:
            out["energy_mj"] = int(acc * res / 1000)  # µJ -> mJ
        return out

    def _measured(
        self, d: Device, failed: set[str], busy: float | None
    ) -> tuple[MeasuredUse, ...] | None:
        procs = self._get(d, PROCESSES, failed, "amdsmi_get_gpu_process_list")
        if procs is None:
            return None
        return self.usage.measure(d.identity, self.clock(), readings(procs), busy)


def xcc_busy(metrics: Any, partition_id: int) -> float | None:
    """The mean of a partition's XCCs' gfx_busy_inst (percent), from gpu_metrics."""
    if not isinstance(metrics, dict):
        return None
    per_xcp = metrics.get("xcp_stats.gfx_busy_inst")
    if not isinstance(per_xcp, list) or partition_id >= len(per_xcp):
        return None
    xccs = per_xcp[partition_id]
    values = [v for x in xccs if (v := number(x)) is not None] if isinstance(xccs, list) else []
    return sum(values) / len(values) if values else None
