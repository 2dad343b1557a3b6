"""The padding's queue cost on a schedule computed by hand (docs/queue.md, the worked example)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpugap.queue.backfill import Partition, QueuedJob, replay
from gpugap.queue.cost import Spread, figures, queue_cost, right_sized_limits

H = 3600.0
NODE = Partition(nodes=1, gpus_per_node=4)


def job(id: str, user: str, at: float, gpus: int, run: float, limit: float) -> QueuedJob:  # noqa: PLR0917
    return QueuedJob(id, at, 1, gpus, limit, run, user=user, family=f"{user}/train")


# bob holds half the node for an hour; carol needs all of it; alice's three 1-GPU jobs run
# half an hour but ask for 10 h; dave needs the whole node at 2 h
JOBS = [
    job("B", "bob", 0, 2, 1 * H, 2 * H),
    job("C", "carol", 1, 4, 1 * H, 2 * H),
    job("A1", "alice", 2, 1, 0.5 * H, 10 * H),
    job("A2", "alice", 3, 1, 0.5 * H, 10 * H),
    job("A3", "alice", 4, 1, 0.5 * H, 10 * H),
    job("D", "dave", 2 * H, 4, 1 * H, 2 * H),
]


def test_the_rule_right_sizes_alices_family_only() -> None:
    # p95 30 min + 20 % = 36 min, rounded up to 15 min: 45 min; bob, carol and dave have one
    # job each, too few for the rule
    assert right_sized_limits(JOBS) == {"alice/train": 2700.0}


def test_as_asked_alice_waits_for_carol_and_dave_waits_for_alice() -> None:
    got = {s.id: s.start_s for s in replay(JOBS, NODE)}
    # alice's 10 h limits pass carol's reservation (bob's limit, 2 h): no backfill; carol
    # starts when bob ends (1 h), alice's jobs when carol ends (2 h), dave when they end
    assert got == {"B": 0, "C": H, "A1": 2 * H, "A2": 2 * H, "A3": 2 * H, "D": 2.5 * H}


def test_right_sized_alice_runs_in_the_hole_and_dave_does_not_wait() -> None:
    sized = [replace(j, limit_s=2700.0) if j.user == "alice" else j for j in JOBS]
    got = {s.id: s.start_s for s in replay(sized, NODE)}
    # A1, A2 backfill at once (2 s + 45 min <= 2 h); A3 when A1 is done; carol when bob and
    # A3 are (3602 s), dave when carol is (7202 s)
    assert got == {"A1": 2, "A2": 3, "A3": 1802, "C": 3602, "B": 0, "D": 7202}


def test_the_queue_cost_of_alices_padding() -> None:
    cost = queue_cost(JOBS, NODE, repeats=1)
    # as asked: C 4 x 3599 s, alice 7198 + 7197 + 7196 s, D 4 x 1800 s
    asked_h = (4 * 3599 + 21591 + 4 * 1800) / H
    # right-sized: C 4 x 3601 s, A3 1798 s, D 4 x 2 s
    sized_h = (4 * 3601 + 1798 + 4 * 2) / H
    assert cost.asked.gpu_h_waited == pytest.approx(asked_h)
    assert cost.right_sized.gpu_h_waited == pytest.approx(sized_h)
    assert cost.gpu_h_freed == Spread(asked_h - sized_h, asked_h - sized_h, asked_h - sized_h)
    assert cost.jobs_right_sized == 3 and cost.repeats == 1
    assert cost.asked.makespan_s == 3.5 * H and cost.right_sized.makespan_s == 7202 + H
    assert cost.asked.backfilled == 0 and cost.right_sized.backfilled == 3
    (alice,) = cost.by_user
    assert alice.user == "alice" and alice.jobs_right_sized == 3
    assert alice.over_rule_gpu_h == pytest.approx(3 * (36000 - 2700) / H)
    # what her padding cost the others: carol waits 2 s more, dave 1798 s less
    assert alice.others_gpu_h_waited == pytest.approx((4 * 3599 + 4 * 1800) / H)
    assert alice.others_gpu_h_freed.mean == pytest.approx((4 * 3599 + 4 * 1800 - 4 * 3601 - 8) / H)
    assert alice.own_gpu_h_freed.mean == pytest.approx((21591 - 1798) / H)
    assert alice.others_gpu_h_freed.clear


def test_repeats_jitter_submit_times_and_report_the_spread() -> None:
    one = queue_cost(JOBS, NODE, repeats=1)
    five = queue_cost(JOBS, NODE, repeats=5, jitter_s=60)
    assert five.repeats == 5
    assert five.asked == one.asked  # the first replay is the recorded one
    g = five.gpu_h_freed
    assert g.low <= one.gpu_h_freed.mean <= g.high and g.low <= g.mean <= g.high
    # jobs 1 s apart reorder under 60 s of jitter (some orders leave alice's padding
    # harmless: no clear effect); under half a second they keep their order and it is clear
    assert not g.clear
    assert queue_cost(JOBS, NODE, repeats=5, jitter_s=0.5).gpu_h_freed.clear
    # a difference both ways is no clear effect
    assert not Spread.of([1.0, -2.0]).clear and Spread.of([-1.0, -2.0]).clear


def test_figures_mean_and_p95_by_nearest_rank() -> None:
    js = [job(f"j{i}", "u", 0, 1, 10, 10) for i in range(20)]
    one = Partition(nodes=1, gpus_per_node=1)
    f = figures(js, replay(js, one))
    # waits 0, 10, ..., 190: mean 95, p95 = the 19th = 180
    assert (f.jobs, f.mean_wait_s, f.p95_wait_s, f.makespan_s) == (20, 95, 180, 200)
    assert f.gpu_h_waited == pytest.approx(1900 / H)


def test_a_job_longer_than_the_new_limit_keeps_its_own() -> None:
    runs = [600.0] * 20 + [9000.0]
    js = [job(f"a{i}", "u", i * 10 * H, 1, r, 10 * H) for i, r in enumerate(runs)]
    # p95 of twenty 600 s and one 9000 s = 600 s, + 20 % -> 720 s -> 15 min
    assert right_sized_limits(js) == {"u/train": 900.0}
    sized = {s.id: s.end_s - s.start_s for s in replay(js, NODE)}
    assert sized["a20"] == 9000  # as asked, it finished
    cost = queue_cost(js, NODE)
    assert cost.jobs_right_sized == 20  # a20 keeps its 10 h: it would have been killed at 15 min


def test_a_family_with_a_timeout_is_left_alone() -> None:
    js = [job(f"a{i}", "u", i * H, 1, 600, 10 * H) for i in range(5)]
    js.append(QueuedJob("t", 6 * H, 1, 1, 600, 600, user="u", family="u/train", timed_out=True))
    assert right_sized_limits(js) == {}
