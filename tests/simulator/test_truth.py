"""The simulator's ground truth counts GPU-equivalents (DESIGN.md): a MIG slice its share of its
physical GPU, a partitioned GPU's capacity one GPU, the share no slice covers unallocated. The
answers here are computed by hand, and compared exactly (the truth has no float drift)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpugap.schemas.types import ActivityMetric
from gpugap.simulator import build, scenario
from gpugap.simulator.activity import Program, constant
from gpugap.simulator.estate import Device
from gpugap.simulator.estate import build as build_estate
from gpugap.simulator.plan import Allocation, Holding, Plan
from gpugap.simulator.truth import Shares, compute, share_of

HOUR = 3600

SCENARIO = """
[scenario]
name = "shares"
start = 2026-11-02T08:00:00Z
duration = "1h"
sample_interval = "10s"
idle_threshold = 0.05
idle_minutes = 10

[teams]
vision = ["alice"]

[[clusters]]
name = "seven"
scheduler = "kubernetes"

[[clusters.node_groups]]
name = "a100"
count = 1
gpus = 1
model = "NVIDIA A100-SXM4-80GB"
mig_profile = "1g.10gb"

[[clusters]]
name = "two"
scheduler = "kubernetes"

[[clusters.node_groups]]
name = "a100"
count = 1
gpus = 1
model = "NVIDIA A100-SXM4-80GB"
mig_profile = "3g.40gb"
"""


def hold(plan: Plan, n: int, d: Device, span: tuple[int, int], program: Program) -> None:
    start, end = span
    a = Allocation(
        f"k8s/{d.cluster}/pod-{n}",
        "kubernetes",
        d.cluster,
        "k8s_notebook",
        "interactive",
        "alice",
        "vision",
        f"pod-{n}",
        start,
        end,
    )
    plan.allocations.append(a)
    plan.hold(a, d, Holding(d, start, end, program, 1024.0, a))


def truth() -> dict[str, Any]:
    sc = scenario.parse(SCENARIO)
    estate = build_estate(sc)
    for node in estate.nodes:  # samples at 10 s, 20 s, ...: slot edges on whole minutes
        node.offset = 0
        for d in node.devices:
            d.offset = 0
    plan = Plan(estate, 2 * HOUR)
    seven = [d for d in estate.devices() if d.cluster == "seven"]
    two = [d for d in estate.devices() if d.cluster == "two"]
    assert len(seven) == 7 and len(two) == 2
    # one 1g.10gb slice held 40 min: busy at 0.5 for 20 min, then idle for 20
    busy_then_idle = constant(0, 500)
    busy_then_idle.add(1200, 0)
    hold(plan, 1, seven[0], (0, 2400), busy_then_idle)
    # both 3g.40gb slices held the whole hour, one at 0.7: the unsliced 1/7 is left over
    hold(plan, 2, two[0], (0, 2 * HOUR), constant(0, 700))
    hold(plan, 3, two[1], (0, 2 * HOUR), constant(0, 0))
    return compute(sc, plan, HOUR)


def test_a_slice_counts_its_share_of_its_gpu() -> None:
    t = truth()
    [a] = [a for a in t["allocations"] if a["id"] == "k8s/seven/pod-1"]
    assert a["allocated_gpu_s"] == 40 * 60 / 7  # 342.857... GPU-s, not 2400
    # 0.5 x 20 min (slots (0, 10] .. (1190, 1200]); the idle half consumes nothing
    assert a["consumed_gpu_s"] == 0.5 * 1200 / 7
    # minutes 20..39 are idle: one episode of 20 minutes, 1200/7 GPU-equivalent seconds
    [ep] = [ep for ep in t["idle_episodes"] if ep["allocation_id"] == a["id"]]
    assert ep["minutes"] == 20 and ep["idle_gpu_s"] == 1200 / 7 == a["idle_gpu_s"]
    seven = t["by_cluster"]["seven"]
    assert seven["capacity_gpu_s"] == HOUR  # one physical GPU, not 7 slices x 3600
    assert seven["allocated_gpu_s"] == 2400 / 7
    assert seven["unallocated_gpu_s"] == float(HOUR - Fraction(2400, 7))


def test_a_partitioned_gpu_is_one_gpu_and_its_unsliced_share_is_unallocated() -> None:
    t = truth()
    two = t["by_cluster"]["two"]
    assert two["capacity_gpu_s"] == HOUR  # 3600 GPU-s, not 2 x 3600
    assert two["allocated_gpu_s"] == 2 * 3 * HOUR / 7
    assert two["unallocated_gpu_s"] == HOUR / 7  # both slices held: only the unsliced 1/7
    # a 3g slice busy at 0.7 all hour: slots (0, 10] .. (3590, 3600] (held on past the end)
    assert two["consumed_gpu_s"] == float(Fraction(7, 10) * HOUR * Fraction(3, 7)) == 1080
    by_id = {a["id"]: a for a in t["allocations"]}
    assert by_id["k8s/two/pod-2"]["allocated_gpu_s"] == 3 * HOUR / 7
    assert by_id["k8s/two/pod-3"]["idle_gpu_s"] == 3 * HOUR / 7  # idle all hour, at its 3/7


def test_totals_count_physical_gpus_and_devices_apart() -> None:
    t = truth()
    assert t["estate"]["devices"] == t["estate"]["mig_devices"] == 9
    assert t["estate"]["physical_gpus"] == 2
    totals = t["totals"]
    assert totals["capacity_gpu_s"] == 2 * HOUR
    allocated = Fraction(2400, 7) + Fraction(6 * HOUR, 7)
    assert totals["allocated_gpu_s"] == float(allocated)
    assert totals["unallocated_gpu_s"] == float(2 * HOUR - allocated)
    assert totals["allocated_device_s"] == 2400 + 2 * HOUR  # slice-seconds, unscaled


def _device(model: str, profile: str | None) -> Device:
    return Device(
        "c",
        "n",
        f"{model}/{profile}",
        0,
        model,
        1024.0,
        50.0,
        400.0,
        ActivityMetric.SM_ACTIVE,
        parent_uuid="GPU-x" if profile else None,
        gpu_instance_id=1 if profile else None,
        mig_profile=profile,
    )


def test_shares_are_exact_weights_over_one_denominator() -> None:
    whole = _device("NVIDIA H100 80GB HBM3", None)
    h100 = _device("NVIDIA H100 80GB HBM3", "1g.10gb")
    a100 = _device("NVIDIA A100-SXM4-80GB", "3g.40gb")
    a30 = _device("NVIDIA A30", "2g.12gb")
    unknown = _device("NVIDIA A100-SXM4-80GB", "9g.99gb")
    assert [share_of(d) for d in (whole, h100, a100, a30, unknown)] == [
        1,
        Fraction(1, 7),
        Fraction(3, 7),
        Fraction(1, 2),
        1,  # as the stream counts a slice whose share it cannot tell: a whole GPU
    ]
    shares = Shares([whole, h100, a100, a30])
    assert shares.scale == 14
    assert [shares[d] for d in (whole, h100, a100, a30)] == [14, 2, 6, 7]
    assert Shares([whole]).scale == 1


def test_the_small_scenario_counts_slices_by_share() -> None:
    sc = scenario.load("small")
    plan = build(sc)
    t = compute(sc, plan, HOUR)
    devices = plan.estate.devices()
    physical = {d.parent_uuid or d.uuid for d in devices}
    assert t["totals"]["capacity_gpu_s"] == len(physical) * HOUR < len(devices) * HOUR
    on_slices = [
        a for a in t["allocations"] if a.get("gpu_resource", "").startswith("nvidia.com/mig-")
    ]
    assert on_slices
    for a in on_slices:
        held = round(a["allocated_gpu_s"] * 7 / a["gpus"])  # 1g.10gb: 1/7 of an A100
        assert a["allocated_gpu_s"] == held * a["gpus"] / 7 and 0 < held <= HOUR
        assert a["idle_gpu_s"] <= a["allocated_gpu_s"]
