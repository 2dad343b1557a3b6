"""The simulator's model: scenario -> estate -> placed allocations with activity programs.

``build()`` is deterministic in (scenario, seed): the same inputs give the same plan, and a
shorter window gives a prefix of the longer one (arrivals come from the scenario's duration,
not the window's).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gpugap.simulator import gang, kube, patterns, scenario
from gpugap.simulator.estate import build as build_estate
from gpugap.simulator.plan import Placer, Plan
from gpugap.simulator.resources import Sampler

_PATTERNS: dict[str, Callable[..., None]] = {
    "slurm_training": patterns.slurm_training,
    "slurm_batch": patterns.slurm_batch,
    "slurm_interactive": patterns.slurm_interactive,
    "slurm_array": patterns.slurm_array,
    "k8s_inference": kube.k8s_inference,
    "k8s_notebook": kube.k8s_notebook,
    "k8s_job": kube.k8s_job,
    "k8s_gang": gang.k8s_gang,
    "k8s_sweep": kube.k8s_sweep,
    "unattributed": kube.unattributed,
    "cpu_only": patterns.cpu_only,
}


def build(sc: scenario.Scenario, window: int | None = None) -> Plan:
    """The plan for ``sc`` observed over ``window`` seconds (default: the scenario's duration)."""
    seed = sc.scenario.seed
    estate = build_estate(sc)
    horizon = max(sc.scenario.duration, window or 0) + 3600
    plan = Plan(estate, horizon)
    placer = Placer(plan, f"{seed}/placer")
    ctx = patterns.Ctx(sc, estate, plan, placer)
    for cluster in sc.clusters:
        for i, w in enumerate(cluster.workloads):
            kind: str = w.kind
            rng = random.Random(f"{seed}/{cluster.name}/{i}/{kind}")
            # CPUs and memory beside the GPUs: a stream of their own (resources.py)
            placer.sampler = Sampler(
                w, random.Random(f"{seed}/{cluster.name}/{i}/{kind}/resources")
            )
            _PATTERNS[kind](ctx, rng, cluster.name, w)
    placer.run()
    return plan


__all__ = ["Plan", "S", "build"]
