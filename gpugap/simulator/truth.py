"""The exact answer, computed from the model (holdings and activity programs), never from the
emitted events: a consumer that reads the events and gets these numbers is right.

Everything is restricted to the window ``[start, start + duration)``. GPU-seconds consumed
are integrated from the same slot values the samples carry (activity is constant on each
node's sample grid), in integers (thousandths x seconds), so they are exact. Idle: a whole
UTC minute wholly inside an allocation, with at least one measured second, whose activity
time-weighted over its measured seconds is below the threshold; an idle episode is a run of at
least ``idle_minutes`` such minutes on a GPU, and overlapping or adjacent runs on GPUs of the
same allocation are one episode.

Lost samples (``faults.sample_loss_rate``, loss.py: the same function the emitter drops them
by): a sample covers ``(T - interval, T]``; a lost one leaves those seconds *unmeasured*
(DESIGN.md "Coverage is by the second"). They consume nothing, are neither idle nor busy (a
minute with no measured second breaks an idle run), and each allocation and rollup says how
many of its held GPU-seconds were unmeasured (``unmeasured_gpu_s``). Without losses every
held second is measured: the first sample of a node covers 0, and it samples past the end.

GPU-seconds are GPU-equivalents (docs/architecture.md): a MIG slice counts its share of its
physical GPU (``schemas.shares.mig_share``: 1g.10gb of an A100 = 1/7), in its allocated,
consumed, idle and unattributed seconds; a partitioned GPU's capacity is one GPU, so the share
no slice covers is unallocated capacity. Shares stay exact: each device's share is an integer
weight over a common denominator (``Shares.scale``: 7 for A100/H100 slices, at most 28 = lcm(7,
4) with A30 ones), and every sum is an integer of thousandths x seconds x weight, divided once
at the end. Device-level figures (``estate.devices``, ``totals.allocated_device_s``) count a
slice as a device, unscaled. Time-limit padding stays GPUs x unused limit (requested GPUs, as
Slurm's)."""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from gpugap.schemas.shares import mig_share, slices_of
from gpugap.schemas.types import format_utc
from gpugap.simulator import scenario, truth_stranded
from gpugap.simulator.activity import milli, value
from gpugap.simulator.estate import Device
from gpugap.simulator.loss import lost_samples
from gpugap.simulator.plan import INF, Allocation, Holding, Plan


def share_of(d: Device) -> Fraction:
    """A device's part of its physical GPU, exactly, as the stream counts it: 1 for a whole
    GPU; a MIG slice's compute slices over its model's (an unknown profile: 1, as the stream's
    ``mig_share_unknown``)."""
    if not d.is_mig:
        return Fraction(1)
    share = mig_share(d.mig_profile, d.model)
    if share is None:
        return Fraction(1)
    total = slices_of(d.model)  # mig_share is compute / total: recover it without float error
    return Fraction(round(share * total), total)


class Shares:
    """Every device's share as an integer weight over one denominator, ``scale`` (the lcm of
    the shares' denominators: 1 without MIG, 7 with A100/H100 slices, at most 28 with A30s)."""

    def __init__(self, devices: Iterable[Device]) -> None:
        shares = {d.uuid: share_of(d) for d in devices}
        self.scale = math.lcm(1, *(f.denominator for f in shares.values()))
        self.weight = {u: int(f * self.scale) for u, f in shares.items()}

    def __getitem__(self, d: Device) -> int:
        return self.weight[d.uuid]

    def capacity(self, devices: Iterable[Device]) -> dict[str, int]:
        """Weight per cluster of its physical GPUs: a partitioned GPU counts once (its slices'
        shares and the part no slice covers); one whose slices add up to more than one GPU
        (unknown profiles count a whole GPU each) counts what they add up to, as the stream."""
        physical: dict[tuple[str, str], int] = defaultdict(int)
        for d in devices:
            physical[d.cluster, d.parent_uuid or d.uuid] += self[d]
        out: dict[str, int] = defaultdict(int)
        for (cluster, _), w in physical.items():
            out[cluster] += max(w, self.scale)
        return out


def integrate(
    h: Holding,
    window: int,
    minutes: list[int] | None = None,
    m0: int = 0,
    lost: Collection[int] = (),
) -> int:
    """Consumed thousandth-GPU-seconds of ``h`` inside the window; optionally add each slot's
    share to the per-minute sums ``minutes`` (minute ``m0`` first). The slots of ``lost``
    samples (times of the device's node) are unmeasured: they consume nothing."""
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
        a = value(prog, base, q, t, node_interval) if t not in lost else 0
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


def unmeasured(
    s: int,
    e: int,
    interval: int,
    lost: list[int],
    *,
    measured: list[int] | None = None,
    m0: int = 0,
) -> int:
    """Seconds of ``[s, e)`` that the ``lost`` samples (sorted times on a grid of ``interval``)
    would have covered; optionally take them off the per-minute measured seconds ``measured``
    (minute ``m0`` first). A slot ``(T - interval, T]`` meets ``[s, e)`` when ``s < T`` and
    ``T - interval < e``."""
    total = 0
    for t in lost[bisect_left(lost, s + 1) : bisect_left(lost, e + interval)]:
        lo, hi = max(t - interval, s), min(t, e)
        total += hi - lo
        if measured is not None:
            m = lo // 60
            while m * 60 < hi:
                i = m - m0
                if 0 <= i < len(measured):
                    measured[i] -= min(hi, m * 60 + 60) - max(lo, m * 60)
                m += 1
    return total


class Lost:
    """The samples the emitter never sends (loss.py), per (cluster, node): as sets, to skip
    their slots, and sorted, to find those that meet a span."""

    def __init__(self, sc: scenario.Scenario, plan: Plan, window: int) -> None:
        seed, rate = sc.scenario.seed, sc.faults.sample_loss_rate
        self.at = {
            (n.cluster, n.name): lost_samples(seed, rate, n, window) for n in plan.estate.nodes
        }
        self.sorted = {k: sorted(v) for k, v in self.at.items()}


def _use(
    a: Allocation, window: int, shares: Shares, lost: Lost, meta: scenario.Meta
) -> tuple[int, int, list[tuple[int, int, str, int]]]:
    """What the GPUs of ``a`` consumed and how much of their time is unmeasured (thousandths x
    seconds x weight), and their idle runs."""
    s, e = max(a.start, 0), min(a.end, window)
    threshold = milli(meta.idle_threshold)  # thousandths, per measured second
    consumed, missed, runs = 0, 0, []
    m0, m1 = -(-s // 60), e // 60
    for h in a.holdings:
        d = h.device
        node = d.cluster, d.node
        minutes = [0] * max(0, m1 - m0)  # consumed, thousandths x seconds
        measured = [60] * len(minutes)  # seconds some sent sample covers
        w = shares[d]
        consumed += integrate(h, window, minutes, m0, lost.at[node]) * w
        hs, he = max(h.start, 0), min(h.end, window)
        gone = unmeasured(hs, he, d.interval, lost.sorted[node], measured=measured, m0=m0)
        missed += gone * w * 1000
        runs += _idle_runs(
            minutes, measured, m0, threshold=threshold, need=meta.idle_minutes, gpu=d.uuid, weight=w
        )
    return consumed, missed, runs


def compute(sc: scenario.Scenario, plan: Plan, window: int) -> dict[str, Any]:
    meta = sc.scenario
    origin = meta.start
    at = _clock(origin)
    devices = plan.estate.devices()
    shares = Shares(devices)
    unit = 1000 * shares.scale  # sums below are thousandths x seconds x weight
    cap = {c: w * window * 1000 for c, w in shares.capacity(devices).items()}
    allocations, episodes = [], []
    dims = ("workload_class", "scheduler", "team", "cluster", "pattern")
    # per dimension value: allocated, consumed, allocations, unmeasured
    agg: dict[str, dict[str, list[int]]] = {k: defaultdict(lambda: [0, 0, 0, 0]) for k in dims}
    lost = Lost(sc, plan, window)
    held_devices: set[str] = set()
    device_s = 0
    for a in plan.allocations:
        s, e = max(a.start, 0), min(a.end, window)
        if e <= s:
            continue
        allocated = (e - s) * sum(shares[h.device] for h in a.holdings) * 1000
        device_s += (e - s) * len(a.holdings)
        held_devices.update(h.device.uuid for h in a.holdings)
        consumed, missed, runs = _use(a, window, shares, lost, meta)
        eps = _episodes(a, runs, at, shares.scale)
        episodes += eps
        for dim in dims:
            sums = agg[dim][getattr(a, dim)]
            sums[0] += allocated
            sums[1] += consumed
            sums[2] += 1
            sums[3] += missed
        row = _allocation(a, at, window)
        row.update(
            allocated_gpu_s=allocated / unit,
            consumed_gpu_s=consumed / unit,
            unmeasured_gpu_s=missed / unit,
            idle_gpu_s=sum((end - start) * w for start, end, _, w in runs) / shares.scale,
        )
        allocations.append(row)
    unattributed, unattributed_by_cluster = _unattributed(plan, window, at, shares, lost)
    by_cluster = _rollup(agg["cluster"], unit)
    for cluster, totals in by_cluster.items():
        held = agg["cluster"][cluster][0]
        totals["capacity_gpu_s"] = _seconds(cap[cluster], unit)
        totals["unallocated_gpu_s"] = (cap[cluster] - held) / unit
        totals["unattributed_consumed_gpu_s"] = unattributed_by_cluster[cluster] / unit
    capacity = sum(cap.values())
    allocated_sum = sum(r[0] for r in agg["cluster"].values())
    consumed_sum = sum(r[1] for r in agg["cluster"].values())
    unmeasured_sum = sum(r[3] for r in agg["cluster"].values())
    allocated_total, consumed_total = allocated_sum / unit, consumed_sum / unit
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
            "physical_gpus": len({d.parent_uuid or d.uuid for d in devices}),
            "never_held": sorted(d.uuid for d in devices if d.uuid not in held_devices),
            "requests_never_started": plan.never_started,
        },
        "totals": {
            "capacity_gpu_s": _seconds(capacity, unit),
            "allocated_gpu_s": allocated_total,
            "consumed_gpu_s": consumed_total,
            "gap_gpu_s": (allocated_sum - consumed_sum) / unit,
            # held seconds no sent sample covers (lost samples): neither used nor idle
            "unmeasured_gpu_s": unmeasured_sum / unit,
            "unallocated_gpu_s": (capacity - allocated_sum) / unit,
            "unattributed_consumed_gpu_s": sum(unattributed_by_cluster.values()) / unit,
            # device-level: seconds the allocations held devices, a MIG slice one device
            "allocated_device_s": device_s,
        },
        "by_class": _rollup(agg["workload_class"], unit),
        "by_scheduler": _rollup(agg["scheduler"], unit),
        "by_team": _rollup(agg["team"], unit),
        "by_cluster": by_cluster,
        "by_pattern": _rollup(agg["pattern"], unit),
        "allocations": allocations,
        "idle_episodes": episodes,
        "partial_gangs": _gangs(plan, window, at, shares),
        "time_limit_padding": _padding(plan, window),
        "unattributed": unattributed,
        # node capacity polls: allocated, usable, stranded, unavailable (truth_stranded.py)
        "stranded": truth_stranded.compute(sc, plan, window),
    }


def _unattributed(
    plan: Plan, window: int, at: Any, shares: Shares, lost: Lost
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Use on devices nobody holds, each at its share, in the slots of the samples sent; and
    its sums per cluster (thousandths x seconds x weight)."""
    rows: list[dict[str, Any]] = []
    by_cluster: dict[str, int] = defaultdict(int)
    unit = 1000 * shares.scale
    for h in plan.unattributed:
        d = h.device
        c = integrate(h, window, lost=lost.at[d.cluster, d.node]) * shares[d]
        if c:
            by_cluster[d.cluster] += c
            rows.append(
                {
                    "cluster": d.cluster,
                    "node": d.node,
                    "gpu_uuid": d.uuid,
                    "start": at(max(h.start, 0)),
                    "end": at(min(h.end, window)),
                    "consumed_gpu_s": c / unit,
                }
            )
    return rows, by_cluster


def _clock(origin: datetime) -> Any:
    return lambda t: format_utc(origin + timedelta(seconds=t))


def _seconds(scaled: int, unit: int) -> int | float:
    """GPU-seconds from thousandths x seconds x weight: an int when whole (capacity is)."""
    q, r = divmod(scaled, unit)
    return q if r == 0 else scaled / unit


def _rollup(rows: dict[str, list[int]], unit: int) -> dict[str, dict[str, Any]]:
    return {
        k: {
            "allocated_gpu_s": v[0] / unit,
            "consumed_gpu_s": v[1] / unit,
            "gap_gpu_s": (v[0] - v[1]) / unit,
            "unmeasured_gpu_s": v[3] / unit,
            "allocations": v[2],
        }
        for k, v in sorted(rows.items())
    }


def _idle_runs(
    minutes: list[int],
    measured: list[int],
    m0: int,
    *,
    threshold: int,
    need: int,
    gpu: str,
    weight: int,
) -> list[tuple[int, int, str, int]]:
    """Runs of at least ``need`` idle minutes: (start, end, gpu, the device's weight). A
    minute is idle when some of it is measured and its consumption (thousandths x seconds) is
    below ``threshold`` (thousandths) x its measured seconds: activity averaged over the
    seconds measured, as the stream does; a minute with none measured breaks a run. The
    threshold is on the device's own activity (a slice's share scales its activity and its
    seconds alike). An idle minute counts whole in the run's seconds."""
    runs, first = [], None
    for i in range(len(minutes) + 1):  # one past the end closes the last run
        if i < len(minutes) and measured[i] > 0 and minutes[i] < threshold * measured[i]:
            first = i if first is None else first
        elif first is not None:
            if i - first >= need:
                runs.append(((m0 + first) * 60, (m0 + i) * 60, gpu, weight))
            first = None
    return runs


def _episodes(
    a: Allocation, runs: list[tuple[int, int, str, int]], at: Any, scale: int
) -> list[dict[str, Any]]:
    """Overlapping or adjacent runs are one episode; its idle GPU-seconds are its runs'
    seconds, each at its device's share."""
    merged: list[list[Any]] = []
    for start, end, gpu, w in sorted(runs):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            last[2].add(gpu)
            last[3] += (end - start) * w
        else:
            merged.append([start, end, {gpu}, (end - start) * w])
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
            "idle_gpu_s": idle / scale,
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


def _gangs(plan: Plan, window: int, at: Any, shares: Shares) -> list[dict[str, Any]]:
    out = []
    for g in plan.gangs:
        s, e = max(g.partial_from, 0), min(g.partial_to, window)
        if not g.pods or e <= s:
            continue
        early = [p for p in g.pods if p.start <= g.partial_from]
        held = [h.device for p in early for h in p.holdings]
        gpus = [d.uuid for d in held]
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
                "held_gpu_s": (e - s) * sum(shares[d] for d in held) / shares.scale,
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
