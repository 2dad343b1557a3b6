"""One NVML sampling tick: the GPUs and MIG instances of this node, read through nvidia-ml-py.

Every call goes through the ``pynvml`` module at call time (``pynvml.nvmlDeviceGet...``), never
through names bound at import, so a test can substitute the module's functions with a fake
that raises pynvml's own exception classes, exactly as the real library does without a GPU.

What a device cannot report is data, not a failure: ``NotSupported`` is remembered per device
and field (the driver will not change its mind, and a failing call costs a round trip), any
other error is flagged for that tick only, and both are listed in the sample's
``unsupported``. A GPU that is lost (fallen off the bus, Xid 79) keeps being reported with no
values until it returns or the driver stops counting it; the inventory is rebuilt then and
every ``rediscover_s`` seconds, so GPUs that appear or disappear are noticed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpugap.producers.nvml.processes import NotMeasured, ProcessUse
from gpugap.schemas import GpuSample, MeasuredUse, MigInstance
from gpugap.schemas.types import ActivityMetric

log = logging.getLogger(__name__)

#: Sampled fields as GpuSample names; one NVML call fills each group.
UTIL = ("activity", "utilization")
MEMORY = ("memory_used_mib", "memory_total_mib")
POWER = ("power_w",)
ENERGY = ("energy_mj",)
CLOCK = ("sm_clock_mhz",)
ALL_FIELDS = (*UTIL, *MEMORY, *POWER, *ENERGY, *CLOCK)
MIB = 1 << 20


class NoDriver(Exception):
    """NVML cannot start on this machine: no library, or the kernel driver is not loaded."""


@dataclass
class Device:
    """One sampled unit: a whole GPU, or one MIG instance (``mig`` set)."""

    handle: Any
    uuid: str
    index: int
    model: str | None
    mig: MigInstance | None = None
    not_supported: set[str] = field(default_factory=set)
    lost: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.uuid, self.index


def _text(value: str | bytes) -> str:
    # nvidia-ml-py before 11.515 returned bytes from the string getters
    return value.decode() if isinstance(value, bytes) else value


def _mig_profile(name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3 MIG 1g.10gb' -> '1g.10gb' (NVML names MIG devices this way)."""
    head, sep, profile = name.rpartition(" MIG ")
    return profile.strip() or None if sep and head else None


def _is(exc: pynvml.NVMLError, code: int) -> bool:
    return bool(exc.value == code)


class NvmlSampler:
    def __init__(
        self,
        rediscover_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        processes: ProcessUse | None = None,
    ) -> None:
        self.rediscover_s = rediscover_s
        #: per-process use of whole GPUs (None: not read, GPUGAP_NVML_PROCESS_USE=false)
        self.processes = processes
        self.clock = clock
        self.devices: list[Device] = []
        self.started = False
        self._discovered_at = float("-inf")
        self._rediscover = False

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """nvmlInit and the first inventory; NoDriver when this machine has no NVIDIA driver."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if _is(exc, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND):
                raise NoDriver("libnvidia-ml.so.1 not found (no NVIDIA driver installed)") from None
            if _is(exc, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
                raise NoDriver("the NVIDIA kernel driver is not loaded") from None
            if _is(exc, pynvml.NVML_ERROR_NO_PERMISSION):
                raise NoDriver("no permission to open the NVIDIA devices") from None
            raise NoDriver(f"nvmlInit failed: {exc}") from None
        self.started = True
        self.discover()

    def stop(self) -> None:
        if self.started:
            self.started = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:  # nothing left to release
                log.debug("nvmlShutdown: %s", exc)

    # --- inventory -----------------------------------------------------------------------

    def discover(self) -> None:
        """Rebuild the inventory; a GPU that cannot be opened any more is kept as lost."""
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:  # keep what we had; try again next tick
            log.warning("NVML: cannot count GPUs (%s); keeping the previous inventory", exc)
            self._rediscover = True
            return
        before = {d.uuid: d for d in self.devices}
        found: list[Device] = []
        for index in range(count):
            try:
                found += self._open(index)
            except pynvml.NVMLError as exc:
                known = [d for d in self.devices if d.index == index]
                if not known:
                    log.warning("NVML: GPU index %d cannot be opened (%s); skipped", index, exc)
                for d in known:
                    d.lost = True
                found += known
        for d in found:  # remember what each device told us it cannot do
            old = before.get(d.uuid)
            if old is not None and not old.lost:
                d.not_supported |= old.not_supported
        gone = set(before) - {d.uuid for d in found}
        for uuid in sorted(gone):
            log.warning("NVML: %s (index %d) is gone", uuid, before[uuid].index)
        new = [d.uuid for d in found if d.uuid not in before]
        if before and new:
            log.warning("NVML: new devices %s", ", ".join(new))
        self.devices = found
        self._discovered_at = self.clock()
        self._rediscover = any(d.lost for d in found)

    def _open(self, index: int) -> list[Device]:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        model = _text(pynvml.nvmlDeviceGetName(handle))
        gpu = Device(handle, uuid, index, model)
        try:
            mig_on = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:  # NotSupported: a GPU without MIG
            mig_on = False
        if not mig_on:
            return [gpu]
        slices = []
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except pynvml.NVMLError_NotFound:  # an empty slot: not every index holds one
                continue
            gi = pynvml.nvmlDeviceGetGpuInstanceId(mh)
            ci = pynvml.nvmlDeviceGetComputeInstanceId(mh)
            mig = MigInstance(
                parent_uuid=uuid,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                profile=_mig_profile(_text(pynvml.nvmlDeviceGetName(mh))),
            )
            slices.append(Device(mh, _text(pynvml.nvmlDeviceGetUUID(mh)), index, model, mig))
        # MIG on and no instance created: the GPU is still there, sample it whole
        return slices or [gpu]

    # --- sampling ------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One reading of every device; rediscovers first when due."""
        if self._rediscover or self.clock() - self._discovered_at >= self.rediscover_s:
            self.discover()
            if self.processes is not None:
                self.processes.forget({d.uuid for d in self.devices})
        return [self._read(d) for d in self.devices]

    def _read(self, d: Device) -> GpuSample:
        values: dict[str, Any] = {}
        failed: set[str] = set()
        if d.lost:
            failed.update(ALL_FIELDS)
        else:
            for fields, fn, args, convert in _READS:
                self._call(
                    d, fields=fields, failed=failed, values=values, fn=fn, args=args,
                    convert=convert,
                )  # fmt: skip
            if not d.lost:
                values["measured_use"] = self._process_use(d)
            if d.lost:  # lost while reading its processes
                failed.update(ALL_FIELDS)
                values.clear()
        unsupported = tuple(f for f in ALL_FIELDS if f in failed or f in d.not_supported)
        return GpuSample(
            uuid=d.uuid,
            index=d.index,
            model=d.model,
            mig=d.mig,
            unsupported=unsupported,
            **values,
        )

    def _process_use(self, d: Device) -> tuple[MeasuredUse, ...] | None:
        """Use per pod of a whole GPU; None: not measured (MIG, unsupported, an error)."""
        if self.processes is None or d.mig is not None or "measured_use" in d.not_supported:
            return None  # MIG: NVML attributes no SM time to processes there
        try:
            return self.processes.read(d.uuid, d.handle)
        except NotMeasured as exc:
            if exc.not_supported:
                d.not_supported.add("measured_use")
            return None
        except pynvml.NVMLError as exc:
            if _is(exc, pynvml.NVML_ERROR_GPU_IS_LOST):
                log.error("NVML: %s (index %d) is lost; no values until it returns", *d.key)
                d.lost = True
                self._rediscover = True
            else:
                log.warning("NVML: %s process use: %s", d.uuid, exc)
            return None

    def _call(
        self,
        d: Device,
        *,
        fields: tuple[str, ...],
        failed: set[str],
        values: dict[str, Any],
        fn: str,
        args: tuple[Any, ...],
        convert: Callable[[Any], dict[str, Any]],
    ) -> None:
        if d.lost or fields[0] in d.not_supported:
            return
        try:
            values.update(convert(getattr(pynvml, fn)(d.handle, *args)))
        except pynvml.NVMLError as exc:
            if _is(exc, pynvml.NVML_ERROR_NOT_SUPPORTED):
                d.not_supported.update(fields)
            elif _is(exc, pynvml.NVML_ERROR_GPU_IS_LOST):
                log.error("NVML: %s (index %d) is lost; no values until it returns", *d.key)
                d.lost = True
                self._rediscover = True
                failed.update(ALL_FIELDS)
                values.clear()
            else:  # Unknown, Timeout, ResetRequired, NoPermission...: this tick only
                log.warning("NVML: %s %s: %s", d.uuid, "/".join(fields), exc)
                failed.update(fields)


def _util(u: Any) -> dict[str, Any]:
    ratio = min(1.0, u.gpu / 100)
    return {"activity": ratio, "activity_metric": ActivityMetric.UTILIZATION, "utilization": ratio}


def _memory(m: Any) -> dict[str, Any]:
    return {"memory_used_mib": m.used / MIB, "memory_total_mib": m.total / MIB}


#: (fields, pynvml function, extra arguments, convert) per NVML call. Functions are looked up
#: by name on every call, so whatever stands in ``pynvml`` at that moment is what runs.
_READS: tuple[
    tuple[tuple[str, ...], str, tuple[Any, ...], Callable[[Any], dict[str, Any]]], ...
] = (
    (UTIL, "nvmlDeviceGetUtilizationRates", (), _util),
    (MEMORY, "nvmlDeviceGetMemoryInfo", (), _memory),
    (POWER, "nvmlDeviceGetPowerUsage", (), lambda mw: {"power_w": mw / 1000}),
    (ENERGY, "nvmlDeviceGetTotalEnergyConsumption", (), lambda mj: {"energy_mj": int(mj)}),
    (CLOCK, "nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,), lambda c: {"sm_clock_mhz": int(c)}),
)
