"""Per-process use of a whole GPU, summed per pod: ``GpuSample.measured_use``.

Two NVML calls per whole GPU and poll:

- ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``: the driver's samples newer
  than the previous poll's newest (pynvml does not hand back the updated timestamp, so the
  newest ``timeStamp`` seen is kept here, per GPU). One sample per process that was busy in a
  sample period; a process at 0 % has none. ``NotFound`` means no process was busy since then:
  measured, idle. ``NotSupported`` means the GPU cannot tell: nothing measured (None).
- ``nvmlDeviceGetComputeRunningProcesses(handle)``: the processes holding a context, with
  their memory (bytes; None where the driver cannot say, e.g. WDDM).

A process's activity is its ``smUtil`` summed over the interval's samples and divided by the
number of sample periods seen on the GPU (distinct timestamps): a period without a sample of
that process counts 0 %. The divisor is the same for every process of a GPU, so the ratio
between processes is exactly that of their summed ``smUtil``; streams use it only so.

PIDs become pods through their cgroups (``producers/kubelet_cgroup.py``). The kubelet's
PodResources API names pods but not their UIDs, so an entry carries the pod's UID only: its
identity, the one every allocation is keyed by (``k8s/<cluster>/<uid>``). Processes of no pod
(or exited since) are one entry with no pod: unattributed. When none of a GPU's processes is
visible at all, the agent is in a PID namespace of its own (no ``hostPID``): nothing measured,
one warning.

MIG instances are not read: NVML has no per-process utilization under MIG (the hardware does
not attribute SM time to PIDs), so their ``measured_use`` stays None.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from gpugap.producers.kubelet_cgroup import DEFAULT_PROC_ROOT, pid_visible, pod_uid_of_pid
from gpugap.schemas import MeasuredUse
from gpugap.schemas.types import MAX_SHARING_PODS

log = logging.getLogger(__name__)

MIB = 1 << 20
UtilSamples = list[tuple[int, int, int]]  # (pid, timeStamp µs, smUtil %)


class NotMeasured(Exception):
    """Process use cannot be read on this device (``not_supported``: it never will)."""

    def __init__(self, reason: str, *, not_supported: bool = False) -> None:
        super().__init__(reason)
        self.not_supported = not_supported


class ProcessUse:
    """Reads each whole GPU's process use; remembers each GPU's newest sample timestamp."""

    def __init__(
        self,
        proc_root: Path = DEFAULT_PROC_ROOT,
        pod_of: Callable[[int, Path], str | None] = pod_uid_of_pid,
    ) -> None:
        self.proc_root = proc_root
        self.pod_of = pod_of
        self.last_seen: dict[str, int] = {}  # GPU UUID -> newest timeStamp read (µs)
        self._said_blind = False

    def read(self, uuid: str, handle: Any) -> tuple[MeasuredUse, ...]:
        """The GPU's use per pod since the last read. Raises NotMeasured or NVMLError
        (GpuIsLost and the like: the caller's to handle)."""
        samples = self._utilization(uuid, handle)
        memory = self._memory(handle)
        return self._per_pod(samples, memory)

    def forget(self, keep: set[str]) -> None:
        """Drop the timestamps of GPUs no longer sampled."""
        for uuid in set(self.last_seen) - keep:
            del self.last_seen[uuid]

    def _utilization(self, uuid: str, handle: Any) -> UtilSamples:
        since = self.last_seen.get(uuid, 0)  # 0: all the driver still holds
        try:
            raw = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError as exc:
            # NotFound: no busy process since `since`; pynvml also raises for SUCCESS when
            # the size query finds nothing at all
            if exc.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                return []
            if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                raise NotMeasured("no process utilization", not_supported=True) from None
            raise
        samples = [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in raw]
        # a sample at or before `since` is one already counted (a driver that ignores it)
        samples = [s for s in samples if s[1] > since]
        if samples:
            self.last_seen[uuid] = max(s[1] for s in samples)
        return samples

    @staticmethod
    def _memory(handle: Any) -> dict[int, float | None] | None:
        """PID -> MiB (None: the driver cannot say), or None when the list is unavailable."""
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                log.debug("NVML: running processes: %s", exc)
            return None
        out: dict[int, float | None] = {}
        for p in procs:
            used = p.usedGpuMemory
            out[int(p.pid)] = None if used is None else used / MIB
        return out

    def _per_pod(
        self, samples: UtilSamples, memory: dict[int, float | None] | None
    ) -> tuple[MeasuredUse, ...]:
        periods = len({ts for _, ts, _ in samples}) or 1
        sm: dict[int, int] = defaultdict(int)
        for pid, _, util in samples:
            sm[pid] += util
        pids = set(sm) | set(memory or {})
        if pids and not any(pid_visible(pid, self.proc_root) for pid in pids):
            # not one of them here: the agent's own PID namespace, not processes of no pod
            if not self._said_blind:
                log.warning(
                    "NVML: no GPU process is visible under %s: run the agent with hostPID "
                    "(or mount the host's /proc, GPUGAP_NVML_PROC_ROOT); no use per pod until "
                    "then",
                    self.proc_root,
                )
                self._said_blind = True
            raise NotMeasured("GPU processes not visible")
        busy: dict[str | None, float] = defaultdict(float)
        mib: dict[str | None, float | None] = {}
        for pid in sorted(pids):
            pod = self.pod_of(pid, self.proc_root)
            busy[pod] += sm.get(pid, 0) / periods / 100
            used = None if memory is None else memory.get(pid, 0.0)
            before = mib.get(pod, 0.0)
            mib[pod] = None if used is None or before is None else before + used
        pods = sorted(p for p in busy if p is not None)
        if len(pods) > MAX_SHARING_PODS:
            log.warning(
                "NVML: processes of %d pods on one GPU; kept %d, the rest's use counts as no "
                "pod's (unattributed, never billed to a holder)", len(pods), MAX_SHARING_PODS
            )  # fmt: skip
            for extra in pods[MAX_SHARING_PODS:]:
                busy[None] += busy.pop(extra)
                used, before = mib.pop(extra), mib.get(None, 0.0)
                mib[None] = None if used is None or before is None else before + used
            pods = pods[:MAX_SHARING_PODS]
        keys: list[str | None] = [*pods, *([None] if None in busy else [])]
        return tuple(
            MeasuredUse(pod_uid=k, activity=min(1.0, busy[k]), memory_used_mib=mib[k]) for k in keys
        )
