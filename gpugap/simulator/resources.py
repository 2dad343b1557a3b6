"""What an allocation holds of its node beside its GPUs: CPUs and memory (for the node
capacity polls, node-capacity.v1, and the stranded-GPU truth, truth_stranded.py).

By default an allocation holds its node's per-GPU share for each GPU-equivalent it holds (a
1g.10gb slice of an A100 on a 16-core 2-GPU node: 8/7 cores), so work of the default shape
never strands a GPU. A workload's ``cpus_per_gpu`` / ``memory_gib_per_gpu`` ranges are drawn
per allocation from a random stream of their own (``<seed>/<cluster>/<i>/<kind>/resources``),
so adding them changes no other draw. Amounts are exact fractions: CPUs in thousandths (as
Kubernetes' millicores), memory in whole MiB."""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from gpugap.schemas.shares import mig_share, slices_of
from gpugap.simulator.specs import Workload

if TYPE_CHECKING:
    from gpugap.simulator.estate import Device, Node


def gpu_equivalent(d: Device) -> Fraction:
    """A device's part of its physical GPU, exactly (as truth.share_of)."""
    if d.parent_uuid is None:
        return Fraction(1)
    share = mig_share(d.mig_profile, d.model)
    if share is None:
        return Fraction(1)
    total = slices_of(d.model)
    return Fraction(round(share * total), total)


@dataclass(frozen=True, slots=True)
class PerGpu:
    """CPUs and memory (MiB) per GPU-equivalent; None: the node's own share."""

    cpus: Fraction | None = None
    memory_mib: Fraction | None = None

    @property
    def even(self) -> bool:
        return self.cpus is None and self.memory_mib is None

    def of(self, node: Node, gpus: Fraction) -> tuple[Fraction, Fraction]:
        """(CPUs, memory MiB) for ``gpus`` GPU-equivalents on ``node``."""
        cpus = self.cpus if self.cpus is not None else node.cpus / node.gpus
        mem = self.memory_mib if self.memory_mib is not None else node.memory_mib / node.gpus
        return cpus * gpus, mem * gpus


EVEN = PerGpu()


class Sampler:
    """Draws one workload's per-GPU CPUs and memory, one allocation (request) at a time."""

    def __init__(self, w: Workload, rng: random.Random) -> None:
        self.cpus, self.memory = w.cpus_per_gpu, w.memory_gib_per_gpu
        self.rng = rng

    def draw(self) -> PerGpu:
        if self.cpus is None and self.memory is None:
            return EVEN
        cpus = mem = None
        if self.cpus is not None:
            cpus = Fraction(round(self.rng.uniform(*self.cpus) * 1000), 1000)
        if self.memory is not None:
            mem = Fraction(round(self.rng.uniform(*self.memory) * 1024))
        return PerGpu(cpus, mem)
