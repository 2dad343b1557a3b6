"""A fake ``amdsmi`` Python package, rendered from DeviceState objects (device_state.py).

``FakeAmdSmi(states).installed()`` puts a module named ``amdsmi`` in ``sys.modules`` whose
getters return what the real package returns -- dicts with the real keys, ``"N/A"`` strings
for what a device lacks, ``AmdSmiLibraryException`` (``err_code``) on errors -- and
``set(states, elapsed_s)`` replaces the devices between polls, advancing the cumulative
counters (per-process engine time, energy) and the fake's clock by ``elapsed_s``.

Shapes, and where they were read (tests/fixtures/amd/SOURCES.md, NOTES.md section 1):
- getters and their keys: github.com/ROCm/amdsmi ``py-interface/amdsmi_interface.py`` @
  ``0ceca28f4139`` (asic_info, activity, vram_usage, power_info, energy_count, process
  list), rocm-systems ``projects/amdsmi`` (``amdsmi_get_gpu_kfd_info``: ``kfd_id``,
  ``node_id``, ``current_partition_id``; ``asic_serial`` formatted ``0x%016X``;
  ``gpu_metrics`` keys ``num_partition`` and ``xcp_stats.gfx_busy_inst``: one list per XCP,
  one entry per XCC, "N/A" where unused, only on partition 0: secondary partitions' metrics
  are "N/A" throughout, as amd-smi's own default dict);
- VRAM in "MB" that are MiB (amdsmi_static_vram_mi300x.json: 196592 for 192 GiB);
- process entries (amdsmi_process_r9700x2_rocm7.2.json, amdsmi_process_mi300x8.csv): pid,
  name, mem, ``engine_usage {gfx, enc}`` in ns, ``memory_usage {gtt_mem, cpu_mem,
  vram_mem}`` in bytes, ``cu_occupancy``, ``evicted_time``. ``engine_time=False`` keeps
  ``gfx`` at 0 as both recorded lists of busy GPUs do;
- energy: ``energy_accumulator`` ticks of ``counter_resolution`` µJ (15.259: 2^-16 J).

``failing_import(exc, version)`` makes ``import amdsmi`` raise ``exc``, as a package that does
not match the host's ROCm does (amdsmi_error_*.txt), with an installed version to name.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import tempfile
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.harness.device_state import DeviceState

NA = "N/A"
RESOLUTION_UJ = 15.259
XCC_PER_GPU = 8  # MI300X: 8 XCDs, one XCC each
MAX_XCP = 8
STATUS_NOT_SUPPORTED = 2
STATUS_BUSY = 30
STATUS_DRIVER_NOT_LOADED = 51  # the fake's code; its err_info names it
MIB = 1 << 20


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = {
            2: "AMDSMI_STATUS_NOT_SUPPORTED",
            30: "AMDSMI_STATUS_BUSY",
            STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED",
        }.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR")

    def get_error_info(self) -> str:
        return self.err_info

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"


class Handle:
    """Stands for ``amdsmi_wrapper.amdsmi_processor_handle`` (a ctypes pointer)."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakeAmdSmi:
    def __init__(
        self, states: Sequence[DeviceState], *, engine_time: bool = True, driver: bool = True
    ) -> None:
        self.states = list(states)
        self.engine_time = engine_time
        self.driver = driver
        self.now = 1000.0
        self._gfx_ns: dict[tuple[str, int | None, int], int] = {}
        self._failing: dict[tuple[int, str], int] = {}
        self._handles = [Handle(i) for i in range(len(self.states))]

    # --- driving it ----------------------------------------------------------------------

    def set(self, states: Sequence[DeviceState], elapsed_s: float) -> None:
        """The devices after ``elapsed_s`` seconds: engine time grows by each process's busy."""
        self.now += elapsed_s
        self.states = list(states)
        if len(self._handles) != len(self.states):
            self._handles = [Handle(i) for i in range(len(self.states))]
        for s in self.states:
            for p in s.processes:
                key = (s.uuid, s.partition_id, p.pid)
                grown = int(p.busy * elapsed_s * 1e9) if self.engine_time else 0
                self._gfx_ns[key] = self._gfx_ns.get(key, 0) + grown

    def clock(self) -> float:
        return self.now

    def fail(self, index: int, fn: str, code: int = STATUS_BUSY) -> None:
        self._failing[(index, fn)] = code

    def heal(self) -> None:
        self._failing.clear()

    @contextlib.contextmanager
    def installed(self) -> Iterator[types.ModuleType]:
        module = self.module()
        saved = sys.modules.get("amdsmi")
        sys.modules["amdsmi"] = module
        try:
            yield module
        finally:
            if saved is None:
                sys.modules.pop("amdsmi", None)
            else:
                sys.modules["amdsmi"] = saved

    def module(self) -> types.ModuleType:
        m = types.ModuleType("amdsmi")
        m.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
        m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
        m.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=2)  # type: ignore[attr-defined]
        for name in dir(self):
            if name.startswith("amdsmi_"):
                setattr(m, name, self._guard(name, getattr(self, name)))
        return m

    def _guard(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            if not self.driver and name != "amdsmi_shut_down":
                raise AmdSmiLibraryException(STATUS_DRIVER_NOT_LOADED)
            if args and isinstance(args[0], Handle):
                code = self._failing.get((args[0].index, name))
                if code is not None:
                    raise AmdSmiLibraryException(code)
            return fn(*args)

        return call

    # --- rendering -----------------------------------------------------------------------

    def _state(self, h: Handle) -> DeviceState:
        return self.states[h.index]

    def _group(self, s: DeviceState) -> list[DeviceState]:
        """The partitions of the physical device ``s`` is part of (itself when whole)."""
        if s.partition_id is None:
            return [s]
        key = s.serial or s.pci_bdf.rsplit(".", 1)[0]
        same = [x for x in self.states if (x.serial or x.pci_bdf.rsplit(".", 1)[0]) == key]
        return sorted(same, key=lambda x: x.partition_id or 0)

    def _primary(self, s: DeviceState) -> bool:
        return s.partition_id in (None, 0)

    def amdsmi_init(self, flags: int = 0) -> None:
        pass

    def amdsmi_shut_down(self) -> None:
        pass

    def amdsmi_get_processor_handles(self) -> list[Handle]:
        return list(self._handles)

    def amdsmi_get_gpu_device_uuid(self, h: Handle) -> str:
        return self._state(h).uuid

    def amdsmi_get_gpu_device_bdf(self, h: Handle) -> str:
        s = self._state(h)
        return s.pci_bdf or f"0000:{0x0C + 0x10 * s.index:02x}:00.0"

    def amdsmi_get_gpu_asic_info(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        group = self._group(s)
        serial = f"0x{int(s.serial, 16):016X}" if s.serial else NA
        return {
            "market_name": s.model,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": serial,
            "oam_id": h.index,
            "num_compute_units": 304 // len(group),
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_compute_partition(self, h: Handle) -> str:
        return self._state(h).partition_mode or "SPX"

    def amdsmi_get_gpu_kfd_info(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        return {
            "kfd_id": 0x1000 + h.index,
            "node_id": h.index + 1,  # node 0 is the CPU
            "current_partition_id": s.partition_id or 0,
        }

    def amdsmi_get_gpu_activity(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        if not self._primary(s):
            return {"gfx_activity": NA, "umc_activity": NA, "mm_activity": NA}
        group = self._group(s)
        busy = sum(x.busy for x in group) / len(group)  # the device's, on partition 0
        return {"gfx_activity": round(busy * 100), "umc_activity": 0, "mm_activity": NA}

    def amdsmi_get_gpu_metrics_info(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        keys = ("num_partition", "xcp_stats.gfx_busy_inst", "xcp_stats.gfx_busy_acc")
        if not self._primary(s):
            return {"average_gfx_activity": NA, **dict.fromkeys(keys, NA)}
        group = self._group(s)
        per = XCC_PER_GPU // len(group)
        rows = [[round(x.busy * 100)] * per + [NA] * (XCC_PER_GPU - per) for x in group]
        rows += [[NA] * XCC_PER_GPU] * (MAX_XCP - len(rows))
        busy = sum(x.busy for x in group) / len(group)
        return {
            "average_gfx_activity": round(busy * 100),
            "energy_accumulator": self._energy_ticks(s),
            "num_partition": len(group),
            "xcp_stats.gfx_busy_inst": rows,
            "xcp_stats.gfx_busy_acc": [[NA] * XCC_PER_GPU] * MAX_XCP,
        }

    def amdsmi_get_gpu_vram_usage(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)  # "MB" that are MiB
        return {"vram_total": int(s.memory_total_mib), "vram_used": int(s.memory_used_mib)}

    def amdsmi_get_power_info(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        watts = round(s.power_w) if self._primary(s) else NA
        return {
            "socket_power": watts,
            "current_socket_power": watts,
            "average_socket_power": NA,
            "gfx_voltage": NA,
            "soc_voltage": NA,
            "mem_voltage": NA,
            "power_limit": 750,
        }

    def _energy_ticks(self, s: DeviceState) -> int:
        return int(s.energy_j * 1e6 / RESOLUTION_UJ)

    def amdsmi_get_energy_count(self, h: Handle) -> dict[str, Any]:
        s = self._state(h)
        ticks = self._energy_ticks(s)
        return {
            "power": ticks,  # the same counter, deprecated in ROCm 6.4
            "energy_accumulator": ticks,
            "counter_resolution": RESOLUTION_UJ,
            "timestamp": int(self.now * 1e9),
        }

    def amdsmi_get_gpu_process_list(self, h: Handle) -> list[dict[str, Any]]:
        s = self._state(h)
        out = []
        for p in s.processes:
            vram = int(p.memory_mib * MIB)
            out.append(
                {
                    "name": p.name,
                    "pid": p.pid,
                    "mem": vram,
                    "engine_usage": {
                        "gfx": self._gfx_ns.get((s.uuid, s.partition_id, p.pid), 0),
                        "enc": 0,
                    },
                    "memory_usage": {"gtt_mem": 2134016, "cpu_mem": 211795968, "vram_mem": vram},
                    "cu_occupancy": NA,
                    "evicted_time": 0,
                }
            )
        return out


def write_proc(root: Path, states: Sequence[DeviceState], *, systemd: bool = True) -> None:
    """``<root>/<pid>/cgroup`` for every process of ``states``: in its pod's cgroup (cgroup v2
    with the systemd driver, or v1 with cgroupfs), or a host session for a process of no pod."""
    for s in states:
        for p in s.processes:
            d = root / str(p.pid)
            d.mkdir(parents=True, exist_ok=True)
            if p.pod_uid is None:
                text = "0::/user.slice/user-1000.slice/session-3.scope\n"
            elif systemd:
                uid = p.pod_uid.replace("-", "_")
                text = (
                    "0::/kubepods.slice/kubepods-burstable.slice/"
                    f"kubepods-burstable-pod{uid}.slice/cri-containerd-0123abcd.scope\n"
                )
            else:
                text = (
                    f"12:memory:/kubepods/burstable/pod{p.pod_uid}/0123abcd\n"
                    f"4:devices:/kubepods/burstable/pod{p.pod_uid}/0123abcd\n"
                )
            (d / "cgroup").write_text(text)


class _Failing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "amdsmi":
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        raise self.exc


@contextlib.contextmanager
def failing_import(exc: BaseException, version: str | None = None) -> Iterator[None]:
    """``import amdsmi`` raises ``exc``; ``version``: the installed package's (dist-info)."""
    saved = sys.modules.pop("amdsmi", None)
    finder = _Failing(exc)
    sys.meta_path.insert(0, finder)
    with tempfile.TemporaryDirectory() as tmp:
        if version is not None:
            info = Path(tmp) / f"amdsmi-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: amdsmi\nVersion: {version}\n"
            )
            sys.path.insert(0, tmp)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            if tmp in sys.path:
                sys.path.remove(tmp)
            sys.modules.pop("amdsmi", None)
            if saved is not None:
                sys.modules["amdsmi"] = saved
