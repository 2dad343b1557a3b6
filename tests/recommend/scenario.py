# ruff: noqa: PLR0917  (record builders of a test scenario)
"""A week whose right answers are known from its model: the patterns the recommenders look
for and well-sized controls beside each, as records written through the ClickHouse sink.

The MODEL numbers are computed here from the scenario's parameters, never from the
warehouse."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from gpugap.schemas import Alert, GpuMinute, K8sPodEvent, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import gpu_uuid
from gpugap.schemas.models import Transfer

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
# (e) a Deployment of 3 one-GPU pods sized for its peak (08-16 UTC, 70 % busy), 3x its
# trough the rest of the day; its control: 2 pods a steady 60 % busy
RANKER_PODS, PEAK_HOURS, PEAK_ACTIVITY = 3, range(8, 16), 0.7
UNMEASURED_DAYS = 2  # the ranker's pods ran this long before telemetry began
# (f) a one-GPU service 8 % busy in 6,000 MiB: a 1g.10gb MIG slice holds it (the control:
# the embedder above, 60 % busy)
TOKENIZER_ACTIVITY, TOKENIZER_MIB = 0.08, 6000.0
# (g) a service on Slurm holding 4 GPUs all week, busy 10-18 UTC and a quarter of that after
SERVE_GPUS, SERVE_PEAK_HOURS = 4, range(10, 18)


# the boundary beside the placements: the ml team (the PyTorchJob's) copies 100 GiB a day
# from the cloud cluster to on-prem; nobody records transfers for serve-llm
RATE_CARD = {
    "name": "scenario", "currency": "USD",
    "clusters": {
        "hpc": {"environment": "onprem", "gpu_model": "H100", "kwh_price": 0.1,
                "capital": {"H100": {"price": 30000, "years": 4}},
                "overhead_per_gpu_hour": 0.1, "egress_per_gib": {"onprem->cloud": 0.0}},
        "k8s": {"environment": "cloud", "gpu_model": "NVIDIA A100-SXM4-80GB",
                "cloud": {"NVIDIA A100-SXM4-80GB": {"on_demand": 4.0}},
                "egress_per_gib": {"cloud->onprem": 0.09}},
    },
}  # fmt: skip
ML_GIB_PER_DAY = 100


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
    # (e) 16 trough hours a day: 3 pods x 0.7 / 3 = 0.7 GPUs of work -> 1 replica at 0.7
    service_schedule = "00-08:1,08-16:3,16-24:1"
    service_saved = DAYS * (24 - len(PEAK_HOURS)) * (RANKER_PODS - 1) / DAYS * 7
    # (f) 1 of 7 slices fits 0.08 (<= 0.9/7) and 6,000 MiB (<= 0.9 x 10 GiB)
    share_profile = "1g.10gb"
    share_saved = (1 - 1 / 7) * 24 * DAYS / DAYS * 7
    # (g) trough: 4 x 0.7 / 4 = 0.7 GPUs of work -> 1 GPU; peak 4
    serve_saved = DAYS * (24 - len(SERVE_PEAK_HOURS)) * (SERVE_GPUS - 1) / DAYS * 7
    # the gang's team's boundary: 100 GiB a day cloud->onprem at the k8s card's 0.09/GiB
    gang_boundary_gib = ML_GIB_PER_DAY * 7
    gang_boundary_cost = gang_boundary_gib * 0.09
    gang_move_per_gib = 0.09  # moved to Slurm, its cloud data crosses cloud->onprem
    gang_saved_cost = gang_saved * 4.0  # the k8s card's A100 on-demand rate
    serve_saved_cost = serve_saved * (30000 / (4 * 8760) + 0.1)


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
           cls: str, owner: str, activity: float,
           memory: float | None = None) -> GpuMinute:  # fmt: skip
    return GpuMinute(
        cluster=cluster, node=node, gpu_uuid=gpu_uuid(node, gpu), minute=t, allocated_s=60.0,
        consumed_gpu_s=60.0 * activity, activity_avg=activity, activity_max=activity,
        activity_metric="sm_active", sample_count=6, no_samples=False, allocation_id=alloc,
        scheduler=scheduler, workload_class=cls, owner=owner, team="t",
        memory_used_mib_avg=memory,
    )  # fmt: skip


def unmeasured(cluster: str, node: str, t: datetime, alloc: str) -> GpuMinute:
    """An allocated minute without telemetry, on the stand-in GPU the stream gives it."""
    return GpuMinute(
        cluster=cluster, node=node, gpu_uuid=gpu_uuid(node, 7), minute=t, allocated_s=60.0,
        consumed_gpu_s=0.0, sample_count=0, no_samples=True, allocation_id=alloc,
        scheduler="kubernetes", workload_class="service", owner="serving", team="t",
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
    out += [
        Transfer(
            event_id=f"billing/ml/{d}", time=T0 + timedelta(days=d), interval_s=86400.0,
            cluster="k8s", from_env="cloud", to_env="onprem", bytes=ML_GIB_PER_DAY << 30,
            source="billing_csv", team="ml",
        )
        for d in range(days)
    ]  # fmt: skip
    return out + services(days)


def services(days: int) -> list[Record]:
    """(e), (f), (g): pods and a Slurm job of the service class, minute by minute."""
    out: list[Record] = []
    end = T0 + timedelta(days=days)
    trough = PEAK_ACTIVITY / 3
    pods = [
        (
            f"ranker-{p}",
            f"kn2{p}",
            "ranker-5f7d9c",
            lambda h: PEAK_ACTIVITY if h in PEAK_HOURS else trough,
            30000.0,
        )
        for p in range(RANKER_PODS)
    ]
    pods += [
        (f"embedder-{p}", f"kn3{p}", "embedder-6c8b7a", lambda h: 0.6, 20000.0) for p in range(2)
    ]
    pods += [("tokenizer-0", "kn40", "tokenizer-7a9d2e", lambda h: TOKENIZER_ACTIVITY,
              TOKENIZER_MIB)]  # fmt: skip
    for uid, node, rs, activity, memory in pods:
        name = f"{rs}-{uid[-1]}x"
        # the ranker's pods were bound before telemetry began: unmeasured minutes on a
        # stand-in GPU, which are no history of use (nothing may count them)
        bound = T0 - timedelta(days=UNMEASURED_DAYS) if rs.startswith("ranker") else T0
        for kind, t in (("bound", bound), ("terminated", end)):
            out.append(pod(uid, "serving", name, node, 1, kind, t, ("ReplicaSet", rs), "service"))
        for m in range(int((T0 - bound).total_seconds() // 60)):
            out.append(unmeasured("k8s", node, bound + timedelta(minutes=m), f"k8s/k8s/{uid}"))
        for m in range(days * 1440):
            t = T0 + timedelta(minutes=m)
            out.append(minute("k8s", node, 0, t, f"k8s/k8s/{uid}", "kubernetes", "service",
                              "serving", activity(t.hour), memory))  # fmt: skip
    who = {"user": "gina", "account": "search", "name": "serve-llm"}
    out += slurm_job("900", who, T0, days * 86400, (days + 1) * 86400, SERVE_GPUS, "gn20")
    for m in range(days * 1440):
        t = T0 + timedelta(minutes=m)
        a = PEAK_ACTIVITY if t.hour in SERVE_PEAK_HOURS else PEAK_ACTIVITY / SERVE_GPUS
        for g in range(SERVE_GPUS):
            out.append(minute("hpc", "gn20", g, t, "slurm/hpc/900", "slurm", "service", "gina",
                              a, 60000.0))  # fmt: skip
    return out


CONTROLS = {
    ("slurm_job_family", "bob"),
    ("slurm_job_family", "dave"),
    ("k8s_workload", "frank-nb"),
    ("k8s_workload", "trainer-ok"),
    ("k8s_workload", "embedder"),
}
