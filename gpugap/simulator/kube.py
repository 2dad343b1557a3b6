"""Kubernetes workload patterns, and unattributed use on GPUs nobody holds."""

from __future__ import annotations

import random
import uuid

from gpugap.simulator import activity as act
from gpugap.simulator import scenario
from gpugap.simulator.estate import Device
from gpugap.simulator.patterns import APPS, Ctx, arrivals, attribution, memory, suffix
from gpugap.simulator.plan import INF, Allocation, Holding, Pod, Request

DAY = 86400
Who = tuple[str, str]  # (user, team)


def new_pod(
    cluster: str,
    ns: str,
    name: str,
    *,
    kind: str,
    owner: str,
    gpus: int,
    resource: str,
    container: str = "main",
) -> Pod:
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s/{cluster}/{ns}/{name}"))
    return Pod(uid, ns, name, kind, owner, resource, gpus, container)


def hold_pod(
    ctx: Ctx,
    pod: Pod,
    *,
    cluster: str,
    pattern: str,
    cls: str,
    who: Who,
    start: int,
    end: int,
    devices: list[Device],
    programs: list[act.Program],
    mems: list[float],
) -> Allocation:
    user, team = who
    alloc = Allocation(
        f"k8s/{cluster}/{pod.uid}",
        "kubernetes",
        cluster,
        pattern,
        cls,
        user,
        team,
        pod.name,
        start,
        end,
        pod=pod,
    )
    tag = attribution(pod)
    for d, p, m in zip(devices, programs, mems, strict=True):
        ctx.plan.hold(alloc, d, Holding(d, start, end, p, m, alloc, tag))
    ctx.plan.allocations.append(alloc)
    return alloc


def finish(alloc: Allocation, end: int, programs: list[act.Program]) -> None:
    """Settle an allocation placed with an open end (a gang waiting for its last pod)."""
    alloc.end = end
    for h, p in zip(alloc.holdings, programs, strict=True):
        h.end, h.program = end, p
        h.device.free_at = end


def k8s_inference(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.K8sInference) -> None:
    """Deployments sized for peak: every replica holds its GPU all day, demand follows the
    clock (running since days before the window; they do not end in it)."""
    pool = ctx.pool(cluster, w.group)
    origin = ctx.sc.scenario.start
    for i, t in enumerate(arrivals(ctx, rng, w, (-7 * DAY, -DAY))):
        app = ctx.unique(APPS[i % len(APPS)])
        who = ctx.owner(rng, w.teams)
        peak, trough = rng.uniform(*w.peak), rng.uniform(*w.trough)
        mem = rng.uniform(0.7, 0.9)  # the model's weights: resident whether busy or not
        replicaset = suffix(rng, 10)
        for r in range(rng.randint(*w.replicas)):
            name = f"{app}-{replicaset}-{suffix(rng)}"
            pod = new_pod(
                cluster,
                w.namespace,
                name,
                kind="Deployment",
                owner=app,
                gpus=w.gpus,
                resource="nvidia.com/gpu",
                container="server",
            )

            def realize(
                start: int,
                placed: list[list[Device]],
                *,
                pod: Pod = pod,
                who: Who = who,
                curve: tuple[float, float] = (peak, trough),
                pull: int = rng.randint(20, 120),
                mem: float = mem,
            ) -> None:
                pod.running_at = start + pull
                prog = act.diurnal(
                    start,
                    ctx.plan.horizon,
                    origin,
                    peak=curve[0],
                    trough=curve[1],
                    peak_hour=w.peak_hour,
                )
                devs = placed[0]
                hold_pod(
                    ctx,
                    pod,
                    cluster=cluster,
                    pattern="k8s_inference",
                    cls="service",
                    who=who,
                    start=start,
                    end=INF,
                    devices=devs,
                    programs=[prog] * len(devs),
                    mems=[float(int(d.memory_mib * mem)) for d in devs],
                )

            ctx.placer.submit(Request(t + 7 * r, pool, [w.gpus], realize))


def k8s_notebook(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.K8sNotebook) -> None:
    """Notebooks hold a GPU (or a MIG slice) for hours and compute for minutes; the user
    stops them by deleting the pod."""
    pool = ctx.pool(cluster, w.group, mig=w.mig)
    resource = "nvidia.com/gpu"
    if w.mig:  # one profile per request: the first MIG group's
        profile = pool[0].devices[0].mig_profile
        pool = [n for n in pool if n.devices[0].mig_profile == profile]
        resource = f"nvidia.com/mig-{profile}"
    for t in arrivals(ctx, rng, w, (-4 * 3600, ctx.sc.scenario.duration - 3600)):
        who = ctx.owner(rng, w.teams)
        name = ctx.unique(f"jupyter-{who[0]}")
        pod = new_pod(
            cluster,
            w.namespace,
            name,
            kind="Notebook",
            owner=name,
            gpus=1,
            resource=resource,
            container="notebook",
        )

        hold, nrng = rng.randint(*w.hold), random.Random(rng.random())

        def realize(
            start: int,
            placed: list[list[Device]],
            *,
            pod: Pod = pod,
            who: Who = who,
            hold: int = hold,
            r: random.Random = nrng,
        ) -> None:
            end = start + hold
            pod.running_at = start + r.randint(10, 60)
            pod.deleted_at, pod.reason, pod.end_phase = end, "deleted", "Running"
            prog = act.bursty(r, start, end, bursts=w.bursts, burst=w.burst, busy=w.busy)
            d = placed[0][0]
            hold_pod(
                ctx,
                pod,
                cluster=cluster,
                pattern="k8s_notebook",
                cls="interactive",
                who=who,
                start=start,
                end=end,
                devices=[d],
                programs=[prog],
                mems=[memory(d, r, 0.05, 0.4)],
            )

        ctx.placer.submit(Request(t, pool, [1], realize))


def k8s_job(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.K8sJob) -> None:
    """Batch Jobs: run, succeed or fail, and are garbage-collected after a TTL."""
    pool = ctx.pool(cluster, w.group)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        who = ctx.owner(rng, w.teams)
        job = ctx.unique(f"{who[1]}-batch-{i:03d}")
        gpus = rng.choice(w.gpus)
        pod = new_pod(
            cluster,
            w.namespace,
            f"{job}-{suffix(rng)}",
            kind="Job",
            owner=job,
            gpus=gpus,
            resource="nvidia.com/gpu",
        )

        jrng = random.Random(rng.random())

        def realize(
            start: int,
            placed: list[list[Device]],
            *,
            pod: Pod = pod,
            who: Who = who,
            r: random.Random = jrng,
        ) -> None:
            planned = r.randint(*w.duration)
            failed = r.random() < w.failure_rate
            end = start + (max(60, int(planned * r.uniform(0.05, 0.7))) if failed else planned)
            pod.running_at = start + r.randint(10, 90)
            pod.terminated_at, pod.deleted_at = end, end + r.randint(*w.ttl)
            pod.reason, pod.end_phase = (
                ("failed", "Failed") if failed else ("completed", "Succeeded")
            )
            devs = placed[0]
            hold_pod(
                ctx,
                pod,
                cluster=cluster,
                pattern="k8s_job",
                cls="batch",
                who=who,
                start=start,
                end=end,
                devices=devs,
                programs=[act.busy(r, start, w.busy)] * len(devs),
                mems=[memory(d, r) for d in devs],
            )

        ctx.placer.submit(Request(t, pool, [gpus], realize))


def k8s_sweep(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.K8sSweep) -> None:
    """Hyperparameter sweeps: trial Jobs, ``parallel`` at a time, some stopped early."""
    pool = ctx.pool(cluster, w.group)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        who = ctx.owner(rng, w.teams)
        exp = ctx.unique(f"{who[1]}-hpo-{i:03d}")
        queue = list(range(rng.randint(*w.trials)))
        r = random.Random(rng.random())

        def launch(
            at: int,
            *,
            exp: str = exp,
            queue: list[int] = queue,
            who: Who = who,
            r: random.Random = r,
        ) -> None:
            if not queue:
                return
            trial = f"{exp}-trial-{queue.pop(0):02d}"
            pod = new_pod(
                cluster,
                w.namespace,
                f"{trial}-{suffix(r)}",
                kind="Job",
                owner=trial,
                gpus=w.gpus,
                resource="nvidia.com/gpu",
            )

            def realize(start: int, placed: list[list[Device]]) -> None:
                planned = r.randint(*w.duration)
                if r.random() < 0.3:  # early-stopped: a bad trial
                    planned = max(120, planned // 4)
                end = start + planned
                pod.running_at = start + r.randint(10, 60)
                pod.terminated_at, pod.deleted_at = end, end + r.randint(300, 900)
                pod.reason = "completed"
                devs = placed[0]
                hold_pod(
                    ctx,
                    pod,
                    cluster=cluster,
                    pattern="k8s_sweep",
                    cls="batch",
                    who=who,
                    start=start,
                    end=end,
                    devices=devs,
                    programs=[act.busy(r, start, w.busy)] * len(devs),
                    mems=[memory(d, r) for d in devs],
                )
                ctx.placer.at(end, lambda: launch(end))  # the next trial takes its place

            ctx.placer.submit(Request(at, pool, [w.gpus], realize))

        for _ in range(w.parallel):
            launch(t)


def unattributed(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.Unattributed) -> None:
    """Something using a GPU that no allocation holds (outside the scheduler, or an event we
    never saw): only ever on spare nodes, so it never overlaps an allocation."""
    pool = ctx.pool(cluster, w.group, spare=True)
    for t in arrivals(ctx, rng, w):

        def realize(
            start: int,
            placed: list[list[Device]],
            *,
            length: int = rng.randint(*w.duration),
            level: int = act.milli(rng.uniform(*w.level)),
        ) -> None:
            d = placed[0][0]
            prog = act.constant(start, level, 30)
            ctx.plan.hold(
                None, d, Holding(d, start, start + length, prog, d.memory_mib // 10, None)
            )

        ctx.placer.submit(Request(t, pool, [1], realize))
