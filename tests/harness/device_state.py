"""What one accelerator is doing at one instant, vendor-neutral: the fakes of each vendor's
tools (amdsmi, pynvml, XPU Manager's and AMD's exporters, dcgm-exporter) render it in the
format their recorded real outputs have, so one scenario drives every agent and scraper
(tests/streams/test_mixed_estate.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessState:
    """One process using a device."""

    pid: int
    #: the fraction of the device's time this process kept it busy (NVML smUtil / 100; AMD
    #: engine time over wall time)
    busy: float
    memory_mib: float
    #: the pod whose cgroup holds it (None: a process of no pod)
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    name: str = "python3"


@dataclass(frozen=True)
class Holder:
    """A pod the device layer says holds a device."""

    namespace: str
    pod: str
    container: str
    pod_uid: str


@dataclass(frozen=True)
class DeviceState:
    """One device (a whole GPU, an AMD compute partition, an Intel card) at one instant."""

    node: str
    #: the device's index on its node as the vendor's tool numbers it (an AMD partition has
    #: its own; an Intel card its card index)
    index: int
    #: the vendor's own UUID, without gpugap's prefix (``6cff74a1-...``)
    uuid: str
    model: str
    #: the device's busy fraction over the last interval (0..1)
    busy: float
    memory_used_mib: float
    memory_total_mib: float
    power_w: float
    #: energy counter since boot, joules
    energy_j: float
    serial: str = ""
    pci_bdf: str = ""
    #: AMD compute partition: its id and the mode (CPX, DPX...); None: not partitioned
    partition_id: int | None = None
    partition_mode: str | None = None
    #: NVIDIA MIG: the slice's GPU instance id and profile (``uuid`` is the slice's own
    #: ``MIG-`` UUID without its prefix, ``parent_uuid`` its GPU's without ``GPU-``)
    mig_gi: int | None = None
    mig_profile: str | None = None
    parent_uuid: str | None = None
    #: Intel: each tile's busy fraction (the card's busy is their mean)
    tile_busy: tuple[float, ...] | None = None
    #: the pods the device layer says hold it (kubelet pod-resources, exporters' pod labels):
    #: one, or several on a time-sliced GPU
    holders: tuple[Holder, ...] = ()
    #: the Slurm job the device layer says holds it (exporters' job labels)
    slurm_job_id: str | None = None
    #: processes using it (per-process measures)
    processes: tuple[ProcessState, ...] = ()
