"""The seam of the node agents (``gpugap produce nvml``, ``gpugap produce amdsmi``): one
``NodeSample`` per tick with every device of this node, read through the vendor's library in
a worker thread, attributed to the pod holding it (the kubelet's PodResources, when the socket
is there) and to the Slurm job (a job-mapping directory).

A vendor's agent gives its sampler (``start``, ``sample``, ``stop``, ``devices``), what its
library raises when no driver is there, how the kubelet names its devices (``holders``) and
what to tell a node without a driver. Library calls run in a worker thread: they normally take
microseconds, but a device in trouble can block a call for seconds, and the event loop must
still publish, flush and stop meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.job_map import read_job_map
from gpugap.schemas import Attribution, GpuSample, NodeSample, Record, Topic, utc_now
from gpugap.schemas.errors import ConfigError, FatalError
from gpugap.schemas.topics import SAMPLES
from gpugap.schemas.types import SampleSource

log = logging.getLogger(__name__)


def merge(pod: Attribution | None, job: str | None) -> Attribution | None:
    """One attribution from what the kubelet and the Slurm job map said."""
    if job is None:
        return pod
    if pod is None:
        return Attribution(slurm_job_id=job)
    return pod.model_copy(update={"slurm_job_id": job})


class Sampler(Protocol):
    started: bool
    devices: Any

    def start(self) -> None: ...
    def sample(self) -> list[GpuSample]: ...
    def stop(self) -> None: ...


class AgentSettings(Protocol):
    cluster: str | None
    node: str | None
    interval_s: float
    allow_no_gpu: bool
    job_mapping_dir: Any


class NodeAgent(Producer):
    #: the source its samples name
    source: ClassVar[SampleSource]
    #: the library as messages name it ("NVML", "amdsmi")
    library: ClassVar[str]
    #: what its sampler raises when the library cannot start (no driver)
    no_driver: ClassVar[type[Exception]]
    #: what to do then, after "<library>: <why>. " (the one message a node without a driver gets)
    no_driver_advice: ClassVar[str]
    #: said once when the driver reports no device
    no_devices: ClassVar[str]

    def __init__(self, settings: Settings, cfg: AgentSettings, sampler: Sampler, pods: Any) -> None:
        super().__init__(settings)
        self.cfg = cfg
        self.cluster = cfg.cluster or settings.cluster
        self.node = cfg.node or socket.gethostname()
        self.interval_s = cfg.interval_s
        self.sampler = sampler
        self.pods = pods
        self._said_waiting = False
        self._said_empty = False
        # Fail before anything else starts (the broker connection included), so a node
        # without a driver gets the one message that matters.
        self._start()

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    async def holders(self) -> dict[str, Attribution] | None:
        """Device identity -> the pod holding it, from the kubelet (None: not asked)."""
        return None

    def holder_of(self, g: GpuSample, holders: dict[str, Attribution]) -> Attribution | None:
        return holders.get(g.uuid)

    def _start(self) -> bool:
        try:
            self.sampler.start()
        except self.no_driver as exc:
            if not self.cfg.allow_no_gpu:
                raise FatalError(f"{self.library}: {exc}. {self.no_driver_advice}") from None
            if not self._said_waiting:
                log.warning(
                    "%s: %s; waiting for a driver (--allow-no-gpu): no samples until then",
                    self.library,
                    exc,
                )
                self._said_waiting = True
            return False
        if self._said_waiting:
            log.warning("%s: driver found, %d devices", self.library, len(self.sampler.devices))
            self._said_waiting = False
        return True

    async def poll(self) -> Iterable[Record]:
        if self.interval_s < 1.0:
            raise ConfigError(f"{self.name}: the interval must be at least 1 s (--interval)")
        if not self.sampler.started and not await asyncio.to_thread(self._start):
            return []
        holders_task = asyncio.create_task(self.holders()) if self.pods else None
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
                log.warning("%s: %s; nothing to publish", self.library, self.no_devices)
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
                source=self.source,
                interval_s=float(self.interval_s),
                gpus=tuple(gpus),
            )
        ]

    def _attribute(
        self, g: GpuSample, holders: dict[str, Attribution], jobs: dict[int, str]
    ) -> GpuSample:
        who = merge(self.holder_of(g, holders), jobs.get(g.index))
        return g if who is None else g.model_copy(update={"attribution": who})

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
        await asyncio.to_thread(self.sampler.stop)
