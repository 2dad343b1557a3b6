"""``gpugap job``'s advice on AMD and Intel GPUs: the recommenders' vendor rules asked of one
allocation (gpugap/job/advice.py). The estate is tests/recommend/test_vendors.py's (two 24 h
jobs per family on one GPU, 10 % busy in 6,000 MiB), written through the real sink."""

from __future__ import annotations

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.job import advice as advise
from gpugap.job.models import Allocation, GpuFigures, JobReport
from gpugap.job.report import job_report
from gpugap.recommend.batch import vendor_in
from gpugap.schemas.types import Vendor
from tests.recommend.test_vendors import NODES
from tests.recommend.test_vendors import estate as vendor_estate
from tests.warehouse.test_views import store


def kinds(settings: ClickHouseSettings, ident: str) -> dict[str, str]:
    outcome = job_report(settings, ident, None)
    assert isinstance(outcome, JobReport), outcome
    return {x.kind: x.to_value for x in outcome.advice}


def test_slices_and_models_only_for_the_vendor_they_exist_for(
    clickhouse: ClickHouseSettings,
) -> None:
    store(clickhouse, vendor_estate())
    got = {who: kinds(clickhouse, f"slurm/mix/{job}") for who, job in
           (("alice", "0"), ("erin", "10"), ("fay", "20"), ("gus", "30"))}  # fmt: skip
    assert got["alice"] == {"gpu_share": "1 x 1g.10gb", "gpu_model": "1 x L4 (inference)"}
    assert got["erin"] == {"gpu_model": "1 x MI210 (mi210)"}  # AMD: no MIG, no L4
    assert got["fay"] == {}  # Intel: no slice catalog, no smaller Intel GPU
    assert got["gus"] == {}  # a CPX partition is already a part of its GPU


def _pod(gpus: int) -> Allocation:
    return Allocation(
        cluster="k", allocation_id="k8s/k/u1", job="u1", scheduler="kubernetes",
        name="ml/train-0", owner="o", team="t", workload_class="batch", partition="",
        qos="", namespace="ml", queue="", gang_id="", gpus_requested=gpus, nodes=["n1"],
        time_limit_s=None, submit_time=None, eligible_time=None, start_time=None,
        end_time=None, elapsed_s=None, final_state=None, exit_code=None,
    )  # fmt: skip


def _gpu(device: str, needed: bool) -> GpuFigures:
    return GpuFigures(
        gpu_uuid=device, node="n1", physical_uuid=device, allocated_gpu_h=1.0,
        measured_gpu_h=1.0, consumed_gpu_h=0.5 if needed else 0.0,
        gap_gpu_h=0.5 if needed else 1.0, unmeasured_gpu_h=0.0, idle_gpu_h=0.0 if needed else 1.0,
        utilisation=0.5 if needed else 0.0, idle_share=0.0 if needed else 1.0,
        peak_activity=0.5 if needed else 0.0, peak_memory_mib=1000.0, needed=needed,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("node", "resource"),
    [("h100", "nvidia.com/gpu"), ("mi300x", "amd.com/gpu"), ("max1", "gpu.intel.com/i915")],
)
def test_a_pod_is_told_its_own_vendors_resource(node: str, resource: str) -> None:
    device = NODES[node][3]
    assert device is not None
    got = advise.gpu_count(_pod(2), [_gpu(device, True), _gpu(device, False)])
    assert got is not None and f"    {resource}: 1    # was 2" in got.apply


def test_the_vendor_of_identities() -> None:
    amd, nvidia = NODES["mi300x"][3], NODES["h100"][3]
    assert amd is not None and nvidia is not None
    assert vendor_in([amd, amd]) is Vendor.AMD
    assert vendor_in(["AMD-", "XPU-"]) is None  # two vendors: neither
    assert vendor_in([nvidia]) is Vendor.NVIDIA
    assert vendor_in(None) is Vendor.NVIDIA  # figures from before the vendors
