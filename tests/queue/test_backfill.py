"""The backfill model on schedules computed by hand (docs/queue.md), and its invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugap.queue.backfill import Partition, QueuedJob, Start, replay

ONE_NODE = Partition(nodes=1, gpus_per_node=4)
TWO_NODES = Partition(nodes=2, gpus_per_node=4)


def job(
    id: str, at: float, gpus: int, run: float, limit: float, *, nodes: int = 1, **kw: object
) -> QueuedJob:
    return QueuedJob(id, at, nodes, gpus, limit, run, **kw)  # type: ignore[arg-type]


def starts(
    js: list[QueuedJob], p: Partition = ONE_NODE, **kw: int
) -> dict[str, tuple[float, bool]]:
    return {s.id: (s.start_s, s.backfilled) for s in replay(js, p, **kw)}


def test_jobs_that_fit_start_when_submitted() -> None:
    out = replay([job("a", 0, 2, 10, 60), job("b", 5, 2, 10, 60)], ONE_NODE)
    assert out == [Start("a", 0, 10, 0, False), Start("b", 5, 15, 0, False)]


def test_a_short_job_backfills_ahead_of_the_blocked_one() -> None:
    # a holds 2 of 4 GPUs and plans to end at 120; b needs all 4 (reserved at 120); c's limit
    # ends at 62 <= 120, so it runs in the hole, and delays b by the 2 s it outlives a
    js = [job("a", 0, 2, 20, 120), job("b", 1, 4, 20, 120), job("c", 2, 2, 20, 60)]
    out = {s.id: s for s in replay(js, ONE_NODE)}
    assert starts(js) == {"a": (0, False), "c": (2, True), "b": (22, False)}
    assert out["b"].wait_s == 21 and out["c"].end_s == 22


def test_a_padded_job_cannot_backfill() -> None:
    # the same c asking for 10 minutes: its limit passes the reservation at 120 and b needs
    # every GPU, so it waits until b is done
    js = [job("a", 0, 2, 20, 120), job("b", 1, 4, 20, 120), job("c", 2, 2, 20, 600)]
    assert starts(js) == {"a": (0, False), "b": (20, False), "c": (40, False)}


def test_a_long_job_backfills_where_the_reservation_does_not_need_it() -> None:
    # node 0: a (4 GPUs, to 100); node 1: x (2 GPUs, to 1000). b needs a whole node: reserved
    # on node 0 at 100. d (2 GPUs, limit 5000) fits on node 1 and leaves node 0 to b
    js = [
        job("a", 0, 4, 100, 100),
        job("x", 0, 2, 1000, 1000),
        job("b", 1, 4, 50, 100),
        job("d", 2, 2, 5000, 5000),
    ]
    assert starts(js, TWO_NODES) == {
        "a": (0, False), "x": (0, False), "d": (2, True), "b": (100, False),
    }  # fmt: skip


def test_a_long_job_waits_where_the_reservation_needs_its_node() -> None:
    # x now ends at 50, so b is reserved on node 1 at 50; d would take half of node 1 past 50
    js = [
        job("a", 0, 4, 100, 100),
        job("x", 0, 2, 50, 50),
        job("b", 1, 4, 50, 100),
        job("d", 2, 2, 5000, 5000),
    ]
    assert starts(js, TWO_NODES) == {
        "a": (0, False), "x": (0, False), "b": (50, False), "d": (100, False),
    }  # fmt: skip


def test_multi_node_jobs_need_whole_nodes_worth() -> None:
    # a holds 2 GPUs on each node to 100; b (2 nodes x 2) takes the other halves at once; c
    # (one node x 2) starts when b is done; d needs a whole node, free only when a ends
    js = [
        job("a", 0, 2, 100, 100, nodes=2),
        job("b", 1, 2, 10, 10, nodes=2),
        job("c", 2, 2, 1, 1),
        job("d", 3, 4, 1, 1),
    ]
    assert starts(js, TWO_NODES) == {
        "a": (0, False), "b": (1, False), "c": (11, False), "d": (100, False),
    }  # fmt: skip


def test_priority_by_recorded_start_order() -> None:
    js = [
        job("a", 0, 4, 10, 10),
        job("b", 1, 4, 10, 10, order=5.0),
        job("c", 2, 4, 10, 10, order=3.0),
    ]
    assert starts(js) == {"a": (0, False), "c": (10, False), "b": (20, False)}


def test_a_job_ends_at_its_limit() -> None:
    assert replay([job("a", 0, 1, 100, 50)], ONE_NODE)[0].end_s == 50


def test_unlimited_running_jobs_leave_no_reservation_to_protect() -> None:
    # a never plans to end: b's shadow time is infinite, so any job that fits backfills
    js = [job("a", 0, 2, 100, math.inf), job("b", 1, 4, 10, 10), job("c", 2, 2, 500, 1000)]
    assert starts(js) == {"a": (0, False), "c": (2, True), "b": (502, False)}


def test_max_job_test_bounds_the_backfill_scan() -> None:
    js = [
        job("a", 0, 2, 100, 100),
        job("b", 1, 4, 10, 10),
        job("c", 2, 4, 10, 10),  # blocked too: tested, not started
        job("d", 3, 2, 10, 10),
    ]
    assert starts(js)["d"] == (3, True)
    # testing only c, d waits behind b (100-110) and c (110-120)
    assert starts(js, max_job_test=1)["d"] == (120, False)


def test_a_job_larger_than_the_partition_is_an_error() -> None:
    with pytest.raises(ValueError, match="asks for 1 x 8 GPUs; the partition has 1 x 4"):
        replay([job("big", 0, 8, 1, 1)], ONE_NODE)


shapes = st.tuples(
    st.integers(0, 500),  # submit
    st.integers(1, 2),  # nodes
    st.integers(1, 4),  # GPUs per node
    st.integers(1, 300),  # run
    st.integers(0, 600),  # padding
)


@settings(max_examples=200, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=40))
def test_never_oversubscribed_never_early_every_job_runs(rows: list[tuple[int, ...]]) -> None:
    js = [job(f"j{i}", s, g, r, r + pad, nodes=n) for i, (s, n, g, r, pad) in enumerate(rows)]
    out = replay(js, TWO_NODES)
    assert sorted(s.id for s in out) == sorted(j.id for j in js)
    by_id = {j.id: j for j in js}
    events = []
    for s in out:
        j = by_id[s.id]
        assert s.start_s >= j.submit_s and s.end_s == s.start_s + min(j.run_s, j.limit_s)
        events += [(s.start_s, 1, j.gpus), (s.end_s, 0, -j.gpus)]
    used = 0
    for _t, _kind, d in sorted(events):  # ends before starts at the same time
        used += d
        assert 0 <= used <= 8
