# ruff: noqa: PLR0917  (record builders of a test scenario)
"""A week whose right answers are known from its model: the patterns the recommenders look
for and well-sized controls beside each, as records written through the ClickHouse sink.

The MODEL numbers are computed here from the scenario's parameters, never from the
warehouse."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from schemas import Alert, GpuMinute, K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from schemas.examples import gpu_uuid

T0 = datetime(2026, 11, 2, tzinfo=UTC)
DAYS = 7
END = T0 + timedelta(days=DAYS)

# (a) a family padded 4x: 14 jobs of ~2 h under an 8 h limit on 4 GPUs; its control asks
# for 2:30:00, which p95 + 20 % rounded up to 15 min gives back
PADDED = {"user": "alice", "account": "vision", "name": "train-resnet", "gpus": 4}
PADDED_LIMIT_S = 8 * 3600
SIZED = {"user": "bob", "account": "nlp", "name": "train-bert", "gpus": 2}
SIZED_LIMIT_S = 9000


def elapsed(i: int) -> int:
    return 7200 + 60 * (i % 5 - 2)  # 1:58 .. 2:02


PADDED_JOBS = 14  # two a day
# (b) 7 daily jobs of 6 h on 4 GPUs that keep 2 busy; the control keeps all 4 busy
HALF = {"user": "carol", "account": "vision", "name": "finetune", "node": "gn01"}
FULL = {"user": "dave", "account": "nlp", "name": "pretrain", "node": "gn02"}
GPU_JOB_HOURS = 6
# (c) a notebook busy 24 min in every 4 h (idle 90 %); its control is busy 50 min an hour
NOTEBOOK_PERIOD, NOTEBOOK_BUSY = 240, 24
# (d) a 4-pod PyTorchJob (2 GPUs a pod) with 3 pods at the barrier for 45 min a day
GANG_PODS, GANG_GPUS_PER_POD, GANG_WAIT_H = 4, 2, 0.75


class MODEL:
    """The right answers."""

    # (a) p95 of the elapsed times is their maximum here (14 values, 2 at the top)
    new_limit_s = math.ceil(max(elapsed(i) for i in range(PADDED_JOBS)) * 1.2 / 900) * 900
    time_saved = PADDED_JOBS * PADDED["gpus"] * (PADDED_LIMIT_S - new_limit_s) / 3600 / DAYS * 7
    # (b) 2 of 4 GPUs idle, 6 h, 7 jobs
    gpus_needed = 2
    gpu_saved = DAYS * 2 * GPU_JOB_HOURS / DAYS * 7
    # (c) 6 idle episodes of 216 min a day; no pauses under an hour -> the 30 min floor
    cull_minutes = 30
    episode_min = NOTEBOOK_PERIOD - NOTEBOOK_BUSY
    cull_saved = DAYS * (1440 // NOTEBOOK_PERIOD) * (episode_min - cull_minutes) / 60 / DAYS * 7
    # (d) every partial-gang GPU-hour: 3 running pods x 2 GPUs x 45 min, once a day
    gang_saved = DAYS * (GANG_PODS - 1) * GANG_GPUS_PER_POD * GANG_WAIT_H / DAYS * 7


def slurm_job(job_id: str, who: dict[str, object], start: datetime, run_s: int, limit_s: int,
              gpus: int, node: str) -> list[Record]:  # fmt: skip
    end = start + timedelta(seconds=run_s)
    out: list[Record] = []
    for kind in ("start", "end"):
        out.append(
            SlurmJobEvent(
                event_id=f"slurm/hpc/{job_id}/{kind}", kind=kind,
                time=start if kind == "start" else end, source="hook", cluster="hpc",
                job_id=job_id, user=str(who["user"]), account=str(who["account"]),
                partition="gpu", qos="normal", job_name=str(who["name"]),
                nodes=(NodeGpus(node=node, gpu_indices=tuple(range(gpus))),), gpus_total=gpus,
                time_limit_s=limit_s, submit_time=start, start_time=start,
                end_time=end if kind == "end" else None,
                state="COMPLETED" if kind == "end" else "RUNNING",
                exit_code=0 if kind == "end" else None,
            )
        )  # fmt: skip
    return out


def minute(cluster: str, node: str, gpu: int, t: datetime, alloc: str, scheduler: str,
           cls: str, owner: str, activity: float) -> GpuMinute:  # fmt: skip
    return GpuMinute(
        cluster=cluster, node=node, gpu_uuid=gpu_uuid(node, gpu), minute=t, allocated_s=60.0,
        consumed_gpu_s=60.0 * activity, activity_avg=activity, activity_max=activity,
        activity_metric="sm_active", sample_count=6, no_samples=False, allocation_id=alloc,
        scheduler=scheduler, workload_class=cls, owner=owner, team="t",
    )  # fmt: skip


def pod(uid: str, ns: str, name: str, node: str, gpus: int, kind: str, t: datetime,
        owner: tuple[str, str], cls: str, gang: str | None = None) -> K8sPodEvent:  # fmt: skip
    return K8sPodEvent(
        event_id=f"k8s/k8s/{uid}/{kind}", kind=kind, time=t, source="watch", cluster="k8s",
        uid=uid, namespace=ns, name=name, node=node,
        phase="Running" if kind == "bound" else "Succeeded", gpus=gpus,
        gpu_resource="nvidia.com/gpu", reason="completed" if kind == "terminated" else None,
        owner_kind=owner[0], owner_name=owner[1], workload_class=cls, owner=ns, team=ns,
        gang_id=gang, gang_size=GANG_PODS if gang else None,
    )  # fmt: skip


def gang_alert(gang: str, n: int, opened: datetime, wait_h: float, state: str) -> Alert:
    return Alert(
        alert_id=f"partial_gang/k8s/{gang}/{n}", kind="partial_gang", state=state,
        time=opened + timedelta(hours=wait_h) if state == "resolved" else opened,
        opened_at=opened,
        resolved_at=opened + timedelta(hours=wait_h) if state == "resolved" else None,
        cluster="k8s", scheduler="kubernetes", gang_id=gang, owner="ml", team="ml",
        workload_class="batch", nodes=("kn03", "kn04", "kn05"),
        idle_gpu_hours=(GANG_PODS - 1) * GANG_GPUS_PER_POD * wait_h if state == "resolved"
        else 0.0,
        pending_pods=1, running_pods=GANG_PODS - 1,
        message="3 of 4 pods running, 1 Pending",
    )  # fmt: skip


def records(days: int = DAYS) -> list[Record]:
    out: list[Record] = []
    for i in range(PADDED_JOBS * days // DAYS):
        start = T0 + timedelta(hours=12 * i, minutes=60)
        out += slurm_job(f"{100 + i}", PADDED, start, elapsed(i), PADDED_LIMIT_S, 4, "gn10")
        out += slurm_job(f"{200 + i}", SIZED, start, elapsed(i), SIZED_LIMIT_S, 2, "gn11")
    for d in range(days):
        start = T0 + timedelta(days=d, hours=2)
        for base, who, busy in ((300, HALF, (0.6, 0.6, 0.0, 0.0)), (400, FULL, (0.7,) * 4)):
            job_id = f"{base + d}"
            node = str(who["node"])
            out += slurm_job(job_id, who, start, GPU_JOB_HOURS * 3600, 7 * 3600, 4, node)
            for m in range(GPU_JOB_HOURS * 60):
                t = start + timedelta(minutes=m)
                for g, a in enumerate(busy):
                    out.append(minute("hpc", node, g, t, f"slurm/hpc/{job_id}", "slurm",
                                      "batch", str(who["user"]), a))  # fmt: skip
    end = T0 + timedelta(days=days)
    for uid, name, node, period, busy in (
        ("nb-erin", "erin-nb-0", "kn01", NOTEBOOK_PERIOD, NOTEBOOK_BUSY),
        ("nb-frank", "frank-nb-0", "kn02", 60, 50),
    ):
        owner = ("Notebook", name[:-2])
        out.append(pod(uid, "research", name, node, 1, "bound", T0, owner, "interactive"))
        out.append(pod(uid, "research", name, node, 1, "terminated", end, owner, "interactive"))
        for m in range(days * 1440):
            a = 0.5 if m % period < busy else 0.0
            out.append(minute("k8s", node, 0, T0 + timedelta(minutes=m), f"k8s/k8s/{uid}",
                              "kubernetes", "interactive", "research", a))  # fmt: skip
    for gang, episodes in (("ml/trainer-llm", days), ("ml/trainer-ok", 1)):
        job = gang.split("/")[1]
        for p in range(GANG_PODS):
            uid = f"{job}-{p}"
            out.append(pod(uid, "ml", f"{job}-worker-{p}", f"kn0{3 + p}", GANG_GPUS_PER_POD,
                           "bound", T0, ("PyTorchJob", job), "batch", gang))  # fmt: skip
        for d in range(episodes):
            opened = T0 + timedelta(days=d, hours=1)
            wait = GANG_WAIT_H if episodes > 1 else 1 / 30
            out += [gang_alert(gang, d, opened, wait, s) for s in ("open", "resolved")]
    return out


CONTROLS = {
    ("slurm_job_family", "bob"),
    ("slurm_job_family", "dave"),
    ("k8s_workload", "frank-nb"),
    ("k8s_workload", "trainer-ok"),
}
