"""The commands the estate-shaped recommenders print (model.py, stranding.py, packing.py)
run as printed in dash and bash whatever a record's values hold (test_shell_quoting.py's
hostile names and stand-ins); the GPU model and pool come from the scheduler's node reports,
so they are hostile here too. Pure: no warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugap.recommend.base import k8s_target, said, slurm_target
from gpugap.recommend.model import GpuModel, ModelUse, gpu_model
from gpugap.recommend.packing import SpreadRun, pack_nodes
from gpugap.recommend.stranding import Stranding, cpus_per_gpu
from gpugap.schemas.models import Recommendation, RecommendationTarget
from gpugap.schemas.types import WorkloadClass
from tests.recommend.test_shell_quoting import (
    HOSTILE,
    IN_RECORDS,
    NOW,
    SHELLS,
    WEEK,
    argvs,
    run_in,
    stubs,
)

__all__ = ["stubs"]  # the fixture, used by name


def model_rec(target: RecommendationTarget, v: str) -> Recommendation:
    cur = GpuModel(target.cluster, "gpu", "H100", 80 * 1024.0, None)
    to = GpuModel(target.cluster, v, v, 24 * 1024.0, None)
    use = ModelUse(
        target=target, workload_class=WorkloadClass.BATCH, current=cur, gpus=1, allocations=2,
        gpu_hours=48.0, consumed_gpu_hours=4.8, measured_minutes=2880, memory_minutes=2880,
        allocation_peaks=(0.1, 0.1), peak_memory_mib=6000.0,
    )  # fmt: skip
    rec = gpu_model(use, [cur, to], WEEK, NOW)
    assert rec is not None
    return rec


def stranding_rec(target: RecommendationTarget, cause: str) -> Recommendation:
    s = Stranding(
        target=target, workload_class=WorkloadClass.BATCH, cause=cause, gpus=2, allocations=3,
        held_per_gpu=(32.0, 32.0, 32.0), node_share=8.0, stranded_gpu_hours=50.0, hours=24.0,
        nodes=("n1",),
    )  # fmt: skip
    rec = cpus_per_gpu(s, WEEK, NOW)
    assert rec is not None
    return rec


def pack_rec(target: RecommendationTarget) -> Recommendation:
    runs = [
        SpreadRun(target, WorkloadClass.BATCH, f"u{i}", 4, 4.0, 8.0, 24.0, 12.0) for i in range(3)
    ]
    rec = pack_nodes(target, runs, WEEK, NOW)
    assert rec is not None
    return rec


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", IN_RECORDS)
def test_kubernetes_commands_run_as_printed(
    shell: str, case: str, stubs: Path, tmp_path: Path
) -> None:
    v = HOSTILE[case]
    s = said(v)
    target = k8s_target("k8s", v, v, v, "pod-0")
    kind = said(v.lower())
    (merge,) = argvs(shell, model_rec(target, v), stubs, tmp_path / "model")
    assert merge[:8] == ["kubectl", "-n", s, "patch", kind, s, "--type=merge", "-p"]
    selector = json.loads(merge[8])["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"nvidia.com/gpu.product": said(v).replace(" ", "-")}
    for cause, resource, value in (("cpu", "cpu", "16"), ("memory", "memory", "16Mi")):
        (patch,) = argvs(shell, stranding_rec(target, cause), stubs, tmp_path / cause)
        assert patch[:8] == ["kubectl", "-n", s, "patch", kind, s, "--type=json", "-p"]
        assert json.loads(patch[8]) == [
            {"op": "add", "value": value,
             "path": f"/spec/template/spec/containers/0/resources/requests/{resource}"}
        ]  # fmt: skip
    assert argvs(shell, pack_rec(target), stubs, tmp_path / "pack") == []  # comments only


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", IN_RECORDS)
def test_slurm_lines_run_nothing(shell: str, case: str, stubs: Path, tmp_path: Path) -> None:
    v = HOSTILE[case]
    target = slurm_target("hpc", v, v, v, v)
    for i, rec in enumerate((model_rec(target, v), stranding_rec(target, "cpu"), pack_rec(target))):
        assert all(line.startswith("#") for line in rec.apply.splitlines())
        assert run_in(shell, rec.apply, stubs, tmp_path / str(i)) == []
