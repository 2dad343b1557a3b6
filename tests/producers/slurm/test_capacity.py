"""``gpugap produce slurm-capacity``: what real Slurm 22.05 printed (recorded under
tests/fixtures/slurm/capacity/, see its README) -> the exact NodeCapacity records, with
expectations computed by hand from the jobs submitted; then the producer against the test
harness's real Slurm (one node: 16 CPUs, 4 untyped GPUs, RealMemory=2000, CR_Core)."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, Settings
from gpugap.producers.base import run_producer
from gpugap.producers.slurm import capacity
from gpugap.producers.slurm.capacity_producer import SlurmCapacityProducer
from gpugap.producers.slurm.poll_settings import SlurmCapacitySettings
from gpugap.schemas.models import NodeAllocation, NodeCapacity
from gpugap.schemas.topics import NODE_CAPACITY
from gpugap.warehouse.client import connect
from tests.harness.slurm_cluster import SlurmCluster
from tests.warehouse.test_views import store

RECORDED = Path(__file__).parents[2] / "fixtures" / "slurm" / "capacity"
T = datetime(2026, 12, 7, 6, 14, 10, tzinfo=UTC)
MIB_A = 256000.0  # gpu-a: RealMemory, no MemSpecLimit
MIB_B = 256000.0 - 16000.0  # gpu-b: MemSpecLimit=16000 is the OS's, not schedulable


def records(snapshot: str, cluster: str = "c1") -> dict[str, NodeCapacity]:
    nodes, bad = capacity.parse_nodes((RECORDED / f"nodes_{snapshot}.txt").read_text())
    ids = (RECORDED / f"squeue_{snapshot}.txt").read_text().split()
    held, bad_jobs = capacity.parse_holdings((RECORDED / f"jobs_{snapshot}.txt").read_text(), ids)
    assert bad == bad_jobs == []
    out = capacity.node_capacities(nodes, held, cluster=cluster, time=T, interval_s=60.0)
    return {r.node: r for r in out}


def node(
    name: str, mib: float, pool: str, *allocs: NodeAllocation, ok: bool = True
) -> NodeCapacity:
    return NodeCapacity(
        cluster="c1",
        node=name,
        time=T,
        interval_s=60.0,
        scheduler="slurm",
        source="slurm_scontrol",
        pool=pool,
        gpu_model="a100",
        gpus=8,
        cpus=64,
        memory_mib=mib,
        schedulable=ok,
        allocations=allocs,
    )


def alloc(job: str, gpus: float, cpus: float, mib: float) -> NodeAllocation:
    return NodeAllocation(allocation_id=f"slurm/c1/{job}", gpus=gpus, cpus=cpus, memory_mib=mib)


def test_cpu_heavy_memory_heavy_and_gpuless_jobs() -> None:
    """gpu-a: one job holds all 64 cores and 1 GPU (7 GPUs stranded by CPUs); gpu-b: one job
    holds 200000 of 240000 MiB with 1 GPU, and one without GPUs 8 cores and 8000 MiB: each is
    listed with what it holds of the node, the GPU-less one too (it strands GPUs as well)."""
    assert records("stranded") == {
        "gpu-a": node("gpu-a", MIB_A, "batch", alloc("1", 1, 64, 64000)),
        "gpu-b": node(
            "gpu-b", MIB_B, "batch,long", alloc("2", 1, 4, 200000), alloc("3", 0, 8, 8000)
        ),
    }


def test_multi_node_job_requeued_run_and_draining_node() -> None:
    """Job 4 (-N 2, 2 tasks x 2 CPUs and 2 GPUs per node) holds the same share of each node;
    job 5, requeued once, is run #1; gpu-b, MIXED+DRAIN, takes no new jobs: unschedulable,
    its running job still listed."""
    assert records("multi") == {
        "gpu-a": node("gpu-a", MIB_A, "batch", alloc("4", 2, 4, 4000), alloc("5#1", 3, 1, 1000)),
        "gpu-b": node("gpu-b", MIB_B, "batch,long", alloc("4", 2, 4, 4000), ok=False),
    }


def test_down_and_drained_nodes_hold_nothing_and_are_unavailable() -> None:
    """Ended (CANCELLED) and pending (requeued) jobs still printed with their old -d groups
    hold nothing; DOWN and IDLE+DRAIN nodes are unschedulable."""
    assert records("drained") == {
        "gpu-a": node("gpu-a", MIB_A, "batch", ok=False),
        "gpu-b": node("gpu-b", MIB_B, "batch,long", ok=False),
    }


def test_without_detail_each_node_gets_an_even_share() -> None:
    """``scontrol show job -o`` without -d: NumCPUs, TRES gres/gpu and mem per node."""
    held, bad = capacity.parse_holdings((RECORDED / "jobs_stranded_nod.txt").read_text())
    assert bad == []
    shares = {n: [(h.job_id, h.gpus, h.cpus, h.memory_mib) for h in v] for n, v in held.items()}
    assert shares == {
        "gpu-a": [("1", 1, 64, 64000)],
        "gpu-b": [("2", 1, 4, 200000), ("3", 0, 8, 8000)],
    }


def test_forged_job_record_is_refused_not_counted() -> None:
    """Job 3's name holds a newline and then a whole record (id 99, job 3's text): the
    claimed id is not squeue's, and the broken line before it may be the tail of job 2's
    record, so all three are refused (reported), never added to a node; job 1 stands."""
    text = (RECORDED / "jobs_stranded.txt").read_text()
    forged = text.replace("JobName=nogpu ", "JobName=x\nJobId=99 JobName=nogpu ", 1)
    held, bad = capacity.parse_holdings(forged, ["1", "2", "3"])
    assert {n: [h.job_id for h in v] for n, v in held.items()} == {"gpu-a": ["1"]}
    assert len(bad) == 3


@pytest.mark.parametrize(
    ("state", "ok"),
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("IDLE+RESERVED", True),
        ("MIXED+COMPLETING", True),
        ("MIXED+DRAIN", False),
        ("IDLE+DRAIN", False),
        ("DOWN*", False),
        ("IDLE*", False),
        ("IDLE+CLOUD+POWERED_DOWN", False),
        ("IDLE+MAINT", False),
        ("DOWN+NOT_RESPONDING", False),
        ("FUTURE", False),
    ],
)
def test_schedulable(state: str, ok: bool) -> None:
    assert capacity.schedulable(state) is ok


@pytest.mark.parametrize(
    ("gres", "want"),
    [
        ("gpu:a100:8", (8, "a100")),
        ("gpu:a100:8(S:0-1)", (8, "a100")),
        ("gpu:4", (4, None)),
        ("gpu:a100:4(S:0),gpu:v100:2(S:1),nic:1", (6, "a100,v100")),
        ("nic:2", (0, None)),
        ("(null)", (0, None)),
    ],
)
def test_gres_gpus(gres: str, want: tuple[int, str | None]) -> None:
    assert capacity.gres_gpus(gres) == want


def test_cluster_name_from_config() -> None:
    text = (RECORDED / "config_clustername.txt").read_text()
    assert capacity.cluster_name(text) == "gga57211"


# --- against the harness's real Slurm -----------------------------------------------------


async def _publish_once(slurm: SlurmCluster, out: Path, cluster: str) -> list[NodeCapacity]:
    os.environ["SLURM_CONF"] = str(slurm.conf)  # for the scontrol and squeue it runs
    producer = SlurmCapacityProducer(Settings(), SlurmCapacitySettings(cluster=cluster))
    await run_producer(producer, JsonlPublisher(out), once=True, stop=asyncio.Event())
    assert producer.dead_letters == 0 and producer.skipped_polls == 0
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    out.unlink()
    assert {ln["topic"] for ln in lines} == {NODE_CAPACITY.name}
    return [NodeCapacity.model_validate(ln["value"]) for ln in lines]


def _running(slurm: SlurmCluster, *jobs: str) -> None:
    slurm.wait(lambda j: all(j[x]["job_state"] == "RUNNING" for x in jobs), f"{jobs} to run", 60)


@pytest.mark.slurm
def test_real_slurm_node_capacity(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job with 12 CPUs and 1 GPU and one with the other 4 CPUs and no GPU: 3 GPUs stranded,
    published as exactly that; drained, the node is unschedulable, its jobs still listed (it
    is resumed after, for the tests that follow). Runs (``#1`` after a requeue) are pinned on
    the recorded output of a real requeue above."""
    slurm.wait(
        lambda j: not any(x["job_state"] in ("RUNNING", "COMPLETING") for x in j.values()),
        "earlier tests' jobs to end",
        120,
    )
    gpu = slurm.submit("-c", "12", "--gres=gpu:1", wrap="sleep 300")
    cpu = slurm.submit("-c", "4", wrap="sleep 300")
    try:
        _running(slurm, gpu, cpu)
        got = asyncio.run(_publish_once(slurm, tmp_path / "out.jsonl", "real"))
        # CR_Core: memory is not a consumable resource here, so -d prints each job's Mem=0
        # (the memory arithmetic is pinned on the recorded CR_Core_Memory outputs above)

        def want(run: str, ok: bool = True) -> NodeCapacity:
            return NodeCapacity(
                cluster="real",
                node=slurm.node,
                time=got[0].time,
                interval_s=60.0,
                scheduler="slurm",
                source="slurm_scontrol",
                pool="debug",
                gpu_model=None,
                gpus=4,
                cpus=16,
                memory_mib=2000,
                schedulable=ok,
                allocations=tuple(
                    sorted(
                        [
                            NodeAllocation(
                                allocation_id=f"slurm/real/{gpu}{run}",
                                gpus=1,
                                cpus=12,
                                memory_mib=0,
                            ),
                            NodeAllocation(
                                allocation_id=f"slurm/real/{cpu}", gpus=0, cpus=4, memory_mib=0
                            ),
                        ],
                        key=lambda a: a.allocation_id,
                    )
                ),
            )

        assert got == [want("")]
        slurm.cmd("scontrol", "update", f"nodename={slurm.node}", "state=drain", "reason=gg-test")
        got = asyncio.run(_publish_once(slurm, tmp_path / "out.jsonl", "real"))
        assert got == [want("", ok=False).model_copy(update={"time": got[0].time})]
    finally:
        slurm.cmd("scancel", gpu, cpu, check=False)
        slurm.cmd("scontrol", "update", f"nodename={slurm.node}", "state=resume", check=False)


def test_what_real_slurm_printed_strands_exactly_this_through_the_sink(
    clickhouse: ClickHouseSettings,
) -> None:
    """The recorded CPU-heavy and memory-heavy snapshot, published and stored by the sink:
    gpu-a's free 7 GPUs have no core beside them (job 1's excess: 64 x 8/64 - 1 = 7); on
    gpu-b the free 52 cores feed 6.5 GPUs and the free 32000 MiB 32000 x 8/240000 = 16/15:
    0.5 stranded by CPU, all the GPU-less job 3's (8 x 8/64 = 1 core-share beyond its 0
    GPUs; job 2 is under its share), and 7 - 16/15 - 0.5 = 163/30 by memory, split 85:4
    between job 2 (200000 x 8/240000 - 1 = 17/3) and job 3 (8000 x 8/240000 = 4/15)."""
    store(clickhouse, list(records("stranded").values()))
    client = connect(clickhouse)
    try:
        nodes = client.query(
            "SELECT node, round(stranded_cpu_gpus, 6), round(stranded_memory_gpus, 6), "
            "round(usable_free_gpus, 6) FROM v_stranded ORDER BY node"
        ).result_rows
        who = client.query(
            "SELECT allocation_id, cause, round(stranded_gpus, 6) FROM v_stranded_by_allocation "
            "ORDER BY allocation_id, cause"
        ).result_rows
    finally:
        client.close()
    assert [tuple(r) for r in nodes] == [
        ("gpu-a", 7.0, 0.0, 0.0),
        ("gpu-b", 0.5, round(163 / 30, 6), round(16 / 15, 6)),
    ]
    assert [tuple(r) for r in who] == [
        ("slurm/c1/1", "cpu", 7.0),
        ("slurm/c1/2", "memory", round(163 / 30 * 85 / 89, 6)),
        ("slurm/c1/3", "cpu", 0.5),
        ("slurm/c1/3", "memory", round(163 / 30 * 4 / 89, 6)),
    ]
