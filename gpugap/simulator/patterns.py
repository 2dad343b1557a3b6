"""Workload patterns: each turns one scenario entry into requests for the placer and, once
placed, into allocations with an activity program per GPU (see activity.py)."""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from gpugap.simulator import activity as act
from gpugap.simulator import scenario
from gpugap.simulator.estate import Device, Estate, Node
from gpugap.simulator.plan import Allocation, Holding, Placer, Plan, Pod, Request, SlurmJob

_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
APPS = ["llm-chat", "embed", "rerank", "asr", "vision-api", "summarize", "code-assist", "ocr"]


@dataclass
class Ctx:
    sc: scenario.Scenario
    estate: Estate
    plan: Plan
    placer: Placer
    next_job: dict[str, int] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    groups: dict[tuple[str, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.groups = {(n.cluster, n.name): n.group for n in self.estate.nodes}

    def job_id(self, cluster: str) -> int:
        n = self.next_job.get(cluster, 1000)
        self.next_job[cluster] = n + 1
        return n

    def pool(
        self, cluster: str, group: str | None, *, mig: bool = False, spare: bool = False
    ) -> list[Node]:
        return [
            n
            for (c, g), nodes in self.estate.by_group.items()
            if c == cluster and (group is None or g == group)
            for n in nodes
            if n.spare == spare and (n.devices[0].is_mig == mig or spare)
        ]

    def owner(self, rng: random.Random, teams: list[str] | None) -> tuple[str, str]:
        team = rng.choice(teams or sorted(self.sc.teams))
        return rng.choice(self.sc.teams[team]), team

    def unique(self, name: str) -> str:
        base, n = name, 1
        while name in self.names:
            n += 1
            name = f"{base}-{n}"
        self.names.add(name)
        return name


def arrivals(
    ctx: Ctx, rng: random.Random, w: scenario.Workload, default: tuple[int, int] | None = None
) -> list[int]:
    """When each instance wants to start (relative seconds), earliest first."""
    lo, hi = w.start_within or default or (0, ctx.sc.scenario.duration)
    return sorted(rng.randint(lo, max(lo, hi - 1)) for _ in range(w.count))


def memory(d: Device, rng: random.Random, lo: float = 0.3, hi: float = 0.95) -> float:
    return float(int(d.memory_mib * rng.uniform(lo, hi)))


def attribution(pod: Pod) -> bytes:
    return (
        f',"attribution":{{"pod":"{pod.name}","namespace":"{pod.namespace}",'
        f'"container":"{pod.container}"}}'
    ).encode()


def suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(_SUFFIX) for _ in range(n))


# --- Slurm ---------------------------------------------------------------------------------


def outcome(
    rng: random.Random, w: scenario.Padded, planned: int
) -> tuple[str, int, int, int | None]:
    """(state, elapsed, time limit, exit code): limits are padded, some jobs fail early."""
    states = sorted(w.states)
    state = rng.choices(states, [w.states[s] for s in states])[0]
    limit = max(900, -(-int(planned * rng.uniform(*w.limit_factor)) // 900) * 900)
    if state == "FAILED":
        return state, max(60, int(planned * rng.uniform(0.02, 0.6))), limit, 1
    if state == "CANCELLED":
        return state, max(60, int(planned * rng.uniform(0.1, 0.9))), limit, None
    if state == "TIMEOUT":  # it would have needed longer than it asked for
        limit = max(900, int(planned * rng.uniform(0.5, 0.9)) // 900 * 900)
        return state, limit, limit, 0
    return state, planned, limit, 0


Programs = Callable[[int, int, list[list[Device]]], list[list[act.Program]]]


def slurm_job(
    ctx: Ctx,
    rng: random.Random,
    w: scenario.Padded,
    *,
    cluster: str,
    arrive: int,
    pool: list[Node],
    parts: list[int],
    programs: Programs,
    pattern: str,
    name: str,
    interactive: bool = False,
    array: tuple[list[int], int] | None = None,
) -> None:
    """One Slurm job: its outcome is decided at submission, its GPUs when it starts."""
    planned = rng.randint(*w.duration)
    state, elapsed, limit, exit_code = outcome(rng, w, planned)
    user, team = ctx.owner(rng, w.teams)
    mem_lo = rng.uniform(0.3, 0.8)

    def realize(start: int, placed: list[list[Device]]) -> None:
        end = start + elapsed
        if array is None:
            job_id = str(ctx.job_id(cluster))
            array_ids: tuple[int | None, int | None] = (None, None)
        else:
            if not array[0]:
                array[0].append(ctx.job_id(cluster))
            job_id = f"{array[0][0]}_{array[1]}"
            array_ids = (array[0][0], array[1])
        job = SlurmJob(
            job_id,
            partition=ctx.groups[cluster, placed[0][0].node],
            qos="interactive" if interactive else "normal",
            job_name=name,
            limit_s=limit,
            submit=min(arrive, start) - rng.randint(5, 600),
            state=state,
            exit_code=exit_code,
            interactive=interactive,
            array_job_id=array_ids[0],
            array_task_id=array_ids[1],
        )
        alloc = Allocation(
            f"slurm/{cluster}/{job_id}",
            "slurm",
            cluster,
            pattern,
            "interactive" if interactive else "batch",
            user,
            team,
            name,
            start,
            end,
            job=job,
        )
        for devs, progs in zip(placed, programs(start, end, placed), strict=True):
            for d, p in zip(devs, progs, strict=True):
                mem = 0.0 if p.levels == [0] else memory(d, rng, mem_lo, mem_lo + 0.15)
                ctx.plan.hold(alloc, d, Holding(d, start, end, p, mem, alloc))
        ctx.plan.allocations.append(alloc)

    ctx.placer.submit(Request(arrive, pool, parts, realize))


def node_size(pool: list[Node]) -> int:
    return max(len(n.devices) for n in pool) if pool else 1


def slurm_training(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.SlurmTraining) -> None:
    pool = ctx.pool(cluster, w.group)
    per = w.gpus_per_node or node_size(pool)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        nodes = rng.randint(*w.nodes)
        jrng = random.Random(rng.random())

        def programs(
            start: int, end: int, placed: list[list[Device]], *, r: random.Random = jrng
        ) -> list[list[act.Program]]:
            per_node = act.training(
                r,
                start,
                end,
                busy=w.busy,
                every=w.checkpoint_every,
                checkpoint=w.checkpoint,
                nodes=len(placed),
                straggler_rate=w.straggler_rate,
                barrier=w.barrier,
            )
            return [[p] * len(devs) for p, devs in zip(per_node, placed, strict=True)]

        slurm_job(
            ctx,
            jrng,
            w,
            cluster=cluster,
            arrive=t,
            pool=pool,
            parts=[per] * nodes,
            programs=programs,
            pattern="slurm_training",
            name=f"train-{i:03d}",
        )


def slurm_batch(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.SlurmBatch) -> None:
    pool = ctx.pool(cluster, w.group)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        gpus = rng.choice(w.gpus)
        used = min(w.use or gpus, gpus)
        jrng = random.Random(rng.random())

        def programs(
            start: int,
            end: int,
            placed: list[list[Device]],
            *,
            r: random.Random = jrng,
            used: int = used,
        ) -> list[list[act.Program]]:
            busy = act.busy(r, start, w.busy)
            return [[busy if k < used else act.constant(start, 0) for k in range(len(placed[0]))]]

        name = f"{'big' if w.use else 'job'}-{i:03d}"
        slurm_job(
            ctx,
            jrng,
            w,
            cluster=cluster,
            arrive=t,
            pool=pool,
            parts=[gpus],
            programs=programs,
            pattern="slurm_overrequest" if used < gpus else "slurm_batch",
            name=name,
        )


def slurm_interactive(
    ctx: Ctx, rng: random.Random, cluster: str, w: scenario.SlurmInteractive
) -> None:
    pool = ctx.pool(cluster, w.group)
    for t in arrivals(ctx, rng, w):
        jrng = random.Random(rng.random())

        def programs(
            start: int, end: int, placed: list[list[Device]], *, r: random.Random = jrng
        ) -> list[list[act.Program]]:
            p = act.bursty(r, start, end, bursts=w.bursts, burst=w.burst, busy=w.busy)
            return [[p] * len(placed[0])]

        slurm_job(
            ctx,
            jrng,
            w,
            cluster=cluster,
            arrive=t,
            pool=pool,
            parts=[rng.choice(w.gpus)],
            programs=programs,
            pattern="slurm_interactive",
            name="interactive",
            interactive=True,
        )


def slurm_array(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.SlurmArray) -> None:
    pool = ctx.pool(cluster, w.group)
    for i, t in enumerate(arrivals(ctx, rng, w)):
        shared: list[int] = []
        at = t
        for task in range(rng.randint(*w.tasks)):
            jrng = random.Random(rng.random())

            def programs(
                start: int, end: int, placed: list[list[Device]], r: random.Random = jrng
            ) -> list[list[act.Program]]:
                return [[act.busy(r, start, w.busy)] * len(placed[0])]

            slurm_job(
                ctx,
                jrng,
                w,
                cluster=cluster,
                arrive=at,
                pool=pool,
                parts=[w.gpus],
                programs=programs,
                pattern="slurm_array",
                name=f"sweep-{i:03d}",
                array=(shared, task),
            )
            at += rng.randint(*w.stagger)


# --- CPU-only work on GPU nodes --------------------------------------------------------------


def cpu_only(ctx: Ctx, rng: random.Random, cluster: str, w: scenario.CpuOnly) -> None:
    """Jobs (Slurm) or pods (Kubernetes) that hold CPUs and memory of a GPU node and no GPU:
    seen only in the nodes' capacity polls (no GPU, so no scheduler events are emitted)."""
    pool = ctx.pool(cluster, w.group)
    slurm = ctx.estate.clusters[cluster].scheduler == "slurm"
    for i, t in enumerate(arrivals(ctx, rng, w)):
        user, team = ctx.owner(rng, w.teams)
        cpus = Fraction(round(rng.uniform(*w.cpus) * 1000), 1000)
        mem = Fraction(round(rng.uniform(*w.memory_gib) * 1024))
        length = rng.randint(*w.duration)
        if slurm:
            n = ctx.next_job.get(f"{cluster}/cpu", 900000)
            ctx.next_job[f"{cluster}/cpu"] = n + 1
            ident, name = f"slurm/{cluster}/{n}", f"cpu-{i:03d}"
        else:
            name = f"{team}-cpu-{i:03d}-{suffix(rng)}"
            uid = uuid.uuid5(uuid.NAMESPACE_URL, f"k8s/{cluster}/cpu/{name}")
            ident = f"k8s/{cluster}/{uid}"

        req = Request(t, pool, [0], _noop, cpu_only=(cpus, mem))
        req.realize = functools.partial(
            _cpu_job, ctx, req, cluster=cluster, ident=ident, who=(user, team), name=name,
            length=length, slurm=slurm,
        )  # fmt: skip
        ctx.placer.submit(req)


def _noop(_start: int, _placed: list[list[Device]]) -> None:
    return None


def _cpu_job(
    ctx: Ctx,
    req: Request,
    start: int,
    _placed: list[list[Device]],
    *,
    cluster: str,
    ident: str,
    who: tuple[str, str],
    name: str,
    length: int,
    slurm: bool,
) -> None:
    [node] = req.nodes
    sched = "slurm" if slurm else "kubernetes"
    a = Allocation(ident, sched, cluster, "cpu_only", "batch", *who, name, start, start + length)
    assert req.cpu_only is not None
    a.cpus[node.name], a.memory_mib[node.name] = req.cpu_only
    node.cpu_only.append(a)
    node.uneven = True
    ctx.plan.cpu_only.append(a)
