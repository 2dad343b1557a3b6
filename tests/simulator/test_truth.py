"""The simulator's ground truth counts GPU-equivalents (DESIGN.md): a MIG slice its share of its
physical GPU, a partitioned GPU's capacity one GPU, the share no slice covers unallocated. The
answers here are computed by hand, and compared exactly (the truth has no float drift)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.schemas.topics import SAMPLES
from gpugap.schemas.types import ActivityMetric, format_utc
from gpugap.simulator import build, loss, scenario
from gpugap.simulator.activity import Program, constant, value
from gpugap.simulator.emit import Emitter, Stats
from gpugap.simulator.estate import Device
from gpugap.simulator.estate import build as build_estate
from gpugap.simulator.loss import loss_draw, lost_samples, naming_samples
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


def hold(
    plan: Plan,
    n: int,
    d: Device,
    span: tuple[int, int],
    program: Program,
    *,
    attribution: bytes = b"",
) -> None:
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
    plan.hold(a, d, Holding(d, start, end, program, 1024.0, a, attribution))


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


# --- lost samples: missed scrapes leave their seconds unmeasured ----------------------------

LOSSY = """
[scenario]
name = "lossy"
start = 2026-11-02T08:00:00Z
duration = "10m"
sample_interval = "10s"
idle_threshold = 0.05
idle_minutes = 3

[faults]
sample_loss_rate = 0.5

[teams]
vision = ["alice"]

[[clusters]]
name = "one"
scheduler = "kubernetes"

[[clusters.node_groups]]
name = "l40s"
count = 1
gpus = 2
model = "NVIDIA L40S"
"""


def lossy(text: str = LOSSY) -> tuple[scenario.Scenario, Plan]:
    """One node of 2 GPUs sampled at 10 s, 20 s, ... (slot edges on whole minutes)."""
    sc = scenario.parse(text)
    estate = build_estate(sc)
    [node] = estate.nodes
    node.offset = 0
    for d in node.devices:
        d.offset = 0
    return sc, Plan(estate, 2 * HOUR)


def emit(sc: scenario.Scenario, plan: Plan, window: int, out: Path) -> tuple[list[Any], Stats]:
    """Run the emitter into JSON lines; the records it wrote (malformed ones as envelopes)."""
    pub = JsonlPublisher(out)

    async def run() -> Stats:
        await pub.start()
        try:
            return await Emitter(sc, plan, window).run(pub)
        finally:
            await pub.close()

    stats = asyncio.run(run())
    return [json.loads(line) for line in out.read_bytes().splitlines()], stats


def sample_times(records: list[Any], sc: scenario.Scenario) -> list[tuple[str, int]]:
    """(node, seconds after the start) of every valid node sample, in delivery order."""
    start = sc.scenario.start
    text = {format_utc(start + timedelta(seconds=t)): t for t in range(2 * HOUR + 1)}
    return [
        (r["value"]["node"], text[r["value"]["time"]])
        for r in records
        if r["topic"] == SAMPLES.name and "value" in r
    ]


def test_the_loss_draw_is_deterministic_and_near_its_rate() -> None:
    draws = [loss_draw(1, "c", f"n{i}", t) for i in range(20) for t in range(10, 100_010, 10)]
    assert draws == [
        loss_draw(1, "c", f"n{i}", t) for i in range(20) for t in range(10, 100_010, 10)
    ]
    assert draws[:50] != [loss_draw(2, "c", "n0", t) for t in range(10, 510, 10)]  # the seed
    assert all(0 <= x < 1 for x in draws)
    lost = sum(x < 0.03 for x in draws) / len(draws)  # 200,000 draws: sigma 0.0004
    assert 0.028 < lost < 0.032
    # over a scenario: the small estate for a day loses about 3 % of each node's samples
    sc = scenario.load("small")
    assert sc.faults.sample_loss_rate == 0.03
    plan = build(sc, 6 * HOUR)
    for node in plan.estate.nodes:
        gone = lost_samples(sc.scenario.seed, 0.03, node, 6 * HOUR)
        assert gone == lost_samples(sc.scenario.seed, 0.03, node, 6 * HOUR)
        assert 0.01 < len(gone) / (6 * HOUR / node.interval) < 0.05
        assert not gone & naming_samples(node)
        assert lost_samples(sc.scenario.seed, 0.0, node, 6 * HOUR) == frozenset()


@pytest.fixture
def lost_at(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The sample times to lose (at rate 0.5): the draw says 0 for them and 0.99 else."""
    times: set[int] = set()
    monkeypatch.setattr(loss, "loss_draw", lambda _s, _c, _n, t: 0.0 if t in times else 0.99)
    return times


def test_lost_samples_are_not_sent_and_their_seconds_are_unmeasured(
    lost_at: set[int], tmp_path: Path
) -> None:
    window = 600
    sc, plan = lossy()
    idle, low = plan.estate.devices()
    hold(plan, 1, idle, (0, 2 * HOUR), constant(0, 0))  # held past the window's end
    hold(plan, 2, low, (0, 2 * HOUR), constant(0, 55))  # 0.055: just above the threshold
    # minute 0 loses (30, 40], minutes 1 and 2 a slot each, minute 4 all of (240, 300]
    lost_at.update({40, 100, 160, 250, 260, 270, 280, 290, 300})
    records, stats = emit(sc, plan, window, tmp_path / "e.jsonl")
    [node] = plan.estate.nodes
    sent = sample_times(records, sc)
    assert sorted(t for _, t in sent) == [t for t in range(10, 610, 10) if t not in lost_at]
    assert stats.lost[SAMPLES.name] == 9 and stats.records[SAMPLES.name] == 51
    assert {n for n, _ in sent} == {node.name}

    t = compute(sc, plan, window)
    by_id = {a["id"]: a for a in t["allocations"]}
    one, two = by_id["k8s/one/pod-1"], by_id["k8s/one/pod-2"]
    for a in (one, two):
        assert a["allocated_gpu_s"] == 600
        assert a["unmeasured_gpu_s"] == 9 * 10  # nine 10 s slots nobody measured
    # 0.055 over the 51 slots sent, nothing over the 9 lost (unmeasured, not zero use)
    assert two["consumed_gpu_s"] == 0.055 * 510
    assert one["consumed_gpu_s"] == 0
    assert t["totals"]["unmeasured_gpu_s"] == 180
    for dim in ("by_class", "by_scheduler", "by_team", "by_cluster", "by_pattern"):
        assert sum(r["unmeasured_gpu_s"] for r in t[dim].values()) == 180, dim
    assert t["by_cluster"]["one"]["consumed_gpu_s"] == 0.055 * 510

    # idle minutes: minute 0 (50 s measured, all idle) still counts; minute 4 (none measured)
    # breaks the run: minutes 0-3 and 5-9, two episodes of one GPU
    eps = [e for e in t["idle_episodes"] if e["allocation_id"] == one["id"]]
    assert [(e["start"], e["minutes"]) for e in eps] == [
        ("2026-11-02T08:00:00.000Z", 4),
        ("2026-11-02T08:05:00.000Z", 5),
    ]
    assert one["idle_gpu_s"] == 9 * 60
    # 0.055 is above 0.05 averaged over the measured seconds, though 2.75 GPU-s in a minute
    # with 50 s measured would be below 0.05 x 60 s: not idle
    assert two["idle_gpu_s"] == 0
    assert not [e for e in t["idle_episodes"] if e["allocation_id"] == two["id"]]


def test_a_partly_lost_slot_at_the_window_edge_is_clipped(lost_at: set[int]) -> None:
    sc, plan = lossy()
    [d, _] = plan.estate.devices()
    hold(plan, 1, d, (-300, 35), constant(-300, 500))  # held from before the window to 35 s
    lost_at.update({20, 40, 50})  # (10, 20] inside; (30, 40] meets 5 s of it; (40, 50] none
    [a] = compute(sc, plan, 600)["allocations"]
    assert a["allocated_gpu_s"] == 35
    assert a["unmeasured_gpu_s"] == 10 + 5
    assert a["consumed_gpu_s"] == 0.5 * 20  # slots (0, 10], (20, 30]; (30, 40] straddles


def test_a_pods_first_naming_sample_is_never_lost(tmp_path: Path) -> None:
    sc, plan = lossy(LOSSY.replace("sample_loss_rate = 0.5", "sample_loss_rate = 1.0"))

    def pod(name: str) -> bytes:
        return f',"attribution":{{"pod":"{name}","namespace":"ns","container":"main"}}'.encode()

    g0, g1 = plan.estate.devices()
    hold(plan, 1, g0, (-100, 25), constant(-100, 300), attribution=pod("a"))  # first named at 10 s
    hold(plan, 2, g0, (25, 200), constant(25, 300), attribution=pod("b"))  # at 30 s
    hold(
        plan, 3, g0, (203, 207), constant(203, 300), attribution=pod("c")
    )  # between samples: never
    hold(plan, 4, g1, (-50, 5), constant(-50, 300))  # a Slurm-like holding: nothing to keep
    hold(plan, 5, g1, (5, 2 * HOUR), constant(5, 300), attribution=pod("d"))  # at 10 s
    [node] = plan.estate.nodes
    assert naming_samples(node) == {10, 30}
    # everything else is lost at rate 1
    gone = lost_samples(sc.scenario.seed, 1.0, node, 600)
    assert gone == {t for t in range(10, 610, 10)} - {10, 30}
    records, stats = emit(sc, plan, 600, tmp_path / "e.jsonl")
    assert sorted(t for _, t in sample_times(records, sc)) == [10, 30]
    named = {
        g["attribution"]["pod"]
        for r in records
        if r["topic"] == SAMPLES.name and "value" in r
        for g in r["value"]["gpus"]
        if "attribution" in g
    }
    assert named == {"a", "b", "d"}
    assert stats.lost[SAMPLES.name] == 58


def test_without_losses_the_truth_is_as_before() -> None:
    text = (Path(scenario.__file__).parent / "scenarios" / "small.toml").read_text()
    assert "sample_loss_rate = 0.03" in text
    without_field = scenario.parse(
        "\n".join(line for line in text.splitlines() if "sample_loss_rate" not in line)
    )
    zero = scenario.parse(text.replace("sample_loss_rate = 0.03", "sample_loss_rate = 0.0"))
    assert without_field.faults.sample_loss_rate == 0
    before = compute(without_field, build(without_field), HOUR)
    assert compute(zero, build(zero), HOUR) == before
    assert before["totals"]["unmeasured_gpu_s"] == 0
    assert all(a["unmeasured_gpu_s"] == 0 for a in before["allocations"])

    # with losses: the same allocations and seconds held; consumption falls by exactly what
    # the lost slots held, computed here sample by sample
    lossy_sc = scenario.load("small")
    plan = build(lossy_sc)
    after = compute(lossy_sc, plan, HOUR)
    assert [a["allocated_gpu_s"] for a in after["allocations"]] == [
        a["allocated_gpu_s"] for a in before["allocations"]
    ]
    shares = Shares(plan.estate.devices())
    in_lost = 0
    for node in plan.estate.nodes:
        for t in lost_samples(lossy_sc.scenario.seed, 0.03, node, HOUR):
            for d in node.devices:
                for h in d.timeline:
                    if h.start <= t - node.interval and t < h.end and h.alloc is not None:
                        a = value(h.program, d.noise_base, d.quantum, t, node.interval)
                        seconds = min(t, HOUR) - max(t - node.interval, 0)
                        in_lost += a * seconds * shares[d]
    lost_gpu_s = in_lost / (1000 * shares.scale)
    drop = before["totals"]["consumed_gpu_s"] - after["totals"]["consumed_gpu_s"]
    assert lost_gpu_s > 0 and drop == pytest.approx(lost_gpu_s, abs=1e-6)
    assert after["totals"]["unmeasured_gpu_s"] > 0


def test_losses_leave_the_other_faults_as_they_were(tmp_path: Path) -> None:
    """The loss is a hash, not the emitter's random draws: with losses, the records are those
    without, less the lost samples (late, duplicated and malformed as before)."""
    window = 600
    small = scenario.load("small")

    def with_faults(loss_rate: float) -> scenario.Scenario:
        # faults often enough that many lost samples would have had one
        rates = {"sample_late_rate": 0.1, "sample_duplicate_rate": 0.1, "malformed_rate": 0.1}
        faults = small.faults.model_copy(update={**rates, "sample_loss_rate": loss_rate})
        return small.model_copy(update={"faults": faults})

    zero, lossy_sc = with_faults(0.0), with_faults(0.3)
    full, _ = emit(zero, build(zero, window), window, tmp_path / "full.jsonl")
    plan = build(lossy_sc, window)
    some, stats = emit(lossy_sc, plan, window, tmp_path / "some.jsonl")
    gone = {
        (node.name, t)
        for node in plan.estate.nodes
        for t in lost_samples(lossy_sc.scenario.seed, 0.3, node, window)
    }
    assert stats.lost[SAMPLES.name] == len(gone) > 0
    start = lossy_sc.scenario.start
    texts = {(n, format_utc(start + timedelta(seconds=t))) for n, t in gone}

    def valid(records: list[Any]) -> list[Any]:
        return [
            r
            for r in records
            if "value" in r
            and (
                r["topic"] != SAMPLES.name or (r["value"]["node"], r["value"]["time"]) not in texts
            )
        ]

    kept = valid(full)
    assert len(kept) < len([r for r in full if "value" in r])  # some were lost
    assert valid(some) == kept  # and nothing else changed, order included


def test_a_nodes_first_sample_is_never_lost() -> None:
    """The stream counts a GPU's capacity from its first report, the truth from the window's
    start: losing a node's first sample would leave capacity the truth counts unreported."""
    sc, plan = lossy(LOSSY.replace("sample_loss_rate = 0.5", "sample_loss_rate = 1.0"))
    [node] = plan.estate.nodes
    gone = lost_samples(sc.scenario.seed, 1.0, node, 600)
    assert loss.first_sample(node) == 10 and 10 not in gone
    assert gone == {t for t in range(20, 610, 10)}
