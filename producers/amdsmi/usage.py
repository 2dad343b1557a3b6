"""Per-pod measured use of one AMD device, from amdsmi's process list.

``amdsmi_get_gpu_process_list`` gives, per process, ``engine_usage.gfx``: the process's
cumulative GFX engine time in ns (the ``drm-engine-gfx`` count of its DRM file descriptors),
and its VRAM in bytes (tests/fixtures/amd/NOTES.md). A share over an interval is the
difference of two readings over the wall time between them, so the first reading of a
device measures nothing.

Recorded process lists of busy GPUs show ``gfx: 0`` for compute processes holding GBs
(amdsmi_process_mi300x8.csv, amdsmi_process_r9700x2_rocm7.2.json): ROCm's compute queues do
not seem to pass through the DRM scheduler. So when no process's count moved while the
device was busy (or its activity is unknown), nothing was measured: ``None``, never a split
made up from memory or an even share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugap.producers.kubelet_cgroup import pod_uid_of_pid
from gpugap.schemas import MeasuredUse
from gpugap.schemas.types import MAX_SHARING_PODS

log = logging.getLogger(__name__)

MIB = 1 << 20
NS = 1_000_000_000


@dataclass(frozen=True)
class ProcessReading:
    pid: int
    gfx_ns: int | None
    vram_bytes: int | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def readings(processes: Iterable[Mapping[str, Any]]) -> list[ProcessReading]:
    """amdsmi's process dicts as readings; "N/A" fields are None, malformed entries skipped."""
    out = []
    for p in processes:
        pid = _int(p.get("pid"))
        if pid is None:
            continue
        engine = p.get("engine_usage")
        memory = p.get("memory_usage")
        gfx = _int(engine.get("gfx")) if isinstance(engine, Mapping) else None
        vram = _int(memory.get("vram_mem")) if isinstance(memory, Mapping) else None
        out.append(ProcessReading(pid, gfx, vram if vram is not None else _int(p.get("mem"))))
    return out


class UsageTracker:
    """Keeps each device's last reading to turn cumulative engine time into a share."""

    def __init__(
        self, proc_root: Path = Path("/proc"), pod_of: Callable[[int], str | None] | None = None
    ) -> None:
        self.pod_of = pod_of or (lambda pid: pod_uid_of_pid(pid, proc_root))
        self._last: dict[str, tuple[float, dict[int, int]]] = {}
        self._capped: set[str] = set()

    def forget(self, keep: Iterable[str]) -> None:
        """Drop devices that are gone (bounded memory as devices come and go)."""
        kept = set(keep)
        for key in [k for k in self._last if k not in kept]:
            del self._last[key]

    def measure(
        self, key: str, now: float, procs: list[ProcessReading], busy: float | None
    ) -> tuple[MeasuredUse, ...] | None:
        """Use per pod since this device's previous reading; None when nothing was measured."""
        counts = {p.pid: p.gfx_ns for p in procs if p.gfx_ns is not None}
        previous = self._last.get(key)
        self._last[key] = (now, counts)
        if previous is None or now <= previous[0]:
            return None
        if any(p.gfx_ns is None for p in procs):
            return None  # a process's engine time unknown: its share cannot be told
        before_t, before = previous
        wall_ns = (now - before_t) * NS
        # a PID not seen before started since (or reused a PID): all its time is in the interval
        deltas = {
            pid: n - before[pid] if before.get(pid, n + 1) <= n else n for pid, n in counts.items()
        }
        if procs and not any(deltas.values()) and (busy is None or busy > 0):
            return None
        per_pod: dict[str | None, list[float]] = {}
        for p in procs:
            entry = per_pod.setdefault(self.pod_of(p.pid), [0.0, 0.0])
            entry[0] += deltas[p.pid] / wall_ns
            entry[1] += (p.vram_bytes or 0) / MIB
        pods = sorted((uid for uid in per_pod if uid is not None), key=lambda u: -per_pod[u][0])
        if len(pods) > MAX_SHARING_PODS:
            if key not in self._capped:
                log.warning(
                    "amdsmi: %s: processes of %d pods; kept the %d busiest, the rest's use "
                    "counts as no pod's (unattributed, never billed to a holder)",
                    key, len(pods), MAX_SHARING_PODS,
                )  # fmt: skip
                self._capped.add(key)
            rest = per_pod.setdefault(None, [0.0, 0.0])
            for uid in pods[MAX_SHARING_PODS:]:
                act, mem = per_pod.pop(uid)
                rest[0] += act
                rest[1] += mem
        else:
            self._capped.discard(key)
        order = sorted(per_pod.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
        return tuple(
            MeasuredUse(pod_uid=uid, activity=min(1.0, act), memory_used_mib=mem)
            for uid, (act, mem) in order
        )
