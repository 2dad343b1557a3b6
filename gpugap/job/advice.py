"""Advice for the person who ran one allocation: ``gpugap recommend``'s rules, asked of this
one allocation instead of a job family over weeks. The rules and their constants are the
recommenders' (imported, never restated); what differs is the sample (one allocation) and that
no saving threshold applies (the person asked about this job):

- GPU count (recommend.batch): a GPU idle in GPU_IDLE_LIFE of its measured minutes was not
  needed; ask for the GPUs that were busy (at least one).
- ``--time`` (gpugap.queue.limits.right_sized_limit): the family's rule where its family (same
  user, account, name and partition) completed MIN_JOBS jobs in the HISTORY_DAYS before this
  one ended and none hit its limit; else the same rule on this job alone.
- A MIG slice (recommend.fit): the smallest profile that holds its p99 hourly peak and its
  peak memory with the headroom, on the rate card's GPU model (else H100-80GB, said); only on
  NVIDIA GPUs (its GPUs' identities name the vendor: no slice catalog for AMD or Intel).
- A smaller GPU model (recommend.model): low utilisation in little memory, and a model of the
  same vendor the estate had while it ran that holds it and is smaller.
- Idle culling (recommend.interactive): an interactive allocation idle most of its life: the
  timeout above 90 % of its pauses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpugap.job.models import Advice, Allocation, GpuFigures, Idle
from gpugap.queue.limits import MIN_JOBS, right_sized_limit
from gpugap.recommend.base import hms, said, sh
from gpugap.recommend.batch import DEVICE_RESOURCES, GPU_IDLE_LIFE, vendor_in
from gpugap.recommend.fit import (
    DEFAULT_GPU_MODEL,
    FIT_HEADROOM,
    MEMORY_KNOWN,
    MIG_SLICES,
    fitting,
    model_key,
)
from gpugap.recommend.interactive import NOTEBOOK_IDLE_SHARE, culling_minutes
from gpugap.recommend.model import (
    LOW_UTILISATION,
    PRODUCT_LABELS,
    SMALL_MEMORY_MIB,
    GpuModel,
    ModelUse,
    smaller_model,
)
from gpugap.recommend.queries import class_of
from gpugap.schemas.types import Vendor, WorkloadClass, vendor_of

HISTORY_DAYS = 14  # gpugap recommend compute's default history


def _a(name: str) -> str:
    """'an L4', 'an A100', 'a T4': GPU names are read letter by letter."""
    return f"{'an' if name[:1].upper() in 'AEFHILMNORSX' else 'a'} {name}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _pod_limit(a: Allocation, resource: str, value: int, was: str) -> str:
    return (
        f"# in the pod spec of {said(a.name)} (or its {said(a.namespace) or 'namespace'}'s "
        f"workload):\nresources:\n  limits:\n    {resource}: {value}    # was {was}"
    )


def needed_gpus(gpus: Sequence[GpuFigures]) -> tuple[int, int]:
    """(GPUs measured, GPUs it needed: those busy, at least one)."""
    measured = [g for g in gpus if g.measured_gpu_h > 0]
    return len(measured), max(1, sum(g.needed for g in measured)) if measured else 0


def gpu_count(a: Allocation, gpus: Sequence[GpuFigures]) -> Advice | None:
    n, needed = needed_gpus(gpus)
    if n < 2 or needed >= n:
        return None
    measured = [g for g in gpus if g.measured_gpu_h > 0]
    hours = max(g.measured_gpu_h for g in measured)
    idle = [g for g in measured if not g.needed]
    if a.scheduler == "slurm":
        apply = f"#SBATCH --gpus={needed}    # was {n} (or --gres=gpu:{needed} per node)"
    else:
        vendor = vendor_in([g.gpu_uuid for g in measured])
        resource = DEVICE_RESOURCES[vendor] if vendor else "<the GPU resource>"
        apply = _pod_limit(a, resource, needed, str(n))
    return Advice(
        kind="gpu_count",
        say=f"ask for {_plural(needed, 'GPU')}",
        parameter="gpus",
        from_value=str(n),
        to_value=str(needed),
        apply=apply,
        why=f"{len(idle)} of its {n} GPUs ({', '.join(g.gpu_uuid for g in idle)}) "
        f"{'was' if len(idle) == 1 else 'were'} idle in {GPU_IDLE_LIFE:.0%}+ of the measured "
        f"minutes, so {_plural(needed, 'GPU')} would have done the same work",
        saved_gpu_h=round((n - needed) * hours, 4),
    )


def time_limit(a: Allocation, family: dict[str, Any] | None) -> Advice | None:
    """``family``: the family's ended jobs (job_queries.family), None if not asked."""
    if a.scheduler != "slurm" or a.final_state != "COMPLETED" or family is None:
        return None
    limit, elapsed = a.time_limit_s or 0, a.elapsed_s
    if limit <= 0 or elapsed is None or family["timeouts"]:
        return None  # no limit, or the limit binds in its family: leave it
    done = [float(e) for e in family["elapsed"]]
    if len(done) >= MIN_JOBS:
        new = right_sized_limit(done, [int(x) for x in family["limits"]], 0)
        basis = (
            f"the p95 elapsed time of {len(done)} completed jobs of its family (same user, "
            f"account, name and partition) in the {HISTORY_DAYS} days before it ended"
        )
    else:
        new = right_sized_limit([elapsed], [limit], 0, min_jobs=1)
        basis = (
            f"its own elapsed time ({hms(elapsed)}; its family completed fewer than "
            f"{MIN_JOBS} jobs to go on)"
        )
    if new is None or new >= limit:
        return None
    return Advice(
        kind="time_limit",
        say=f"--time={hms(new)}",
        parameter="time_limit_s",
        from_value=str(limit),
        to_value=str(new),
        apply=f"#SBATCH --time={hms(new)}    # was {hms(limit)}",
        why=f"it ran {hms(elapsed)} of its {hms(limit)} limit; {basis} + 20 %, rounded up to "
        "15 minutes, is enough. A padded limit holds its GPUs in the scheduler's plan, so "
        "backfill cannot start smaller jobs in front of it",
        saved_gpu_h=round(a.gpus_requested * (limit - new) / 3600, 4),
    )


def gpu_share(a: Allocation, peaks: dict[str, Any], card_model: str, n: int) -> Advice | None:
    """``n``: the GPUs it needed (a slice for each)."""
    measured = int(peaks["measured_minutes"])
    memory = float(peaks["memory_mib"] or 0)
    if peaks["sliced"] or measured == 0 or n == 0:
        return None
    if vendor_in(peaks.get("prefixes")) is not Vendor.NVIDIA:
        return None  # MIG is NVIDIA's: no slice catalog for another vendor's GPUs
    if peaks["memory_minutes"] < MEMORY_KNOWN * measured or memory <= 0:
        return None  # memory unknown: no slice can be said to hold it
    model = model_key(card_model)
    if model is None and card_model:
        return None  # the card names a GPU without MIG
    assumed = model is None
    model = model or DEFAULT_GPU_MODEL
    peak = float(peaks["fit_peak"])
    fit = fitting(peak, memory, model)
    if fit is None:
        return None
    profile, slices, gib = fit
    if a.scheduler == "slurm":
        apply = (
            f"#SBATCH --gres=gpu:{profile}:{n}    # was --gpus={n} (gres.conf with "
            "AutoDetect=nvml names MIG slices by profile)"
        )
    else:
        apply = _pod_limit(a, f"nvidia.com/mig-{profile}", n, f"nvidia.com/gpu: {n}")
    return Advice(
        kind="gpu_share",
        say=f"a {profile} slice would do" if n == 1 else f"{n} {profile} slices would do",
        parameter="gpu_profile",
        from_value=f"{n} x {model}",
        to_value=f"{n} x {profile}",
        apply=apply,
        why=f"its peak activity, {peak:.1%} of a whole GPU (p99 of its hourly peaks), and "
        f"peak memory, {memory / 1024:.1f} GiB, fit {profile} ({slices}/{MIG_SLICES} of the "
        f"SMs, {gib} GiB) with {1 - FIT_HEADROOM:.0%} headroom on a {model}"
        + (" (assumed: the rate card names no GPU model for its cluster)" if assumed else ""),
        saved_gpu_h=round((1 - slices / MIG_SLICES) * float(peaks["measured_gpu_h"]), 4),
    )


def model_worth_asking(peaks: dict[str, Any], measured_gpu_h: float, consumed: float) -> bool:
    """Whether the estate is worth reading: low use in little memory, memory known."""
    measured = int(peaks["measured_minutes"])
    memory = float(peaks["memory_mib"] or 0)
    return (
        not peaks["sliced"]
        and measured > 0
        and measured_gpu_h > 0
        and peaks["memory_minutes"] >= MEMORY_KNOWN * measured
        and 0 < memory <= SMALL_MEMORY_MIB
        and consumed / measured_gpu_h <= LOW_UTILISATION
        and float(peaks["model_peak"]) <= LOW_UTILISATION
    )


def _models(rows: Sequence[Sequence[Any]], cluster: str | None) -> list[GpuModel]:
    """Rows of (cluster, pool, model, memory, rate, currency, identity prefix):
    capacity_queries.estate's."""
    return [
        GpuModel(
            cluster=cluster or r[0], pool=r[1], gpu_model=r[2],
            memory_mib=None if r[3] is None else float(r[3]),
            rate=None if r[4] is None else float(r[4]), currency=r[5] or "",
            vendor=vendor_of(r[6] or "") if len(r) > 6 else Vendor.NVIDIA,
        )
        for r in rows
    ]  # fmt: skip


def gpu_model(
    a: Allocation,
    *,
    target: Any,
    peaks: dict[str, Any],
    use: tuple[float, float, int],
    nodes: Sequence[Sequence[Any]],
    estate: Sequence[Sequence[Any]],
) -> Advice | None:
    """``use``: (measured GPU-hours, consumed GPU-hours, GPUs); ``nodes``: the models of
    the nodes it ran on (job_queries.node_models), ``estate``: job_queries.estate."""
    current = _models([r for r in nodes if r[2]], a.cluster)  # (node, pool, model...)
    vendor = vendor_in(peaks.get("prefixes"))
    if not current or vendor is None:
        return None
    measured_gpu_h, consumed, n = use
    model_use = ModelUse(
        target=target,
        workload_class=class_of(a.workload_class, WorkloadClass.BATCH),
        current=replace(current[0], vendor=vendor),  # its own GPUs name the vendor
        gpus=n,
        allocations=1,
        gpu_hours=measured_gpu_h,
        consumed_gpu_hours=consumed,
        measured_minutes=int(peaks["measured_minutes"]),
        memory_minutes=int(peaks["memory_minutes"]),
        allocation_peaks=(float(peaks["model_peak"]),),
        peak_memory_mib=float(peaks["memory_mib"]),
    )
    to = smaller_model(model_use, _models(estate, None))
    if to is None:
        return None
    cur = model_use.current
    priced = to.rate is not None and cur.rate is not None
    smaller = "a lower rate on the rate card" if priced else "less memory"
    if a.scheduler == "slurm":
        apply = f"#SBATCH --partition={sh(to.pool)}\n#SBATCH --gres=gpu:{sh(to.gpu_model)}:{n}"
    elif (product := PRODUCT_LABELS.get(to.vendor)) is None:
        apply = f"# in the pod spec of {said(a.name)}: select pool {said(to.pool)} by its label"
    else:
        key, space = product
        patch = {"spec": {"nodeSelector": {key: said(to.gpu_model).replace(" ", space)}}}
        apply = f"# in the pod spec of {said(a.name)}:\n{json.dumps(patch)}"
    return Advice(
        kind="gpu_model",
        say=f"{_a(said(to.gpu_model))} would do",
        parameter="gpu_model",
        from_value=f"{n} x {cur.gpu_model}",
        to_value=f"{n} x {to.gpu_model} ({to.pool})",
        apply=apply,
        why=f"it used {consumed / measured_gpu_h:.1%} of its {measured_gpu_h:.2f} measured "
        f"GPU-hours on {said(cur.gpu_model)} (at most {LOW_UTILISATION:.0%}) in at most "
        f"{float(peaks['memory_mib']) / 1024:.1f} GiB; {said(to.gpu_model)} in pool "
        f"{said(to.pool)} holds that and is smaller ({smaller})",
        saved_gpu_h=round(measured_gpu_h, 4),
    )


def idle_culling(a: Allocation, idle: Idle | None, lengths: Sequence[int], n: int) -> Advice | None:
    """An interactive allocation idle most of its measured minutes; ``lengths``: its idle
    stretches' minutes; ``n``: its GPUs."""
    if a.workload_class != "interactive" or idle is None or idle.measured_minutes == 0:
        return None
    if idle.idle_minutes < NOTEBOOK_IDLE_SHARE * idle.measured_minutes:
        return None
    cull = culling_minutes(lengths)
    long = [e for e in lengths if e > cull]
    if not long:
        return None
    if a.scheduler == "slurm":
        apply = (
            f"# end the salloc/srun session (exit) when you step away; an idle timeout of "
            f"{cull} min (a job_submit rule, or a shorter --time) would have ended it"
        )
    else:
        apply = (
            f"# Kubeflow notebooks: ENABLE_CULLING=true CULL_IDLE_TIME={cull} on the notebook "
            f"controller\n# JupyterHub: jupyterhub-idle-culler --timeout={cull * 60}"
        )
    return Advice(
        kind="idle_culling",
        say=f"end it after {cull} idle minutes",
        parameter="idle_cull_minutes",
        from_value="none",
        to_value=str(cull),
        apply=apply,
        why=f"every GPU was idle in {idle.idle_minutes / idle.measured_minutes:.0%} of its "
        f"{idle.measured_minutes} measured minutes, in {len(lengths)} idle stretches; a "
        f"{cull}-minute timeout (above 90 % of its pauses under an hour) would have freed "
        f"its GPUs in {len(long)} of them",
        saved_gpu_h=round(sum(e - cull for e in long) * n / 60, 4),
    )
