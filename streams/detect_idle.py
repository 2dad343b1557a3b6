"""Idle-GPU episodes of one node's allocations, minute by closed minute (pure, JSON state).

Matches the simulator's ground truth (gpugap/simulator/truth.py): an idle minute is a whole UTC
minute wholly inside an allocation, with telemetry, whose activity time-weighted over the
seconds its samples cover is below the class threshold; an idle run is at least N consecutive
idle minutes of one GPU; overlapping or adjacent runs on GPUs of the same allocation are one
episode. The alert opens when the first run reaches N minutes (``opened_at`` = the end of that
minute, in event time), updates when a GPU joins and every ``update_every`` minutes, and
resolves once no GPU of the allocation has an idle run that could still join (``resolved_at``
= the end of the last idle minute, ``time`` = the end of the minute that showed it).

Episodes are per node (the core is per node); streams/merge_alerts.py merges the episodes of
a multi-node allocation into one alert.
"""

from __future__ import annotations

from gpugap.schemas.clock import HOUR_S, MINUTE_MS, MINUTE_S, at
from gpugap.schemas.models import Alert, GpuMinute
from gpugap.schemas.types import AlertKind, AlertState, Scheduler, WorkloadClass, format_utc
from gpugap.streams.idle_policy import Exemption, IdleConfig
from gpugap.streams.state import AllocState, Episode, IdleRun, IdleState

__all__ = ["Exemption", "IdleConfig", "is_idle_minute", "observe"]


def is_idle_minute(row: GpuMinute, threshold: float) -> bool:
    """Held the whole minute, measured for some of it, and below the threshold over the
    seconds measured: the device's own activity (a MIG slice's or a shared GPU's seconds
    count at their share, the ratio is the same). Unmeasured seconds (a lost sample) neither
    make a minute idle nor busy; a minute with none measured is not idle."""
    held_s = row.device_s if row.device_s is not None else row.allocated_s
    measured = row.measured
    return (
        row.allocation_id is not None
        and held_s >= MINUTE_S
        and measured > 0
        and row.consumed_gpu_s < threshold * measured
    )


def run_idle_s(run: IdleRun) -> float:
    """A run's idle GPU-equivalent seconds (runs kept before shares: whole GPUs)."""
    return float(run[2]) if len(run) > 2 else run[1] * MINUTE_S


def observe(
    state: IdleState,
    node: str,
    minute_ms: int,
    rows: list[GpuMinute],
    *,
    allocs: dict[str, AllocState],
    cfg: IdleConfig,
) -> list[Alert]:
    """Feed one closed minute's rows; returns the alert records it produced."""
    runs = state.setdefault("runs", {})
    episodes = state.setdefault("episodes", {})
    end = minute_ms + MINUTE_MS
    seen: dict[str, bool] = {}
    equiv: dict[str, float] = {}  # GPU-equivalent seconds of each idle minute
    for r in rows:
        if r.allocation_id is None:
            continue
        thr = (
            r.idle_threshold if r.idle_threshold is not None else cfg.for_class(r.workload_class)[0]
        )
        key = f"{r.allocation_id}|{r.gpu_uuid}"
        if is_idle_minute(r, thr):
            seen[key] = True
            equiv[key] = r.allocated_s
        else:
            seen.setdefault(key, False)
    out: list[Alert] = []
    for key in sorted(set(runs) | set(seen)):
        alloc_id, gpu = key.split("|", 1)
        alloc = allocs.get(alloc_id)
        need = cfg.for_alloc(alloc).minutes
        if seen.get(key):
            run = runs.setdefault(key, [minute_ms, 0, 0.0])
            if len(run) < 3:
                run.append(run[1] * MINUTE_S)
            run[1] += 1
            run[2] += equiv[key]
            if run[1] >= need and not cfg.exempted(alloc, end):
                _qualify(
                    episodes, alloc_id, gpu, run=run, end=end, node=node, allocs=allocs, out=out,
                    cfg=cfg,
                )  # fmt: skip
            continue
        run_ = runs.pop(key, None)
        if run_ is not None and run_[1] >= need and alloc_id in episodes:
            ep = episodes[alloc_id]
            ep["done_s"] += run_idle_s(run_)
            ep["end"] = max(ep["end"], run_[0] + run_[1] * MINUTE_MS)
    for alloc_id in sorted(episodes):
        ep = episodes[alloc_id]
        live = [r for k, r in runs.items() if k.split("|", 1)[0] == alloc_id and r[0] <= ep["end"]]
        if not live:
            out.append(_alert(ep, AlertState.RESOLVED, end, allocs, node, cfg=cfg, resolved=True))
            del episodes[alloc_id]
        elif (end - ep["opened"]) // MINUTE_MS % cfg.update_every == 0 and end > ep["opened"]:
            out.append(_alert(ep, AlertState.UPDATE, end, allocs, node, cfg=cfg, runs=runs))
    return out


def _qualify(
    episodes: dict[str, Episode],
    alloc_id: str,
    gpu: str,
    *,
    run: IdleRun,
    end: int,
    node: str,
    allocs: dict[str, AllocState],
    out: list[Alert],
    cfg: IdleConfig,
) -> None:
    ep = episodes.get(alloc_id)
    if ep is not None and run[0] > ep["end"]:  # cannot merge: the old episode is over
        out.append(_alert(ep, AlertState.RESOLVED, end, allocs, node, cfg=cfg, resolved=True))
        ep = None
    if ep is None:
        ep = episodes[alloc_id] = {
            "alloc": alloc_id,
            "start": run[0],
            "end": end,
            "opened": end,
            "gpus": [gpu],
            "done_s": 0,
        }
        out.append(
            _alert(ep, AlertState.OPEN, end, allocs, node, cfg=cfg, runs={f"{alloc_id}|{gpu}": run})
        )
        return
    ep["end"] = max(ep["end"], end)
    if gpu not in ep["gpus"]:
        ep["gpus"] = sorted([*ep["gpus"], gpu])
        runs = {f"{alloc_id}|{gpu}": run}
        out.append(_alert(ep, AlertState.UPDATE, end, allocs, node, cfg=cfg, runs=runs))


def _alert(
    ep: Episode,
    state: AlertState,
    time_ms: int,
    allocs: dict[str, AllocState],
    node: str,
    *,
    cfg: IdleConfig,
    runs: dict[str, IdleRun] | None = None,
    resolved: bool = False,
) -> Alert:
    alloc_id = ep["alloc"]
    meta = allocs.get(alloc_id)
    ongoing = sum(
        run_idle_s(r)
        for k, r in (runs or {}).items()
        if k.split("|", 1)[0] == alloc_id and k.split("|", 1)[1] in ep["gpus"]
    )
    idle_s = ep["done_s"] + ongoing
    start = at(ep["start"])
    return Alert(
        alert_id=f"idle_gpu/{alloc_id}/{node}/{format_utc(start)}",
        kind=AlertKind.IDLE_GPU,
        state=state,
        time=at(time_ms),
        opened_at=at(ep["opened"]),
        resolved_at=at(ep["end"]) if resolved else None,
        # no meta: the allocation was forgotten while its episode was open (the id names
        # the cluster)
        cluster=meta["cluster"] if meta else alloc_id.split("/")[1],
        scheduler=Scheduler(meta["scheduler"]) if meta else Scheduler.SLURM,
        allocation_id=alloc_id,
        gang_id=meta["gang_id"] if meta else None,
        owner=meta["owner"] if meta else None,
        team=meta["team"] if meta else None,
        workload_class=WorkloadClass(meta["cls"]) if meta and meta["cls"] else None,
        nodes=(node,),
        gpus=tuple(ep["gpus"]),
        idle_minutes=(ep["end"] - ep["start"]) // MINUTE_MS,
        idle_gpu_hours=idle_s / HOUR_S,
        message=f"{len(ep['gpus'])} GPU(s) idle since {format_utc(start)}",
        policy=cfg.for_alloc(meta),
    )
