"""Fewer cores (or less memory) per GPU (stranding.py) against hand-computed nodes written
through the sink. Two days, T0 to T0 + 48 h (savings x 7/2 a week), polled every 10 min:

- hpc n1 (hours 0-24) and n2 (hours 24-48), 8 GPUs, 64 CPUs, 512 GiB: carol's ``prep``, one
  GPU and 32 CPUs a job. The 32 free CPUs feed 32 x 8/64 = 4 of the 7 free GPUs: 3 stranded
  by CPU, all carol's (excess 32 x 8/64 - 1 = 3), 3 x 24 = 72 GPU-hours a job, 144 in all ->
  --cpus-per-gpu=8 (64/8), 504 GPU-hours a week; confidence (2/3) x (2 jobs / 5) = 0.267;
- hpc n3, the same node: dave's ``fit``, 2 GPUs and 16 CPUs (his share) both days: nothing;
- k8s k1, 8 GPUs, 64 CPUs, 256 GiB, hours 0-24: the pod ml/ranker-0 (a Deployment's) with
  2 GPUs and 192 GiB: the free 64 GiB feed 2 of the 6 free GPUs: 4 stranded by memory, all
  its (excess 192 x 8/256 - 2 = 4): 96 GPU-hours -> 32 GiB (32,768 MiB) a GPU, a request
  of 65536Mi for its 2 GPUs; 336 GPU-hours a week; confidence (2/3) x (1/5) = 0.133.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import K8sPodEvent, Record
from tests.recommend.estate import GIB, T0, gpu_minutes, job, polls, recommend
from tests.warehouse.test_views import store

END = T0 + timedelta(hours=48)
DAY = timedelta(hours=24)


def pod_events() -> list[Record]:
    return [
        K8sPodEvent(
            event_id=f"k8s/k8s/ranker-0/{kind}", kind=kind, time=t, source="watch",
            cluster="k8s", uid="ranker-0", namespace="ml", name="ranker-5f7d9c-abcde",
            node="k1", phase="Running" if kind == "bound" else "Succeeded", gpus=2,
            gpu_resource="nvidia.com/gpu", reason="completed" if kind == "terminated" else None,
            owner_kind="ReplicaSet", owner_name="ranker-5f7d9c", workload_class="batch",
            owner="ml", team="ml",
        )
        for kind, t in (("bound", T0), ("terminated", T0 + DAY))
    ]  # fmt: skip


def within_share() -> list[Record]:
    """dave's two jobs on n3: 2 GPUs and 16 of 64 CPUs (8 a GPU), 64 of 512 GiB."""
    out: list[Record] = []
    for d in range(2):
        alloc = f"slurm/hpc/{d + 11}"
        start = T0 + d * DAY
        out += job("hpc", str(d + 11), ("dave", "bio", "fit"), start, 24, {"n3": 2})
        out += gpu_minutes("hpc", alloc, "dave", start, 24 * 60, {"n3": 2}, 0.9)
        out += polls("hpc", "n3", model="H100", memory_per_gpu=80 * GIB, hours=24,
                     start=start, held={alloc: (2, 16, 64 * GIB)})  # fmt: skip
    return out


def records() -> list[Record]:
    out: list[Record] = within_share()
    for d, node in enumerate(("n1", "n2")):
        start = T0 + d * DAY
        alloc = f"slurm/hpc/{d + 1}"
        out += job("hpc", str(d + 1), ("carol", "bio", "prep"), start, 24, {node: 1})
        out += gpu_minutes("hpc", alloc, "carol", start, 24 * 60, {node: 1}, 0.9)
        for half, held in ((0, {alloc: (1, 32, 64 * GIB)}), (1, {})):
            out += polls("hpc", node, model="H100", memory_per_gpu=80 * GIB, hours=24,
                         start=T0 + ((d + half) % 2) * DAY, held=held)  # fmt: skip
    out += pod_events()
    out += gpu_minutes("k8s", "k8s/k8s/ranker-0", "ml", T0, 24 * 60, {"k1": 2}, 0.8,
                       scheduler="kubernetes")  # fmt: skip
    out += polls("k8s", "k1", model="A100", memory_per_gpu=80 * GIB, memory_mib=256 * GIB,
                 scheduler="kubernetes", pool="a100", hours=24,
                 held={"k8s/k8s/ranker-0": (2, 8, 192 * GIB)})  # fmt: skip
    return out


def test_families_beyond_their_share_are_asked_for_the_nodes_share_per_gpu(
    clickhouse: ClickHouseSettings,
) -> None:
    store(clickhouse, records())
    w, recs = recommend(clickhouse, "cpus_per_gpu", END)
    assert w.history_days == pytest.approx(2.0)
    got = {r.target.cluster: r for r in recs}
    assert sorted(got) == ["hpc", "k8s"]  # dave, within his share: nothing
    carol, pod = got["hpc"], got["k8s"]

    assert carol.id.startswith("cores-")
    assert (carol.target.user, carol.target.account, carol.target.job_name,
            carol.target.partition) == ("carol", "bio", "prep", "gpu")  # fmt: skip
    assert (carol.change.parameter, carol.change.from_value, carol.change.to_value) == (
        "cpus_per_gpu", "32", "8",
    )  # fmt: skip
    assert carol.saved_gpu_hours_per_week == pytest.approx(144 * 7 / 2)
    assert carol.confidence == pytest.approx(round((2 / 3) * (2 / 5), 3))
    assert carol.evidence.allocations == 2
    assert carol.evidence.figures["stranded_gpu_h"] == pytest.approx(144.0)
    assert carol.evidence.figures["nodes"] == 2.0
    assert "#SBATCH --cpus-per-gpu=8" in carol.apply
    assert "(n1, n2)" in carol.rationale

    assert (pod.target.namespace, pod.target.owner_kind, pod.target.owner_name) == (
        "ml", "Deployment", "ranker",
    )  # fmt: skip
    assert (pod.change.parameter, pod.change.from_value, pod.change.to_value) == (
        "mem_per_gpu_mib", "98304", "32768",
    )  # fmt: skip
    assert pod.saved_gpu_hours_per_week == pytest.approx(96 * 7 / 2)
    assert pod.confidence == pytest.approx(round((2 / 3) * (1 / 5), 3))
    assert "resources/requests/memory" in pod.apply
    assert '"value": "65536Mi"' in pod.apply


def test_a_job_within_its_share_gets_nothing(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, within_share())
    w, recs = recommend(clickhouse, "cpus_per_gpu", END)
    assert w.history_days == pytest.approx(2.0)
    assert recs == []
