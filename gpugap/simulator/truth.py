"""The exact answer, computed from the model (holdings and activity programs), never from the
emitted events: a consumer that reads the events and gets these numbers is right.

Everything is restricted to the window ``[start, start + duration)``. GPU-seconds consumed
are integrated from the same slot values the samples carry (activity is constant on each
node's sample grid), in integers (thousandths x seconds), so they are exact. Idle: a whole
UTC minute wholly inside an allocation whose time-weighted activity is below the threshold;
an idle episode is a run of at least ``idle_minutes`` such minutes on a GPU, and overlapping
or adjacent runs on GPUs of the same allocation are one episode.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from gpugap.simulator import scenario as S
from gpugap.simulator.activity import milli, value
from gpugap.simulator.plan import INF, Allocation, Holding, Plan
from schemas.types import format_utc


def integrate(h: Holding, window: int, minutes: list[int] | None = None, m0: int = 0) -> int:
    """Consumed thousandth-GPU-seconds of ``h`` inside the window; optionally add each slot's
    share to the per-minute sums ``minutes`` (minute ``m0`` first)."""
    d = h.device
    node_interval = d.interval
    off = d.offset
    lo = max(h.start + node_interval, 1)  # first T whose slot lies inside and after 0
    k = -(-(lo - off) // node_interval)
    t = off + k * node_interval
    stop = min(h.end, window + node_interval)  # slots wholly inside: T < end; in window: T-Δ < W
    total = 0
    prog, base, q = h.program, d.noise_base, d.quantum
    while t < stop:
        a = value(prog, base, q, t, node_interval)
        if a:
            total += a * (min(t, window) - max(t - node_interval, 0))
            if minutes is not None:
                s0 = t - node_interval
                m = s0 // 60
                while m * 60 < t:
                    i = m - m0
                    if 0 <= i < len(minutes):
                        minutes[i] += a * (min(t, m * 60 + 60) - max(s0, m * 60))
                    m += 1
        t += node_interval
    return total


def compute(sc: S.Scenario, plan: Plan, window: int) -> dict[str, Any]:
    meta = sc.scenario
    origin = meta.start
    threshold = milli(meta.idle_threshold) * 60  # thousandths x seconds in one minute
    at = _clock(origin)
    devices = plan.estate.devices()
    cap: dict[str, int] = defaultdict(int)
    for d in devices:
        cap[d.cluster] += window
    allocations, episodes = [], []
    dims = ("workload_class", "scheduler", "team", "cluster", "pattern")
    agg: dict[str, dict[str, list[int]]] = {k: defaultdict(lambda: [0, 0, 0]) for k in dims}
    held_devices: set[str] = set()
    for a in plan.allocations:
        s, e = max(a.start, 0), min(a.end, window)
        if e <= s:
            continue
        allocated = (e - s) * len(a.holdings)
        consumed, runs = 0, []
        m0, m1 = -(-s // 60), e // 60
        for h in a.holdings:
            held_devices.add(h.device.uuid)
            minutes = [0] * max(0, m1 - m0)
            consumed += integrate(h, window, minutes, m0)
            runs += _idle_runs(minutes, m0, threshold, meta.idle_minutes, h.device.uuid)
        eps = _episodes(a, runs, at)
        episodes += eps
        for dim in dims:
            sums = agg[dim][getattr(a, dim)]
            sums[0] += allocated * 1000
            sums[1] += consumed
            sums[2] += 1
        row = _allocation(a, at, window)
        row.update(
            allocated_gpu_s=float(allocated),
            consumed_gpu_s=consumed / 1000,
            idle_gpu_s=sum(ep["idle_gpu_s"] for ep in eps),
        )
        allocations.append(row)
    unattributed: list[dict[str, Any]] = []
    unattributed_by_cluster: dict[str, int] = defaultdict(int)
    for h in plan.unattributed:
        c = integrate(h, window)
        if c:
            d = h.device
            unattributed_by_cluster[d.cluster] += c
            unattributed.append(
                {
                    "cluster": d.cluster,
                    "node": d.node,
                    "gpu_uuid": d.uuid,
                    "start": at(max(h.start, 0)),
                    "end": at(min(h.end, window)),
                    "consumed_gpu_s": c / 1000,
                }
            )
    by_cluster = _rollup(agg["cluster"])
    for cluster, totals in by_cluster.items():
        totals["capacity_gpu_s"] = cap[cluster]
        totals["unallocated_gpu_s"] = cap[cluster] - totals["allocated_gpu_s"]
        totals["unattributed_consumed_gpu_s"] = unattributed_by_cluster[cluster] / 1000
    allocated_total = sum(r[0] for r in agg["cluster"].values()) / 1000
    consumed_total = sum(r[1] for r in agg["cluster"].values()) / 1000
    padding = _padding(plan, window)
    return {
        "scenario": meta.name,
        "seed": meta.seed,
        "window": {"start": at(0), "end": at(window), "duration_s": window},
        "idle": {"threshold": meta.idle_threshold, "minutes": meta.idle_minutes},
        "estate": {
            "clusters": {c.name: c.scheduler for c in sc.clusters},
            "nodes": len(plan.estate.nodes),
            "devices": len(devices),
            "mig_devices": sum(d.is_mig for d in devices),
            "never_held": sorted(d.uuid for d in devices if d.uuid not in held_devices),
            "requests_never_started": plan.never_started,
        },
        "totals": {
            "capacity_gpu_s": sum(cap.values()),
            "allocated_gpu_s": allocated_total,
            "consumed_gpu_s": consumed_total,
            "gap_gpu_s": allocated_total - consumed_total,
            "unallocated_gpu_s": sum(cap.values()) - allocated_total,
            "unattributed_consumed_gpu_s": sum(unattributed_by_cluster.values()) / 1000,
        },
        "by_class": _rollup(agg["workload_class"]),
        "by_scheduler": _rollup(agg["scheduler"]),
        "by_team": _rollup(agg["team"]),
        "by_cluster": by_cluster,
        "by_pattern": _rollup(agg["pattern"]),
        "allocations": allocations,
        "idle_episodes": episodes,
        "partial_gangs": _gangs(plan, window, at),
        "time_limit_padding": padding,
        "unattributed": unattributed,
    }


def _clock(origin: datetime) -> Any:
    return lambda t: format_utc(origin + timedelta(seconds=t))


def _rollup(rows: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    return {
        k: {
            "allocated_gpu_s": v[0] / 1000,
            "consumed_gpu_s": v[1] / 1000,
            "gap_gpu_s": (v[0] - v[1]) / 1000,
            "allocations": v[2],
        }
        for k, v in sorted(rows.items())
    }


def _idle_runs(
    minutes: list[int], m0: int, threshold: int, need: int, gpu: str
) -> list[tuple[int, int, str]]:
    runs, first = [], None
    for i, total in enumerate([*minutes, threshold]):  # a sentinel closes the last run
        if total < threshold and i < len(minutes):
            first = i if first is None else first
        elif first is not None:
            if i - first >= need:
                runs.append(((m0 + first) * 60, (m0 + i) * 60, gpu))
            first = None
    return runs


def _episodes(a: Allocation, runs: list[tuple[int, int, str]], at: Any) -> list[dict[str, Any]]:
    merged: list[list[Any]] = []
    for start, end, gpu in sorted(runs):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            last[2].add(gpu)
            last[3] += end - start
        else:
            merged.append([start, end, {gpu}, end - start])
    return [
        {
            "allocation_id": a.id,
            "scheduler": a.scheduler,
            "cluster": a.cluster,
            "workload_class": a.workload_class,
            "pattern": a.pattern,
            "owner": a.owner,
            "team": a.team,
            "start": at(s),
            "end": at(e),
            "minutes": (e - s) // 60,
            "gpus": sorted(g),
            "idle_gpu_s": float(idle),
        }
        for s, e, g, idle in merged
    ]


def _allocation(a: Allocation, at: Any, window: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": a.id,
        "scheduler": a.scheduler,
        "cluster": a.cluster,
        "pattern": a.pattern,
        "workload_class": a.workload_class,
        "owner": a.owner,
        "team": a.team,
        "name": a.name,
        "start": at(a.start),
        "end": at(a.end) if a.end < window else None,
        "gpus": len(a.holdings),
        "gpu_uuids": [h.device.uuid for h in a.holdings],
        "nodes": sorted({h.device.node for h in a.holdings}),
    }
    if a.job is not None:
        row.update(
            job_id=a.job.job_id,
            state=a.job.state if a.end < window else "RUNNING",
            time_limit_s=a.job.limit_s,
            interactive=a.job.interactive,
        )
    if a.pod is not None:
        row.update(
            namespace=a.pod.namespace,
            pod=a.pod.name,
            uid=a.pod.uid,
            owner_kind=a.pod.owner_kind,
            gang_id=a.pod.gang_id,
            gpu_resource=a.pod.gpu_resource,
        )
    return row


def _gangs(plan: Plan, window: int, at: Any) -> list[dict[str, Any]]:
    out = []
    for g in plan.gangs:
        s, e = max(g.partial_from, 0), min(g.partial_to, window)
        if not g.pods or e <= s:
            continue
        early = [p for p in g.pods if p.start <= g.partial_from]
        gpus = [h.device.uuid for p in early for h in p.holdings]
        outcome = "ongoing" if g.partial_to >= window else "deleted" if g.gave_up else "all_bound"
        out.append(
            {
                "gang_id": g.id,
                "cluster": g.cluster,
                "namespace": g.namespace,
                "owner": g.owner,
                "team": g.team,
                "gang_size": g.size,
                "running_pods": len(early),
                "pending_pods": g.size - len(early),
                "start": at(s),
                "end": at(e) if g.partial_to < window else None,
                "outcome": outcome,
                "gpus": gpus,
                "held_gpu_s": float((e - s) * len(gpus)),
            }
        )
    return out


def _padding(plan: Plan, window: int) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    for a in plan.allocations:
        if a.job is None or a.end >= window or a.end == INF:
            continue
        elapsed = a.end - a.start
        jobs.append(
            {
                "allocation_id": a.id,
                "job_id": a.job.job_id,
                "user": a.owner,
                "account": a.team,
                "state": a.job.state,
                "pattern": a.pattern,
                "gpus": len(a.holdings),
                "time_limit_s": a.job.limit_s,
                "elapsed_s": elapsed,
                "ratio": round(a.job.limit_s / elapsed, 4),
                "padding_gpu_s": float(max(0, a.job.limit_s - elapsed) * len(a.holdings)),
            }
        )
    ratios: list[float] = [j["ratio"] for j in jobs]
    return {"median_ratio": statistics.median(ratios) if ratios else None, "jobs": jobs}
