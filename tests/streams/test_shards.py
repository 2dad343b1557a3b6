"""The state split into shards gives what one shard gives: the same minutes, allocations and
final alerts, and one partitioner for the shards and every producer."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.producers.slurm.wire import partition_for as wire_partition_for
from gpugap.schemas import decode
from gpugap.schemas.clock import ms
from gpugap.schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    DEAD_LETTER,
    K8S_PODS,
    MINUTES,
    SAMPLES,
    SLURM_JOBS,
)
from gpugap.schemas.types import AlertState
from gpugap.streams.checkpoint import keep_restored, start_offset
from gpugap.streams.core import CoreConfig
from gpugap.streams.join import Join, partition_for
from gpugap.streams.process import Processor
from tests.harness.capture import Capture, Msg
from tests.harness.demo_data import simulate
from tests.streams.helpers import T, slurm
from tests.streams.test_idle import CFG as IDLE
from tests.streams.test_idle import by_minute

INPUTS = {SAMPLES.name, SLURM_JOBS.name, K8S_PODS.name}
CFG = CoreConfig(max_future_ms=None, max_past_ms=None)


def test_the_shards_partition_keys_as_the_producers_do() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        key = "".join(rng.choice("abcz019/-_.") for _ in range(rng.randint(1, 40)))
        for n in (1, 2, 6, 7, 64):
            assert partition_for(key, n) == wire_partition_for(key.encode(), n), (key, n)


async def run(messages: Sequence[Msg], partitions: int) -> Capture:
    out = Capture()
    join = Join(out, "", CFG, partitions=partitions)  # every shard here: merged locally
    offsets: dict[tuple[str, int], int] = {}
    for topic, key, value, ts in messages:
        if topic not in INPUTS:
            continue
        p = partition_for(key.decode(), partitions) if topic == SAMPLES.name and key else 0
        off = offsets[topic, p] = offsets.get((topic, p), -1) + 1
        await join.ingest((topic, p), RawMessage(topic, p, off, key, value, ts))
        if off % 97 == 0:
            await join.drain(float("inf"))  # marks and merges on the way, as a worker does
    await join.flush_all()
    return out


def outputs(cap: Capture) -> dict[str, Any]:
    minutes, allocations, final = set(), set(), {}
    for topic, _, value, _ in cap.messages:
        if topic == MINUTES.name:
            minutes.add(value)
        elif topic == ALLOCATIONS.name:
            allocations.add(value)
        elif topic == ALERTS.name:
            a = decode(ALERTS, value)
            final[a.alert_id] = (a.state, a.opened_at, a.resolved_at, a.nodes, a.idle_minutes)
    return {"minutes": minutes, "allocations": allocations, "alerts": final}


def telemetry_minutes(minutes: set[bytes], since: str) -> set[bytes]:
    """The minutes from ``since`` (the simulator's telemetry begins at its window's start).

    Before a node's first sample its pods' GPUs are not known (a pod's GPU is learned from the
    first sample naming it): a minute the shard's clock closes before that sample comes holds
    stand-in GPUs (whole), one closed after it the pod's slice. Which happens depends on what
    else the shard has read by then, so one shard and six differ there (pods bound before the
    window on a node whose first sample comes after other nodes'), and nowhere else."""
    return {m for m in minutes if json.loads(m)["minute"] >= since}


def test_six_shards_give_what_one_gives() -> None:
    messages = simulate("small")
    one, six = (outputs(asyncio.run(run(messages, n))) for n in (1, 6))
    assert one["minutes"] and one["alerts"]
    window = "2026-11-02T08:00:00"  # small.toml's start
    assert telemetry_minutes(six["minutes"], window) == telemetry_minutes(one["minutes"], window)
    assert six["allocations"] == one["allocations"]
    assert six["alerts"] == one["alerts"]


def test_a_merger_resolves_only_once_every_shard_has_passed() -> None:
    merger = Processor(CoreConfig())
    assert merger.mark(0, 10_000_000, False, 3) == []
    assert merger.mark(1, None, False, 3) == []  # shard 1 has taken nothing yet
    assert not merger.settled()
    merger.mark(1, 5_000_000, False, 3)
    merger.mark(2, 7_000_000, True, 3)
    assert merger.state["marks"]["1"] == [5_000_000, False]
    merger.mark(1, 4_000_000, False, 3)  # said again from an older checkpoint: kept
    assert merger.state["marks"]["1"] == [5_000_000, False]
    for s in range(3):
        merger.mark(s, 10_000_000, True, 3)
    assert merger.settled()


def test_restored_points_stay_until_read_past_and_keep_their_taken_offsets() -> None:
    restored = {"t:0": [100, [104, 109]], "t:1": 50}
    now = {"t:0": [102, [103]], "t:1": 40, "t:2": 7}
    points = keep_restored(restored, now)
    assert points["t:0"] == [102, [103, 104, 109]]  # 104 and 109 are in the restored state
    assert points["t:1"] == 50  # not read past the restored point yet
    assert points["t:2"] == 7
    assert start_offset({0: {"t:0": 100}, 1: {"t:0": [80, [81]]}}, "t:0", [0, 1]) == 80
    assert start_offset({0: {"t:0": 100}, 1: {}}, "t:0", [0, 1]) is None


def test_a_mark_that_is_not_one_of_the_groups_shards_is_a_dead_letter() -> None:
    async def go() -> tuple[Any, list[str]]:
        out = Capture()
        join = Join(out, "", CFG, partitions=3, episodes_topic="episodes")
        join.restore({}, [0])
        bad = [
            {"mark": 7, "watermark": 1, "final": True},  # no shard 7 in a group of 3
            {"mark": 1, "watermark": "soon", "final": False},
            {"mark": 2, "watermark": 5, "final": "false"},
        ]
        for i, m in enumerate(bad):
            raw = RawMessage("episodes", 0, i, b"mark", json.dumps(m).encode())
            await join.ingest(("episodes", 0), raw)
        good = {"mark": 1, "watermark": 5, "final": False}
        raw = RawMessage("episodes", 0, 3, b"mark", json.dumps(good).encode())
        await join.ingest(("episodes", 0), raw)
        dead = [
            decode(DEAD_LETTER, v).reason for t, _, v, _ in out.messages if t == DEAD_LETTER.name
        ]
        return join.shards[0].state.get("marks"), dead

    marks, dead = asyncio.run(go())
    assert len(dead) == 3 and all("not an idle episode or mark" in r for r in dead), dead
    assert marks == {"1": [5, False]}  # only the good one counts


def test_a_restored_node_shard_sending_its_alerts_again_does_not_open_them_again() -> None:
    """A node's shard and its allocation's merger checkpoint apart: after a restart the node
    shard sends again alerts the merger has merged and resolved. They are a replay, not a
    second episode (a second alert with the first one's id would reopen it for good)."""
    node = Processor(IDLE)
    alerts = list(node.step(slurm("1", "start", "10:00:00", (0,))).alerts)
    for s in by_minute({0: [0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]}):
        alerts += node.step(s).alerts
    alerts += node.advance(120_000, merge=False).alerts
    assert alerts[0].state is AlertState.OPEN
    assert alerts[-1].state is AlertState.RESOLVED
    merger = Processor(IDLE)
    first = [m for a in alerts for m in merger.merge(a)]
    first += merger.mark(0, ms(T("10:30:00")), False, 1)
    assert first[-1].state is AlertState.RESOLVED
    assert merger.merger.state == {}
    replay = [m for a in alerts for m in merger.merge(a)] + merger.mark(0, 0, False, 1)
    assert replay == []
    # a later episode of the same allocation is a new alert
    later = alerts[0].model_copy(
        update={"alert_id": alerts[0].alert_id.rsplit("/", 1)[0] + "/2026-11-02T10:40:00.000Z"}
    )
    again = merger.merge(later)
    assert [(a.state, a.alert_id.rsplit("/", 1)[1]) for a in again] == [
        (AlertState.OPEN, "2026-11-02T10:40:00.000Z")
    ]


def test_a_merged_alerts_time_never_goes_back_when_a_slower_shard_reports() -> None:
    """Node n2's shard runs ahead of n1's: n2's reports reach the merger first. The merged
    RESOLVED record must not be older than an UPDATE before it (v_alerts takes the latest)."""
    acts = {
        "n1": [0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5],
        "n2": [0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5],
    }
    reports = {}
    for name, a in acts.items():
        node = Processor(IDLE)
        out = list(node.step(slurm("1", "start", "10:00:00", (0,), node=name)).alerts)
        for s in by_minute({0: a}):
            out += node.step(s.model_copy(update={"node": name})).alerts
        out += node.advance(120_000, merge=False).alerts
        reports[name] = out
    assert reports["n1"][-1].time < reports["n2"][-1].time
    merger = Processor(IDLE)
    sent = [m for name in ("n2", "n1") for a in reports[name] for m in merger.merge(a)]
    sent += merger.mark(0, ms(T("10:40:00")), False, 1)
    assert {a.alert_id for a in sent} == {sent[0].alert_id}
    assert sent[-1].state is AlertState.RESOLVED
    assert sent[-1].nodes == ("n1", "n2")
    times = [a.time for a in sent]
    assert times == sorted(times)
