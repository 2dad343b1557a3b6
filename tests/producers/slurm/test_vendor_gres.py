"""AMD and Intel GPUs in Slurm: typed GRES count GPUs whoever made them. Each recorded output
of a real Slurm (tests/fixtures/slurm: ``sacct -P`` and ``scontrol -d show job -o`` of Slurm
22.05.8, ``squeue --json`` and ``scontrol show node -o`` of the same, jobcomp/kafka records of
Slurm 26.05.3; see the fixtures' READMEs) is rewritten as the same cluster with other
vendors' GPU types, in the forms Slurm prints them: ``gres/gpu:mi300x=8`` in TRES (typed only,
where ``AccountingStorageTRES`` lists the type alone, or beside the untyped count),
``gpu:mi300x:4(IDX:0-3)`` in ``-d`` GRES and ``gres_detail``, ``Gres=gpu:mi300x:8`` on a
node. Every job must parse to what the recorded NVIDIA job parsed to: the same GPU counts and
indices; a node the same GPUs, its model the type."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.producers.slurm import capacity, jobcomp, squeue
from gpugap.producers.slurm.fields import gres_indices, tres_gpus
from gpugap.producers.slurm.parse import sacct_jobs, scontrol_jobs

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
T = datetime(2026, 12, 7, 6, 14, 10, tzinfo=UTC)
#: the types sites give them: the model (gres.conf Type=), AutoDetect's vendor_model names
TYPES = ["mi300x", "amd_mi250x", "MI355X", "max1550", "intel_max_1550"]


def typed_tres(text: str, gpu_type: str, keep_plain: bool) -> str:
    """``gres/gpu=N`` -> ``gres/gpu:<type>=N`` (json-c's ``gres\\/gpu`` too)."""

    def sub(m: re.Match[str]) -> str:
        key, n = m.group(1), m.group(2)
        typed = f"{key}:{gpu_type}={n}"
        return f"{key}={n},{typed}" if keep_plain else typed

    return re.sub(r"(gres\\?/gpu)=(\d+)", sub, text)


def typed_gres(text: str, gpu_type: str) -> str:
    """``gpu:N(IDX:..)`` -> ``gpu:<type>:N(IDX:..)``."""
    return re.sub(r"\bgpu:(\d+)\(IDX:", rf"gpu:{gpu_type}:\1(IDX:", text)


def jobs_as(jobs: list[Any]) -> dict[str, tuple[object, object]]:
    return {j.raw_id: (j.gpus, j.gpu_indices) for j in jobs}


@pytest.mark.parametrize("gpu_type", TYPES)
@pytest.mark.parametrize("keep_plain", [False, True], ids=["typed-only", "typed-and-plain"])
def test_sacct_alloctres_of_other_vendors(gpu_type: str, keep_plain: bool) -> None:
    text = (FIX / "sacct.txt").read_text()
    nvidia, bad = sacct_jobs(text)
    rewritten = typed_tres(text, gpu_type, keep_plain)
    assert f"gres/gpu:{gpu_type}=2" in rewritten
    other, bad_other = sacct_jobs(rewritten)
    assert bad == bad_other == []
    assert any(j.gpus for j in nvidia)
    assert jobs_as(other) == jobs_as(nvidia)


@pytest.mark.parametrize("gpu_type", TYPES)
def test_scontrol_jobs_of_other_vendors(gpu_type: str) -> None:
    text = (FIX / "scontrol_all.txt").read_text()
    nvidia, bad = scontrol_jobs(text)
    rewritten = typed_gres(typed_tres(text, gpu_type, False), gpu_type)
    assert f"GRES=gpu:{gpu_type}:1(IDX:" in rewritten and "gres/gpu=" not in rewritten
    other, bad_other = scontrol_jobs(rewritten)
    assert bad == bad_other == []
    assert any(j.gpu_indices for j in nvidia)
    assert jobs_as(other) == jobs_as(nvidia)


@pytest.mark.parametrize("gpu_type", TYPES)
def test_squeue_json_of_other_vendors(gpu_type: str) -> None:
    text = (FIX / "squeue.json").read_text()
    nvidia, bad = squeue.jobs(text)
    rewritten = typed_gres(typed_tres(text, gpu_type, False), gpu_type)
    assert f'"gpu:{gpu_type}:1(IDX:' in rewritten and "gres\\/gpu=" not in rewritten
    other, bad_other = squeue.jobs(rewritten)
    assert bad == bad_other == []
    assert any(j.gpu_indices for j in nvidia)
    assert jobs_as(other) == jobs_as(nvidia)


@pytest.mark.parametrize("gpu_type", TYPES)
@pytest.mark.parametrize("record", ["start-gres2-n2.json", "end-het-component1.json"])
def test_jobcomp_records_of_other_vendors(gpu_type: str, record: str) -> None:
    raw = (FIX / "jobcomp" / record).read_bytes()
    typed = typed_tres(raw.decode(), gpu_type, False)
    assert f"gpu:{gpu_type}=2" in typed
    assert jobcomp.parse(typed.encode()).info.gpus == jobcomp.parse(raw).info.gpus == 2


@pytest.mark.parametrize("gpu_type", TYPES)
@pytest.mark.parametrize("snapshot", ["stranded", "multi", "drained"])
def test_node_capacity_of_other_vendors(gpu_type: str, snapshot: str) -> None:
    """The recorded nodes are ``Gres=gpu:a100:8`` and their jobs ``--gres=gpu:a100:N`` or
    untyped: the same with another vendor's type."""

    def recs(rename: str) -> dict[str, Any]:
        def read(name: str) -> str:
            return (FIX / "capacity" / f"{name}_{snapshot}.txt").read_text().replace("a100", rename)

        nodes, bad = capacity.parse_nodes(read("nodes"))
        held, bad_jobs = capacity.parse_holdings(read("jobs"), read("squeue").split())
        assert bad == bad_jobs == []
        out = capacity.node_capacities(nodes, held, cluster="c1", time=T, interval_s=60.0)
        return {r.node: r for r in out}

    nvidia, other = recs("a100"), recs(gpu_type)
    assert {n: r.gpu_model for n, r in other.items()} == dict.fromkeys(nvidia, gpu_type)
    assert {n: r.model_copy(update={"gpu_model": "a100"}) for n, r in other.items()} == nvidia


@pytest.mark.parametrize(
    ("value", "gpus"),
    [
        ("cpu=64,mem=500G,gres/gpu=8,gres/gpu:mi300x=8", 8),
        ("cpu=64,gres/gpu:mi300x=4,gres/gpu:h100=2", 6),  # typed only: the types summed
        ("cpu=8,gres/gpu:max_1550=4,gres/gpumem=64G", 4),  # another GRES named gpu-something
        ("cpu=8,gres/gpu=0", 0),
    ],
)
def test_tres_counts(value: str, gpus: int) -> None:
    assert tres_gpus(value) == gpus


def test_gres_indices_of_mixed_node_types() -> None:
    assert gres_indices("gpu:mi300x:2(IDX:0-1),gpu:h100:1(IDX:4),nic:1(IDX:0)") == (0, 1, 4)
    assert capacity.gres_gpus("gpu:mi300x:8(S:0-1),gpu:max_1550:4(S:0)") == (
        12,
        "mi300x,max_1550",
    )
