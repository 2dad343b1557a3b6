"""A fake NVML for machines without a GPU: pynvml's functions replaced at module level.

It behaves as libnvidia-ml does through nvidia-ml-py: device calls before ``nvmlInit`` raise
``NVMLError_Uninitialized``; errors are pynvml's own classes, built the way the library builds
them (``pynvml.NVMLError(code)`` returns the subclass); results are pynvml's own ctypes
structures (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``) or plain ints and strs, as the real
wrappers return them; empty MIG slots raise ``NotFound``; a lost GPU raises ``GpuIsLost`` from
every call, opening it by index included, while ``nvmlDeviceGetCount`` still counts it.

Per-process calls replay a GPU's ``process_samples`` (the driver's sample buffer: pid,
timeStamp, smUtil, memUtil) and ``compute_processes`` (pid, usedGpuMemory in bytes, None: not
available), built from recorded ``nvidia-smi pmon`` / ``--query-compute-apps`` outputs or from
DeviceState by tests/harness/nvml_processes.py.

Values come from fixture files (tests/fixtures/nvml/*.json). A value given as a string names
the NVML error that the call raises instead (``"NOT_SUPPORTED"`` -> NVML_ERROR_NOT_SUPPORTED).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"

#: every pynvml function the fake replaces
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetComputeRunningProcesses",
)


def error(name: str) -> pynvml.NVMLError:
    """pynvml's exception for ``NVML_ERROR_<name>``, as the library raises it."""
    return pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{name}"))


@dataclass(frozen=True)
class Handle:
    """Stands for a c_nvmlDevice_t: a whole GPU (slot None) or one MIG device."""

    gpu: int
    slot: int | None = None


class FakeNvml:
    def __init__(self, fixture: str | Path | dict[str, Any], *, driver: bool = True) -> None:
        if isinstance(fixture, dict):
            self.data: dict[str, Any] = fixture
        else:
            path = Path(fixture)
            self.data = json.loads((path if path.suffix else FIXTURES / f"{path}.json").read_text())
        self.driver = driver
        self.initialized = 0  # nvmlInit is reference counted by the library
        self.lost: set[int] = set()
        self.failing: dict[tuple[int, str], str] = {}  # (gpu index, field) -> NVML error name
        self.calls = 0

    # --- what tests change between ticks -------------------------------------------------

    @property
    def gpus(self) -> list[dict[str, Any]]:
        gpus: list[dict[str, Any]] = self.data["gpus"]
        return gpus

    def lose(self, index: int) -> None:
        """The GPU falls off the bus (Xid 79): every call on it raises GpuIsLost."""
        self.lost.add(index)

    def remove(self, index: int) -> None:
        """The GPU is gone from the driver's view (reset out, unbound): the count drops."""
        self.lost.discard(index)
        del self.data["gpus"][index]

    def fail(self, index: int, field: str, name: str = "UNKNOWN") -> None:
        """One field of one GPU raises NVML_ERROR_<name> until ``heal``."""
        self.failing[index, field] = name

    def heal(self) -> None:
        self.failing.clear()

    # --- installing ------------------------------------------------------------------------

    @contextmanager
    def installed(self) -> Iterator[FakeNvml]:
        saved = {name: getattr(pynvml, name) for name in FUNCTIONS}
        try:
            for name in FUNCTIONS:
                setattr(pynvml, name, getattr(self, name))
            yield self
        finally:
            for name, fn in saved.items():
                setattr(pynvml, name, fn)

    # --- the library -----------------------------------------------------------------------

    def _check(self) -> None:
        self.calls += 1
        if not self.initialized:
            raise error("UNINITIALIZED")

    def _gpu(self, h: Handle) -> dict[str, Any]:
        self._check()
        if h.gpu in self.lost:
            raise error("GPU_IS_LOST")
        if h.gpu >= len(self.gpus):  # a handle of a GPU that was removed
            raise error("INVALID_ARGUMENT")
        gpu = self.gpus[h.gpu]
        if h.slot is None:
            return gpu
        if gpu.get("mig_mode", [0, 0])[0] != 1:
            raise error("INVALID_ARGUMENT")
        for mig in gpu.get("mig", []):
            if mig["slot"] == h.slot:
                return dict(mig)
        raise error("NOT_FOUND")

    def _value(self, h: Handle, field: str) -> Any:
        dev = self._gpu(h)
        failing = self.failing.get((h.gpu, field))
        if failing:
            raise error(failing)
        value = dev.get(field, "NOT_SUPPORTED")
        if isinstance(value, str):
            raise error(value)
        return value

    def nvmlInit(self) -> None:
        self.calls += 1
        if not self.driver:
            raise error("LIBRARY_NOT_FOUND")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check()
        if index >= len(self.gpus):
            raise error("INVALID_ARGUMENT")
        if index in self.lost:
            raise error("GPU_IS_LOST")
        return Handle(index)

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return str(self._gpu(h)["uuid"])

    def nvmlDeviceGetName(self, h: Handle) -> str:
        return str(self._gpu(h)["name"])

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        mode = self._value(h, "mig_mode")
        return [int(mode[0]), int(mode[1])]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return int(self._gpu(h).get("max_mig_devices", 0))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, index: int) -> Handle:
        gpu = self._gpu(h)
        if index >= gpu.get("max_mig_devices", 0):
            raise error("INVALID_ARGUMENT")
        self._gpu(Handle(h.gpu, index))  # NotFound for an empty slot
        return Handle(h.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        if h.slot is None:
            raise error("INVALID_ARGUMENT")
        return int(self._gpu(h)["gpu_instance_id"])

    def nvmlDeviceGetComputeInstanceId(self, h: Handle) -> int:
        if h.slot is None:
            raise error("INVALID_ARGUMENT")
        return int(self._gpu(h)["compute_instance_id"])

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        u = self._value(h, "utilization")
        return pynvml.c_nvmlUtilization_t(gpu=u["gpu"], memory=u["memory"])

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: int | None = None) -> Any:
        m = self._value(h, "memory")
        return pynvml.c_nvmlMemory_t(total=m["total"], free=m["free"], used=m["used"])

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return int(self._value(h, "power_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return int(self._value(h, "energy_mj"))

    def nvmlDeviceGetClockInfo(self, h: Handle, clock_type: int) -> int:
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise error("INVALID_ARGUMENT")
        return int(self._value(h, "sm_clock_mhz"))

    def nvmlDeviceGetProcessUtilization(self, h: Handle, timeStamp: int) -> list[Any]:
        """The buffered samples newer than ``timeStamp``, as pynvml's ctypes structs; none:
        NVML_ERROR_NOT_FOUND (the NVML docs: no valid sample since lastSeenTimeStamp)."""
        samples = [s for s in self._value(h, "process_samples") if s["timeStamp"] > timeStamp]
        if not samples:
            raise error("NOT_FOUND")
        return [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=s["pid"],
                timeStamp=s["timeStamp"],
                smUtil=s["smUtil"],
                memUtil=s.get("memUtil", 0),
                encUtil=s.get("encUtil", 0),
                decUtil=s.get("decUtil", 0),
            )
            for s in samples
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        """Friendly objects of c_nvmlProcessInfo_v3_t, built and patched as pynvml does
        (usedGpuMemory NVML_VALUE_NOT_AVAILABLE -> None)."""
        out = []
        not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        for p in self._value(h, "compute_processes"):
            used = p["usedGpuMemory"]
            raw = pynvml.c_nvmlProcessInfo_v3_t(
                pid=p["pid"],
                usedGpuMemory=not_available if used is None else used,
                gpuInstanceId=p.get("gpuInstanceId", 0xFFFFFFFF),
                computeInstanceId=p.get("computeInstanceId", 0xFFFFFFFF),
            )
            obj = pynvml.nvmlStructToFriendlyObject(raw)
            if obj.usedGpuMemory == not_available:
                obj.usedGpuMemory = None
            out.append(obj)
        return out
