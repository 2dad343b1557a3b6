"""``gpugap produce nvml``: the node agent. One ``NodeSample`` per tick with every GPU (or MIG
instance) of this node, read through NVML, attributed to the pod holding it (kubelet
PodResources, when the socket is there) and to the Slurm job (a job-mapping directory).

Activity is NVML's utilization / 100 (``activity_metric: utilization``): the only activity
NVML has for a whole GPU. In MIG mode NVML has no utilization at all, so MIG samples carry
memory only and say so in ``unsupported``; dcgm-exporter's profiling metrics
(``gpugap produce dcgm``) are the source for activity per MIG instance.

Each whole GPU's use per pod is measured from its processes (``measured_use``: process
utilization and memory, PIDs mapped to pods by their cgroups; producers/nvml/processes.py),
unless GPUGAP_NVML_PROCESS_USE is false.

The tick, the kubelet, the job map and the worker thread are the node agents' seam
(producers/node_agent.py).
"""

from __future__ import annotations

from typing import ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.node_agent import NodeAgent
from gpugap.producers.nvml.pod_resources import PodResourcesClient, lookup
from gpugap.producers.nvml.processes import ProcessUse
from gpugap.producers.nvml.sampler import NoDriver, NvmlSampler
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import Attribution, GpuSample
from gpugap.schemas.types import SampleSource


class NvmlProducer(NodeAgent):
    sampler: NvmlSampler
    name: ClassVar[str] = "nvml"
    source = SampleSource.NVML
    library = "NVML"
    no_driver = NoDriver
    no_driver_advice = (
        "Run the agent on a GPU node with the NVIDIA driver (in Kubernetes: the nvidia runtime "
        "class or the device plugin's mounts), pass --allow-no-gpu to wait for one, or scrape "
        "dcgm-exporter with `gpugap produce dcgm`"
    )
    no_devices = "the driver reports no GPU on this node"

    def __init__(self, settings: Settings, config: NvmlSettings | None = None) -> None:
        cfg = config or NvmlSettings()
        processes = ProcessUse(cfg.proc_root) if cfg.process_use else None
        pods = (
            PodResourcesClient(cfg.pod_resources_socket, cfg.pod_resources_timeout_s)
            if cfg.pod_resources_socket is not None
            else None
        )
        super().__init__(settings, cfg, NvmlSampler(cfg.rediscover_s, processes=processes), pods)

    async def holders(self) -> dict[str, Attribution] | None:
        return await self.pods.list()

    def holder_of(self, g: GpuSample, holders: dict[str, Attribution]) -> Attribution | None:
        return lookup(holders, g.uuid, g.mig)
