"""Deterministic example records of every topic, for docs, tests and benchmarks."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.schemas.clock import DAY_S
from gpugap.schemas.models import (
    Alert,
    AlertDelivery,
    AllocationEvent,
    Attribution,
    DeadLetter,
    GpuMinute,
    GpuSample,
    K8sPodEvent,
    MigInstance,
    NodeAllocation,
    NodeCapacity,
    NodeGpus,
    NodeSample,
    QueueQuota,
    Recommendation,
    RecommendationChange,
    RecommendationEvidence,
    RecommendationTarget,
    Record,
    SchedulerGpuCount,
    SlurmJobEvent,
    Transfer,
)
from gpugap.schemas.types import ActivityMetric, SampleSource

#: when the examples happen (a fixed instant, so they are the same on every run)
START = datetime(2026, 11, 1, tzinfo=UTC)


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{index}"))


def node_samples(
    count: int,
    *,
    nodes: int = 16,
    gpus: int = 8,
    seed: int = 1,
    cluster: str = "bench",
    start: datetime = START,
) -> Iterator[NodeSample]:
    """``count`` node samples round-robin over ``nodes`` nodes, 10 s apart per node."""
    rng = random.Random(seed)
    uuids = {(n, i): gpu_uuid(f"node{n:03d}", i) for n in range(nodes) for i in range(gpus)}
    for k in range(count):
        n = k % nodes
        t = start + timedelta(seconds=10 * (k // nodes))
        yield NodeSample(
            cluster=cluster,
            node=f"node{n:03d}",
            time=t,
            source=SampleSource.NVML,
            interval_s=10.0,
            gpus=tuple(
                GpuSample(
                    uuid=uuids[n, i],
                    index=i,
                    model="NVIDIA H100 80GB HBM3",
                    activity=round(rng.random(), 3),
                    activity_metric=ActivityMetric.UTILIZATION,
                    utilization=round(rng.random(), 2),
                    memory_used_mib=float(rng.randrange(0, 81_559)),
                    memory_total_mib=81_559.0,
                    power_w=round(rng.uniform(60, 700), 1),
                    energy_mj=1_000_000 * k + i,
                    sm_clock_mhz=1980,
                )
                for i in range(gpus)
            ),
        )


def one_of_each() -> dict[str, Record]:
    """A valid record for every topic, keyed by topic name."""
    t = START + timedelta(hours=1)
    g0, g1 = gpu_uuid("node001", 0), gpu_uuid("node001", 1)
    common: dict[str, Any] = {"cluster": "prod"}
    alert = Alert(
        alert_id="idle_gpu/slurm/prod/4242/1",
        kind="idle_gpu",
        state="open",
        time=t,
        opened_at=t - timedelta(minutes=30),
        **common,
        scheduler="slurm",
        allocation_id="slurm/prod/4242",
        owner="alice",
        gpus=(g0,),
        idle_minutes=30,
        idle_gpu_hours=0.5,
        message="2 GPUs idle for 30 min",
    )
    return {
        "gpu.samples.v1": NodeSample(
            **common,
            node="node001",
            time=t,
            source=SampleSource.DCGM,
            gpus=(
                GpuSample(
                    uuid=g0,
                    index=0,
                    activity=0.42,
                    activity_metric=ActivityMetric.SM_ACTIVE,
                    attribution=Attribution(pod="trainer-0", namespace="ml"),
                ),
                GpuSample(
                    uuid="MIG-" + g1[4:],
                    index=1,
                    mig=MigInstance(parent_uuid=g1, gpu_instance_id=1, profile="1g.10gb"),
                    unsupported=("activity", "power_w"),
                ),
            ),
        ),
        "slurm.jobs.v1": SlurmJobEvent(
            event_id="slurm/prod/4242/end",
            kind="end",
            time=t,
            source="hook",
            **common,
            job_id="4242",
            user="alice",
            account="vision",
            partition="gpu",
            qos="normal",
            job_name="train",
            nodes=(NodeGpus(node="node001", gpu_indices=(0, 1)),),
            gpus_total=2,
            time_limit_s=DAY_S,
            submit_time=t - timedelta(hours=3),
            start_time=t - timedelta(hours=2),
            end_time=t,
            state="COMPLETED",
            exit_code=0,
        ),
        "k8s.pods.v1": K8sPodEvent(
            event_id="k8s/prod/uid-1/bound",
            kind="bound",
            time=t,
            source="watch",
            **common,
            uid="0b5a4e8e-1d7c-4a57-9d1b-6a1f3c1b2d3e",
            namespace="ml",
            name="trainer-0",
            node="node001",
            phase="Pending",
            gpus=1,
            gpu_resource="nvidia.com/gpu",
            owner_kind="PyTorchJob",
            owner_name="trainer",
            workload_class="batch",
            owner="bob",
            team="nlp",
            gang_id="ml/trainer",
            gang_size=4,
        ),
        "gpu.allocations.v1": AllocationEvent(
            event_id="slurm/prod/4242/node001/start",
            kind="start",
            time=t,
            **common,
            node="node001",
            scheduler="slurm",
            allocation_id="slurm/prod/4242",
            gpus=2,
            gpu_indices=(0, 1),
            workload_class="batch",
            owner="alice",
            team="vision",
        ),
        "gpu.minutes.v1": GpuMinute(
            **common,
            node="node001",
            gpu_uuid=g0,
            minute=t,
            allocated_s=60.0,
            consumed_gpu_s=25.2,
            activity_avg=0.42,
            activity_max=0.9,
            activity_metric="sm_active",
            sample_count=6,
            no_samples=False,
            measured_s=60.0,
            allocation_id="slurm/prod/4242",
            scheduler="slurm",
            workload_class="batch",
            owner="alice",
            team="vision",
        ),
        "alerts.v1": alert,
        "alerts.deliveries.v1": AlertDelivery(
            alert_id=alert.alert_id,
            state="open",
            target="slack",
            time=t,
            outcome="delivered",
            code=200,
            alert=alert,
        ),
        "transfers.v1": Transfer(
            event_id="billing/prod/line-1",
            time=t,
            interval_s=3600.0,
            **common,
            from_env="cloud",
            to_env="onprem",
            bytes=5 << 30,
            source="billing_csv",
            team="vision",
            description="DataTransfer-Out-Bytes",
            billed_cost=0.45,
            billed_currency="USD",
        ),
        "dead-letter.v1": DeadLetter(
            time=t,
            source_topic="gpu.samples.v1",
            partition=0,
            offset=7,
            value_b64="e30=",
            kind="malformed",
            reason="gpu.samples.v1: not valid JSON",
            consumer="test",
        ),
        "recommendations.v1": example_recommendation(t),
        "node-capacity.v1": NodeCapacity(
            **common,
            node="node001",
            time=t,
            interval_s=60.0,
            scheduler="slurm",
            source="slurm_scontrol",
            pool="gpu",
            gpu_model="a100",
            gpus=8.0,
            cpus=64.0,
            memory_mib=512_000.0,
            allocations=(
                NodeAllocation(
                    allocation_id="slurm/prod/42", gpus=1.0, cpus=64.0, memory_mib=64_000.0
                ),
            ),
        ),
        "queue-quotas.v1": QueueQuota(
            **common,
            time=t,
            interval_s=60.0,
            kind="kueue_cluster_queue",
            queue="team-a",
            parent="research",
            flavor="a100",
            resource="nvidia.com/gpu",
            entitled_gpus=8.0,
            limit_gpus=12.0,
            held_gpus=8.0,
            borrowed_gpus=0.0,
            pending_workloads=3,
            admitted_workloads=2,
        ),
        "scheduler-gpu-counts.v1": SchedulerGpuCount(
            **common,
            time=t,
            interval_s=60.0,
            scheduler="slurm",
            source="slurmctld_metrics",
            scope="partition",
            name="gpu",
            gpus_allocated=6.0,
            gpus_total=8.0,
        ),
    }


def example_recommendation(t: datetime) -> Recommendation:
    """A Slurm --time recommendation, as ``gpugap recommend compute`` writes them."""
    return Recommendation(
        id="time-0123456789ab",
        kind="slurm_time_limit",
        target=RecommendationTarget(
            kind="slurm_job_family", scheduler="slurm", cluster="prod", user="alice",
            account="vision", job_name="train", partition="gpu",
        ),
        workload_class="batch",
        change=RecommendationChange(parameter="time_limit_s", from_value="86400", to_value="9000"),
        evidence=RecommendationEvidence(
            query="SELECT * FROM v_slurm_padding WHERE user = 'alice'",
            since=t - timedelta(days=7), until=t, history_days=7.0, allocations=14, samples=14,
            hours=28.0, gpu_hours=56.0, figures={"p95_elapsed_s": 7200.0},
        ),
        saved_gpu_hours_per_week=540.0,
        confidence=0.84,
        rationale="p95 elapsed 2 h + 20 % margin, rounded up to 15 min",
        apply="scontrol update JobId=<id> TimeLimit=2:30:00",
        computed_at=t,
    )  # fmt: skip
