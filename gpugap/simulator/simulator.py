"""``gpugap simulate``: a synthetic mixed Slurm + Kubernetes estate whose true answer is known.

Conventions that consumers (the stream, the tests) rely on:

- **GPUs by UUID.** ``GPU-<uuid5(cluster/node/index)>``; a MIG slice is
  ``MIG-<uuid5(parent/mig/<gi>)>`` with ``mig.parent_uuid`` and its parent's ``index``. A MIG
  slice is one allocatable device, but its GPU-seconds are its share of its physical GPU
  (``mig.profile`` over the model's compute slices: 1g.10gb of an A100 = 1/7): allocated,
  consumed, idle and unattributed alike. A partitioned GPU's capacity is one GPU; the share no
  slice covers (2 x 3g.40gb leave 1/7) is always unallocated.
- **Samples describe the past interval.** A node sample at time ``t`` with ``interval_s=Δ``
  describes ``(t-Δ, t]``: each GPU's activity is the average over that interval (as NVML and
  DCGM report the last sample period). Activity is constant on each node's sample grid
  (``offset + kΔ``, offsets differ per node), so integrating the samples reproduces the model
  exactly. Activity is 0 in every slot that straddles an allocation boundary.
- **Slurm jobs carry GPU indices per node** (``nodes[].gpu_indices``); samples carry index and
  UUID, so the index -> UUID map comes from the node's own samples.
- **Kubernetes pods carry node and GPU count, not which GPUs.** Samples of Kubernetes nodes
  carry ``attribution`` (pod, namespace, container) on every GPU a pod holds, at every sample
  time it holds it, as dcgm-exporter's pod labels do: that maps pods to GPU UUIDs.
- **Allocated time**: Slurm from ``start_time`` to ``end_time`` on its GPUs; Kubernetes from the
  ``bound`` event until ``terminated`` or ``deleted``, whichever is first. A Pending pod has no
  ``bound`` event and holds nothing (a gang's pending pod is only seen when it is deleted).
- **Deterministic event ids** (``slurm/<cluster>/<job>/start``, ``k8s/<cluster>/<uid>/bound``):
  duplicates are byte-identical copies, delivered a little later.
- **Workload class**: pods carry ``workload_class`` (Deployment -> service, Notebook ->
  interactive, Job/PyTorchJob -> batch); Slurm jobs carry ``interactive`` (salloc) and no
  class (the default rules apply). Slurm ``account`` and pod ``team`` are the team.
- **Malformed records**: raw bytes next to a good record (truncated, not JSON, naive time,
  out of range / wrong type). In JSONL they are ``{"topic","key","value_b64"}`` lines.
- **Lost samples** (``faults.sample_loss_rate``): node samples never sent, as missed scrapes;
  their seconds are unmeasured in the truth. The first sample naming a pod on a device is
  never lost (see gpugap/simulator/loss.py).
- **Ground truth** (``--truth``, default ``<out without .jsonl>.truth.json``) is computed from
  the model, restricted to the window ``[start, start + duration)``: see gpugap/simulator/truth.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.schemas import Topic
from gpugap.schemas.topics import SAMPLES
from gpugap.simulator import build
from gpugap.simulator import scenario as scenarios
from gpugap.simulator.emit import Emitter, Stats
from gpugap.simulator.truth import compute

log = logging.getLogger(__name__)


def truth_path_for(out: str | None) -> Path | None:
    if not out or out == "-":
        return None
    path = Path(out)
    return path.with_suffix(".truth.json") if path.suffix == ".jsonl" else Path(out + ".truth.json")


class Simulator(Producer):
    """Publishes a scenario's events; ``run()`` returns when the window has been emitted."""

    name: ClassVar[str] = "simulate"

    def __init__(
        self,
        settings: Settings,
        scenario: str | Path | scenarios.Scenario = "small",
        *,
        seed: int | None = None,
        duration: int | None = None,
        speed: float | None = 1.0,
        truth: Path | None = None,
    ) -> None:
        super().__init__(settings)
        sc = scenario if isinstance(scenario, scenarios.Scenario) else scenarios.load(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"scenario": sc.scenario.model_copy(update={"seed": seed})})
        self.scenario = sc
        self.window = duration or sc.scenario.duration
        self.speed = speed
        self.truth_path = truth
        self.truth: dict[str, Any] | None = None
        self.stats: Stats | None = None

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        plan = build(self.scenario, self.window)
        if self.truth_path is not None:
            self.truth = compute(self.scenario, plan, self.window)
        assert self.publisher is not None
        emitter = Emitter(self.scenario, plan, self.window)
        try:
            self.stats = await emitter.run(self.publisher, stop, self.speed)
        finally:
            self.stats = emitter.stats
            if self.truth is not None and self.truth_path is not None:
                self.truth["emitted"] = emitter.stats.as_dict()
                write_json(self.truth_path, self.truth)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
