"""AMD and Intel GPUs in the recommenders: no MIG slice (fit.py) and no NVIDIA model (model.py)
is ever proposed for a workload on another vendor's GPUs; the vendor comes from the devices'
identities (schemas.types.vendor_of: ``AMD-``, ``XPU-``), as the sink stored them. A recommender
with no catalog for a vendor says nothing. Written through the sink, read back by the
recommenders' own queries.

Cluster mix, two days (T0 to T0 + 48 h), nodes: ``h100`` (H100, 80 GiB), ``l4n1`` (L4, 24 GiB,
no telemetry: NVIDIA's, as an identity-less node is), ``mi300x`` (MI300X, 192 GiB), ``mi210``
(MI210, 64 GiB; its idle GPU's minutes name it AMD's), ``max1`` (Intel Max 1550, 128 GiB).
Every family: two 24 h jobs on one GPU, 10 % busy in 6,000 MiB (48 GPU-hours):

- alice on the H100: a 1g.10gb slice (gpu_share) and the L4 (gpu_model), as before;
- erin on an MI300X: no slice; the MI210, never the L4 (less memory, but NVIDIA's);
- fay on an Intel Max: no slice, no model (no smaller Intel GPU in the estate);
- gus on a CPX partition of an MI300X (``AMD-<uuid>/3``): a partition, not a whole GPU: nothing.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.recommend.base import HistoryWindow, k8s_target
from gpugap.recommend.batch import GpuFamily, gpu_count
from gpugap.schemas import GpuMinute, Record
from gpugap.schemas.examples import gpu_uuid
from gpugap.schemas.types import Vendor, WorkloadClass
from tests.recommend.estate import GIB, T0, gpu_minutes, job, polls, recommend
from tests.warehouse.test_views import store

END = T0 + timedelta(hours=48)


def _uuid(prefix: str, node: str, suffix: str = "") -> str:
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_DNS, node)}{suffix}"


NODES = {  # node -> (model, memory per GPU, pool, the identity of its GPU)
    "h100": ("H100", 80 * GIB, "gpu", gpu_uuid("h100", 0)),
    "l4n1": ("L4", 24 * GIB, "inference", None),
    "mi300x": ("MI300X", 192 * GIB, "mi300x", _uuid("AMD", "mi300x")),
    "mi210": ("MI210", 64 * GIB, "mi210", _uuid("AMD", "mi210")),
    "max1": ("Max-1550", 128 * GIB, "max", _uuid("XPU", "max1")),
    "cpx": ("MI300X", 192 * GIB, "mi300x", _uuid("AMD", "cpx", "/3")),
}
FAMILIES = [("alice", "h100"), ("erin", "mi300x"), ("fay", "max1"), ("gus", "cpx")]


def estate() -> list[Record]:
    out: list[Record] = []
    for node, (model, memory, pool, device) in NODES.items():
        out += polls("mix", node, model=model, memory_per_gpu=memory, pool=pool, hours=1.0)
        if node == "mi210":  # telemetry of its idle GPU: what names the node's vendor
            out.append(GpuMinute(cluster="mix", node=node, gpu_uuid=device, minute=T0,
                                 allocated_s=0.0, consumed_gpu_s=0.0, unallocated_s=60.0,
                                 activity_avg=0.0, activity_max=0.0,
                                 activity_metric="gfx_activity", sample_count=6,
                                 no_samples=False))  # fmt: skip
    for n, (user, node) in enumerate(FAMILIES):
        device = NODES[node][3]
        assert device is not None
        for d in range(2):
            job_id = f"{10 * n + d}"
            start = T0 + timedelta(hours=24 * d)
            out += job("mix", job_id, (user, "acct", "embed"), start, 24, {node: 1})
            for m in gpu_minutes("mix", f"slurm/mix/{job_id}", user, start, 24 * 60, {node: 1},
                                 0.10, 6000.0):  # fmt: skip
                out.append(m.model_copy(update={"gpu_uuid": device}))
    return out


@pytest.fixture
def stored(clickhouse: ClickHouseSettings) -> ClickHouseSettings:
    store(clickhouse, estate())
    return clickhouse


def test_a_mig_slice_only_for_nvidia_gpus(stored: ClickHouseSettings) -> None:
    _, recs = recommend(stored, "gpu_share", END)
    assert [(r.target.user, r.change.to_value) for r in recs] == [("alice", "1 x 1g.10gb")]


def test_a_smaller_model_only_of_the_same_vendor(stored: ClickHouseSettings) -> None:
    _, recs = recommend(stored, "gpu_model", END)
    moves = sorted((r.target.user, r.change.from_value, r.change.to_value) for r in recs)
    assert moves == [
        ("alice", "1 x H100", "1 x L4 (inference)"),
        ("erin", "1 x MI300X", "1 x MI210 (mi210)"),
    ]
    erin = next(r for r in recs if r.target.user == "erin")
    assert "#SBATCH --gres=gpu:MI210:1" in erin.apply and "L4" not in erin.apply


@pytest.mark.parametrize(
    ("vendor", "resource"),
    [(Vendor.NVIDIA, "nvidia.com~1gpu"), (Vendor.AMD, "amd.com~1gpu"),
     (Vendor.INTEL, "gpu.intel.com~1i915"), (None, "<the GPU resource>")],
)  # fmt: skip
def test_fewer_gpus_of_the_pods_own_resource(vendor: Vendor | None, resource: str) -> None:
    """A Deployment whose pods ask for 4 GPUs and keep 1 busy: the patch names the vendor's
    device plugin resource (as a JSON pointer), none where its GPUs name several vendors."""
    fam = GpuFamily(
        target=k8s_target("mix", "ml", "Deployment", "embed", "embed-0"),
        workload_class=WorkloadClass.BATCH, gpus=4, allocations=3, max_busy=1, mean_busy=1.0,
        sd_busy=0.0, hours=3 * 24.0, gpu_hours=3 * 96.0, consumed_gpu_hours=20.0, vendor=vendor,
    )  # fmt: skip
    rec = gpu_count(fam, HistoryWindow(END - timedelta(days=7), END, 7.0), END)
    assert rec is not None and rec.change.to_value == "1"
    assert f"/resources/limits/{resource}" in rec.apply
