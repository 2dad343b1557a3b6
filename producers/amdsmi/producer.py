"""``gpugap produce amdsmi``: the AMD node agent. One ``NodeSample`` per tick with every GPU
(or compute partition) of this node, read through AMD's ``amdsmi`` Python package,
attributed to the pod holding it (kubelet PodResources, AMD device ids) and to the Slurm job
(a job-mapping directory), with per-pod measured use from the process list.

``amdsmi`` is imported when the agent starts, not with gpugap: it must be the package of the
host's ROCm, and a wrong pairing fails at import (loader.py), which becomes one ConfigError.
The tick, the kubelet, the job map and the worker thread are the node agents' seam
(producers/node_agent.py).
"""

from __future__ import annotations

from typing import ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.amdsmi.loader import load_amdsmi
from gpugap.producers.amdsmi.pod_resources import AmdPodResources, device_names
from gpugap.producers.amdsmi.sampler import AmdSmiSampler, NoDriver
from gpugap.producers.amdsmi.settings import AmdSmiSettings
from gpugap.producers.node_agent import NodeAgent
from gpugap.schemas import Attribution
from gpugap.schemas.types import SampleSource


class AmdSmiProducer(NodeAgent):
    sampler: AmdSmiSampler
    name: ClassVar[str] = "amdsmi"
    source = SampleSource.AMDSMI
    library = "amdsmi"
    no_driver = NoDriver
    no_driver_advice = (
        "Run the agent on a node with the amdgpu driver loaded and /dev/kfd and /dev/dri "
        "readable (in Kubernetes: the AMD device plugin's mounts, or privileged), pass "
        "--allow-no-gpu to wait for one, or scrape device-metrics-exporter with "
        "`gpugap produce amd-exporter`"
    )
    no_devices = "no AMD GPU on this node"

    def __init__(self, settings: Settings, config: AmdSmiSettings | None = None) -> None:
        cfg = config or AmdSmiSettings()
        self.amd_cfg = cfg
        sampler = AmdSmiSampler(
            load_amdsmi(), cfg.rediscover_s, proc_root=cfg.proc_root, processes=cfg.processes
        )
        pods = (
            AmdPodResources(cfg.pod_resources_socket, cfg.pod_resources_timeout_s)
            if cfg.pod_resources_socket is not None
            else None
        )
        super().__init__(settings, cfg, sampler, pods)

    async def holders(self) -> dict[str, Attribution] | None:
        names = device_names(self.sampler.devices, self.amd_cfg.sys_root)
        return await self.pods.holders(names)
