"""``gpugap produce amdsmi``: the AMD node agent. One ``NodeSample`` per tick with every GPU
(or compute partition) of this node, read through AMD's ``amdsmi`` Python package,
attributed to the pod holding it (kubelet PodResources, AMD device ids) and to the Slurm job
(a job-mapping directory), with per-pod measured use from the process list.

``amdsmi`` is imported when the agent starts, not with gpugap: it must be the package of the
host's ROCm, and a wrong pairing fails at import (loader.py), which becomes one ConfigError.
amdsmi calls run in a worker thread, as NVML's do: a GPU in trouble can block a call.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.amdsmi.loader import load_amdsmi
from gpugap.producers.amdsmi.pod_resources import AmdPodResources, device_names
from gpugap.producers.amdsmi.sampler import AmdSmiSampler, NoDriver
from gpugap.producers.amdsmi.settings import AmdSmiSettings
from gpugap.producers.base import Producer
from gpugap.producers.nvml.job_map import read_job_map
from gpugap.producers.nvml.pod_resources import merge
from gpugap.schemas import GpuSample, NodeSample, Record, Topic, utc_now
from gpugap.schemas.errors import ConfigError, FatalError
from gpugap.schemas.topics import SAMPLES
from gpugap.schemas.types import SampleSource

log = logging.getLogger(__name__)


class AmdSmiProducer(Producer):
    name: ClassVar[str] = "amdsmi"

    def __init__(self, settings: Settings, config: AmdSmiSettings | None = None) -> None:
        super().__init__(settings)
        self.cfg = cfg = config or AmdSmiSettings()
        self.cluster = cfg.cluster or settings.cluster
        self.node = cfg.node or socket.gethostname()
        self.interval_s = cfg.interval_s
        self.sampler = AmdSmiSampler(
            load_amdsmi(), cfg.rediscover_s, proc_root=cfg.proc_root, processes=cfg.processes
        )
        self.pods = (
            AmdPodResources(cfg.pod_resources_socket, cfg.pod_resources_timeout_s)
            if cfg.pod_resources_socket is not None
            else None
        )
        self._said_waiting = False
        self._said_empty = False
        self._start()  # fail before the broker connection: one message that matters

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    def _start(self) -> bool:
        try:
            self.sampler.start()
        except NoDriver as exc:
            if not self.cfg.allow_no_gpu:
                raise FatalError(
                    f"amdsmi: {exc}. Run the agent on a node with the amdgpu driver loaded and "
                    "/dev/kfd and /dev/dri readable (in Kubernetes: the AMD device plugin's "
                    "mounts, or privileged), pass --allow-no-gpu to wait for one, or scrape "
                    "device-metrics-exporter with `gpugap produce amd-exporter`"
                ) from None
            if not self._said_waiting:
                log.warning("amdsmi: %s; waiting for a driver (--allow-no-gpu)", exc)
                self._said_waiting = True
            return False
        if self._said_waiting:
            log.warning("amdsmi: driver found, %d devices", len(self.sampler.devices))
            self._said_waiting = False
        return True

    async def poll(self) -> Iterable[Record]:
        if self.interval_s < 1.0:
            raise ConfigError("amdsmi: the interval must be at least 1 s (--interval)")
        if not self.sampler.started and not await asyncio.to_thread(self._start):
            return []
        jobs = read_job_map(self.cfg.job_mapping_dir) if self.cfg.job_mapping_dir else {}
        time = utc_now()
        gpus = await asyncio.to_thread(self.sampler.sample)
        holders = None
        if self.pods is not None and gpus:
            names = device_names(self.sampler.devices, self.cfg.sys_root)
            holders = await self.pods.holders(names)
        if not gpus:
            if not self._said_empty:
                log.warning("amdsmi: no AMD GPU on this node; nothing to publish")
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
                source=SampleSource.AMDSMI,
                interval_s=float(self.interval_s),
                gpus=tuple(gpus),
            )
        ]

    @staticmethod
    def _attribute(g: GpuSample, holders: dict[str, Any], jobs: dict[int, str]) -> GpuSample:
        who = merge(holders.get(g.uuid), jobs.get(g.index))
        return g if who is None else g.model_copy(update={"attribution": who})

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
        await asyncio.to_thread(self.sampler.stop)
