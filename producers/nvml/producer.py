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

NVML calls run in a worker thread: they normally take microseconds, but a GPU in trouble can
block a call for seconds, and the event loop must still publish, flush and stop meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.nvml.job_map import read_job_map
from gpugap.producers.nvml.pod_resources import PodResourcesClient, lookup, merge
from gpugap.producers.nvml.processes import ProcessUse
from gpugap.producers.nvml.sampler import NoDriver, NvmlSampler
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import GpuSample, NodeSample, Record, Topic, utc_now
from gpugap.schemas.errors import ConfigError, FatalError
from gpugap.schemas.topics import SAMPLES
from gpugap.schemas.types import SampleSource

log = logging.getLogger(__name__)


class NvmlProducer(Producer):
    name: ClassVar[str] = "nvml"

    def __init__(self, settings: Settings, config: NvmlSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = cfg = config or NvmlSettings()
        self.cluster = cfg.cluster or settings.cluster
        self.node = cfg.node or socket.gethostname()
        self.interval_s = cfg.interval_s
        processes = ProcessUse(cfg.proc_root) if cfg.process_use else None
        self.sampler = NvmlSampler(cfg.rediscover_s, processes=processes)
        self.pods = (
            PodResourcesClient(cfg.pod_resources_socket, cfg.pod_resources_timeout_s)
            if cfg.pod_resources_socket is not None
            else None
        )
        self._said_waiting = False
        self._said_empty = False
        # Fail before anything else starts (the broker connection included), so a node
        # without a driver gets the one message that matters.
        self._start_nvml()

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    def _start_nvml(self) -> bool:
        try:
            self.sampler.start()
        except NoDriver as exc:
            if not self.cfg.allow_no_gpu:
                raise FatalError(
                    f"NVML: {exc}. Run the agent on a GPU node with the NVIDIA driver (in "
                    "Kubernetes: the nvidia runtime class or the device plugin's mounts), "
                    "pass --allow-no-gpu to wait for one, or scrape dcgm-exporter with "
                    "`gpugap produce dcgm`"
                ) from None
            if not self._said_waiting:
                log.warning(
                    "NVML: %s; waiting for a driver (--allow-no-gpu): no samples until then", exc
                )
                self._said_waiting = True
            return False
        if self._said_waiting:
            log.warning("NVML: driver found, %d devices", len(self.sampler.devices))
            self._said_waiting = False
        return True

    async def poll(self) -> Iterable[Record]:
        if self.interval_s < 1.0:
            raise ConfigError("nvml: the interval must be at least 1 s (--interval)")
        if not self.sampler.started and not await asyncio.to_thread(self._start_nvml):
            return []
        holders_task = asyncio.create_task(self.pods.list()) if self.pods else None
        jobs = read_job_map(self.cfg.job_mapping_dir) if self.cfg.job_mapping_dir else {}
        time = utc_now()
        try:
            gpus = await asyncio.to_thread(self.sampler.sample)
        except BaseException:
            if holders_task:
                holders_task.cancel()
            raise
        holders = await holders_task if holders_task else None
        if not gpus:
            if not self._said_empty:
                log.warning("NVML: the driver reports no GPU on this node; nothing to publish")
                self._said_empty = True
            return []
        self._said_empty = False
        if holders or jobs:
            gpus = [self._attribute(g, holders or {}, jobs) for g in gpus]
        return [
            NodeSample(
                cluster=self.cluster,
                node=self.node,
                time=time,
                source=SampleSource.NVML,
                interval_s=float(self.interval_s),
                gpus=tuple(gpus),
            )
        ]

    @staticmethod
    def _attribute(g: GpuSample, holders: dict[str, Any], jobs: dict[int, str]) -> GpuSample:
        who = merge(lookup(holders, g.uuid, g.mig), jobs.get(g.index))
        return g if who is None else g.model_copy(update={"attribution": who})

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
        await asyncio.to_thread(self.sampler.stop)
