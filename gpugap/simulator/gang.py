"""Distributed training on Kubernetes whose gang is only partly scheduled."""

from __future__ import annotations

import random

from gpugap.simulator import activity as act
from gpugap.simulator import scenario
from gpugap.simulator.estate import Device, Node
from gpugap.simulator.kube import finish, hold_pod, new_pod
from gpugap.simulator.patterns import Ctx, arrivals, memory
from gpugap.simulator.plan import INF, Allocation, Gang, Pod, Request


def k8s_gang(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.K8sGang) -> None:
    """PyTorchJob-style gangs the default scheduler places piecemeal: all pods but one bind,
    start, and wait idle at the first barrier while the last stays Pending; after a while the
    last one binds (and they train) or the owner deletes the job."""
    pool = ctx.pool(cluster, w.group)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        user, team = ctx.owner(rng, w.teams)
        name = ctx.unique(f"{team}-ddp-{i:03d}")
        gang = Gang(f"{w.namespace}/{name}", cluster, w.namespace, user, team, w.pods)
        pods = [
            new_pod(
                cluster,
                w.namespace,
                f"{name}-worker-{k}",
                kind="PyTorchJob",
                owner=name,
                gpus=w.gpus_per_pod,
                resource="nvidia.com/gpu",
            )
            for k in range(w.pods)
        ]
        for p in pods:
            p.gang_id, p.gang_size = gang.id, w.pods
        _GangPlan(ctx, random.Random(rng.random()), w, gang=gang, pods=pods, pool=pool).submit(t)


class _GangPlan:
    def __init__(
        self,
        ctx: Ctx,
        r: random.Random,
        w: scenario.K8sGang,
        *,
        gang: Gang,
        pods: list[Pod],
        pool: list[Node],
    ) -> None:
        self.ctx, self.r, self.w, self.gang, self.pool = ctx, r, w, gang, pool
        self.early, self.late = pods[:-1], pods[-1]
        self.wait, self.give_up = r.randint(*w.pending), r.random() < w.give_up
        self.duration = r.randint(*w.duration)

    def submit(self, t: int) -> None:
        parts = [self.w.gpus_per_pod] * len(self.early)
        req = Request(t, self.pool, parts, self.realize_early, distinct_nodes=False)
        self.ctx.placer.submit(req)
        self.ctx.plan.gangs.append(self.gang)

    def _hold(
        self,
        pod: Pod,
        start: int,
        end: int,
        *,
        devs: list[Device],
        prog: act.Program,
        mem: tuple[float, float],
    ) -> Allocation:
        g = self.gang
        return hold_pod(
            self.ctx,
            pod,
            cluster=g.cluster,
            pattern="k8s_gang",
            cls="batch",
            who=(g.owner, g.team),
            start=start,
            end=end,
            devices=devs,
            programs=[prog] * len(devs),
            mems=[memory(d, self.r, *mem) for d in devs],
        )

    def realize_early(self, start: int, placed: list[list[Device]]) -> None:
        self.gang.partial_from = start
        for pod, devs in zip(self.early, placed, strict=True):
            pod.running_at = start + self.r.randint(10, 60)
            # at the barrier: a CUDA context and nothing to compute, until told otherwise
            idle = act.constant(start, act.IDLE, act.IDLE)
            self.gang.pods.append(self._hold(pod, start, INF, devs=devs, prog=idle, mem=(0.2, 0.3)))
        at = start + self.wait
        if self.give_up:
            self.ctx.placer.at(at, lambda: self.delete(at))
        else:
            req = Request(
                at,
                self.pool,
                [self.w.gpus_per_pod],
                self.realize_late,
                on_drop=lambda: setattr(self.gang, "pending", [self.late]),
            )
            self.ctx.placer.submit(req)

    def delete(self, at: int) -> None:
        g = self.gang
        g.partial_to, g.gave_up, g.pending = at, True, [self.late]
        self.late.deleted_at, self.late.reason, self.late.end_phase = at, "deleted", "Pending"
        for alloc in g.pods:
            assert alloc.pod is not None
            alloc.pod.deleted_at, alloc.pod.reason, alloc.pod.end_phase = at, "deleted", "Running"
            finish(alloc, at, [h.program for h in alloc.holdings])

    def realize_late(self, start: int, placed: list[list[Device]]) -> None:
        g, r, w = self.gang, self.r, self.w
        g.partial_to = start
        end = start + self.duration
        self.late.running_at = start + r.randint(10, 60)
        programs = act.training(
            r,
            start,
            end,
            busy=w.busy,
            every=w.checkpoint_every,
            checkpoint=w.checkpoint,
            nodes=w.pods,
        )
        last = self._hold(self.late, start, end, devs=placed[0], prog=programs[-1], mem=(0.6, 0.9))
        for alloc, prog in zip(g.pods, programs[:-1], strict=True):
            joined = act.Program()  # idle at the barrier until the last pod arrived, then train
            joined.add(alloc.start, act.IDLE, act.IDLE)
            for s2, level, jitter in zip(prog.starts2, prog.levels, prog.jitters, strict=True):
                joined.add(s2 // 2, level, jitter)
            finish(alloc, end, [joined] * len(alloc.holdings))
        g.pods.append(last)
        for alloc in g.pods:
            assert alloc.pod is not None
            alloc.pod.terminated_at, alloc.pod.reason = end, "completed"
            alloc.pod.deleted_at = end + r.randint(300, 1800)
