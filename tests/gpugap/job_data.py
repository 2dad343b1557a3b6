"""Allocations with a known per-job answer, for ``gpugap job``'s tests (written through the
real sink by tests.warehouse.test_views.store). From T0 = 2026-11-02 10:00 UTC:

- ``slurm/c/1`` train (alice/vision, partition gpu): 2 GPUs for 2 h, submitted 10 minutes
  before it started; GPU 0 at 90 % with 30,000 MiB, GPU 1 idle throughout; limit 8 h,
  COMPLETED. Allocated 4, consumed 1.8, gap 2.2, idle 2 GPU-h; padding 2 x 6 h = 12 GPU-h;
  waited 600 s = 1/3 GPU-h. Advice: ask for 1 GPU (saves 2 GPU-h); --time=2:30:00 (its 2 h
  + 20 % rounded up to 15 min; saves 2 x 5.5 h = 11 GPU-h).
- ``slurm/c/3`` probe: 1 GPU for 1 h at 30 % with 20 GiB: a 3g.40gb slice would do (3/7
  of the SMs x 0.9 holds 0.3, 40 GiB x 0.9 holds 20 GiB; 2g.20gb does not), saving 4/7 GPU-h.
- ``slurm/c/7`` and ``slurm/c/7#1``: one job's two runs (requeued): "7" is ambiguous.
- ``slurm/c/9_3``, ``slurm/c/9_4``: array tasks; "9" is ambiguous, "9_3" one.
- ``slurm/c/5`` and ``slurm/d/5``: one id on two clusters.
- ``k8s/k/uid-nb`` pod ml/nb-0 (interactive notebook, 1 GPU, 4 h): busy 10 min, idle 50, busy
  10, idle 100, busy 10, idle 60: idle 210 of 240 minutes in stretches of 50, 100 and 60; the
  culling timeout over its pauses (50) is 60 min, so the 100-minute stretch would have been
  cut 40 minutes early: 2/3 GPU-h.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpugap.schemas import GpuMinute, K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
NB_BUSY = ((0, 10), (60, 70), (170, 180))  # the notebook's busy minutes, [from, to)


def slurm(job_id: str, minutes: int, gpus: tuple[int, ...], **kw: object) -> list[Record]:
    cluster = str(kw.pop("cluster", "c"))
    node = str(kw.pop("node", "n1"))
    run = kw.pop("run", None)
    start = T0 + timedelta(minutes=int(kw.pop("offset", 0)))  # type: ignore[call-overload]
    out: list[Record] = []
    for kind in ("start", "end"):
        end = start + timedelta(minutes=minutes)
        out.append(
            SlurmJobEvent(
                event_id=f"slurm/{cluster}/{job_id}/{run}/{kind}",
                kind=kind,
                time=start if kind == "start" else end,
                source="hook",
                cluster=cluster,
                job_id=job_id,
                run=run,
                nodes=(NodeGpus(node=node, gpu_indices=gpus),),
                gpus_total=len(gpus),
                start_time=start,
                end_time=end if kind == "end" else None,
                state="COMPLETED" if kind == "end" else "RUNNING",
                exit_code=0 if kind == "end" else None,
                partition="gpu",
                **kw,
            )
        )
    return out


def minute(
    where: tuple[str, str], gpu: int, m: int, alloc: tuple[str, str, str], *, use: float,
    memory: float | None,
) -> GpuMinute:  # fmt: skip
    cluster, node = where
    aid, scheduler, cls = alloc
    return GpuMinute(
        cluster=cluster,
        node=node,
        gpu_uuid=gpu_uuid(node, gpu),
        minute=T0 + timedelta(minutes=m),
        allocated_s=60.0,
        consumed_gpu_s=60.0 * use,
        activity_avg=use,
        activity_max=use,
        activity_metric="sm_active",
        memory_used_mib_avg=memory,
        sample_count=6,
        no_samples=False,
        allocation_id=aid,
        scheduler=scheduler,
        workload_class=cls,
        owner="alice",
        team="vision",
    )


def notebook_busy(m: int) -> bool:
    return any(a <= m < b for a, b in NB_BUSY)


def records() -> list[Record]:
    c = ("c", "n1")
    who = {"user": "alice", "account": "vision"}
    out: list[Record] = slurm(
        "1", 120, (0, 1), job_name="train", time_limit_s=8 * 3600,
        submit_time=T0 - timedelta(minutes=10), **who,
    )  # fmt: skip
    out += slurm("3", 60, (2,), job_name="probe", time_limit_s=3600, **who)
    out += slurm("7", 30, (3,), job_name="flaky", time_limit_s=3600, **who)
    out += slurm("7", 30, (3,), job_name="flaky", time_limit_s=3600, run=1, offset=40, **who)
    out += slurm("9_3", 10, (3,), job_name="sweep", time_limit_s=3600, offset=80, **who)
    out += slurm("9_4", 10, (3,), job_name="sweep", time_limit_s=3600, offset=95, **who)
    out += slurm("5", 10, (0,), job_name="same", time_limit_s=3600, offset=130, **who)
    out += slurm("5", 10, (0,), cluster="d", job_name="same", time_limit_s=3600, **who)
    out.append(
        K8sPodEvent(
            event_id="k8s/k/uid-nb/bound", kind="bound", time=T0, source="watch", cluster="k",
            uid="uid-nb", namespace="ml", name="nb-0", node="n2", phase="Running", gpus=1,
            gpu_resource="nvidia.com/gpu", workload_class="interactive", owner="alice",
            team="vision", created_time=T0 - timedelta(minutes=2),
        )
    )  # fmt: skip
    j1 = ("slurm/c/1", "slurm", "batch")
    j3 = ("slurm/c/3", "slurm", "batch")
    for m in range(120):
        out.append(minute(c, 0, m, j1, use=0.9, memory=30_000.0))
        out.append(minute(c, 1, m, j1, use=0.0, memory=500.0))
    for m in range(60):
        out.append(minute(c, 2, m, j3, use=0.3, memory=20_480.0))
    nb = ("k8s/k/uid-nb", "kubernetes", "interactive")
    for m in range(240):
        use = 0.9 if notebook_busy(m) else 0.0
        out.append(minute(("k", "n2"), 0, m, nb, use=use, memory=1024.0))
    return out
