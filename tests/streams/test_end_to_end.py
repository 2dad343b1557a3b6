"""Simulator -> real Kafka -> worker -> ClickHouse sink -> views == the simulator's truth."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, Settings
from gpugap.producers.base import run_producer
from gpugap.schemas import TOPICS
from gpugap.services.kafka import free_port
from gpugap.simulator.simulator import Simulator
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from tests.harness.commands import run_worker

# one partition each, kept forever: the simulator stamps records weeks ago (168 h retention)
from tests.harness.topics import create_topics

pytestmark = pytest.mark.kafka


def utc(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


async def pipeline(
    kafka: KafkaSettings,
    ch: ClickHouseSettings,
    truth: Path,
    *,
    scenario: str = "small",
    duration: int | None = None,
) -> dict[str, Any]:
    await create_topics(kafka, list(TOPICS))
    t0 = time.perf_counter()
    sim = Simulator(Settings(kafka=kafka), scenario, speed=None, truth=truth, duration=duration)
    await run_producer(sim, KafkaPublisher(kafka))
    t1 = time.perf_counter()
    # the Faust app, as ``gpugap worker`` runs it
    worker = await asyncio.to_thread(run_worker, kafka, env=env_for(kafka), timeout=900)
    messages, dead = worker.messages, worker.dead
    t2 = time.perf_counter()
    await store(kafka, ch)
    t3 = time.perf_counter()
    return {
        "simulate_s": t1 - t0,
        "worker_s": t2 - t1,
        "sink_s": t3 - t2,
        "messages": messages,
        "dead": dead,
    }


GPUGAP = [sys.executable, "-m", "gpugap"]


def env_for(kafka: KafkaSettings) -> dict[str, str]:
    return {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": os.environ.get("E2E_LOG_LEVEL", "WARNING"),
    }


def close(got: float, want: float) -> bool:
    return abs(got - want) <= 0.001 * abs(want) + 1e-6


def test_small_scenario_matches_ground_truth(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    truth_path = tmp_path / "truth.json"
    run = asyncio.run(pipeline(kafka, clickhouse, truth_path))
    assert run["dead"].get("late", 0) == 0
    verify(clickhouse, json.loads(truth_path.read_text()))
    print(
        f"simulate {run['simulate_s']:.1f}s, worker {run['worker_s']:.1f}s, "
        f"sink {run['sink_s']:.1f}s, {run['messages']} messages"
    )


def test_demo_scenario_first_hours_match_ground_truth(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    # the first 2 h of the demo day (36 nodes, 288 GPUs and MIG slices, both schedulers,
    # every fault): the full day is `gpugap demo`'s job, too long for every CI run
    truth_path = tmp_path / "truth.json"
    run = asyncio.run(pipeline(kafka, clickhouse, truth_path, scenario="demo", duration=7200))
    verify(clickhouse, json.loads(truth_path.read_text()))
    print(
        f"demo 2h: simulate {run['simulate_s']:.1f}s, worker {run['worker_s']:.1f}s, "
        f"sink {run['sink_s']:.1f}s"
    )


def test_worker_killed_twice_gives_the_same_totals_and_alerts(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    asyncio.run(create_topics(kafka, list(TOPICS)))
    truth = tmp_path / "truth.json"
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": os.environ.get("E2E_LOG_LEVEL", "WARNING"),
    }
    gpugap = [sys.executable, "-m", "gpugap"]
    worker_cmd = [*gpugap, "worker", "--backfill"]
    # the whole window first, then workers that catch up: at replay speed 120 s of allowed
    # lateness is a fraction of a wall second, so a live run at 600x would test the broker's
    # fetch timing, not the worker
    sim = [*gpugap, "simulate", "--scenario", "small", "--as-fast-as-possible"]
    subprocess.run([*sim, "--truth", str(truth)], env=env, timeout=120, check=True)
    # KILL_SEED=N replays a run's kill points (printed below)
    seed = int(os.environ.get("KILL_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    kills = []
    total = 1971  # messages the small scenario publishes to the worker (+484 capacity polls)
    for _ in range(2):
        port = free_port()
        worker = subprocess.Popen(
            [
                *worker_cmd,
                "--http",
                f"127.0.0.1:{port}",
                "--max-records",
                "50",
                "--commit-interval",
                "0.1",
            ],
            env=env,
        )
        # a random point mid-run: after some records were processed, before the end
        target = rng.randint(200, total // 2)
        deadline, seen = time.monotonic() + 90, 0
        while time.monotonic() < deadline and worker.poll() is None and seen < target:
            seen = processed(port)
            time.sleep(0.02)
        worker.kill()  # SIGKILL: no clean shutdown, no last commit
        worker.wait()
        kills.append((target, seen))
        assert 0 < seen < total, f"the kill did not land mid-run (processed {seen})"
    print(f"KILL_SEED={seed}, kills (target, processed): {kills}")
    final = subprocess.run(
        [*worker_cmd, "--http", "", "--idle-flush", "1", "--idle-timeout", "3"],
        env=env,
        timeout=180,
        check=True,
    )
    assert final.returncode == 0
    asyncio.run(store(kafka, clickhouse))
    verify(clickhouse, json.loads(truth.read_text()), alerts_exactly_once=True)


def test_faust_worker_rebalanced_gives_the_same_totals_and_alerts(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    # a second worker joins mid-run (the inputs move to it, or are handed back to the first
    # one, which then restores from the table), then the first one stops: the survivor
    # finishes the run from the stored state. Two hours of the demo day (about 19,000
    # messages): `small` is read to its end before a second worker has started.
    asyncio.run(create_topics(kafka, list(TOPICS)))
    truth = tmp_path / "truth.json"
    env = env_for(kafka)
    sim = [*GPUGAP, "simulate", "--scenario", "demo", "--duration", "2h", "--as-fast-as-possible"]
    subprocess.run([*sim, "--truth", str(truth)], env=env, timeout=300, check=True)
    base = [*GPUGAP, "worker", "--max-records", "50", "--backfill"]
    first_port, second_port = free_port(), free_port()
    # a worker waiting for inputs (the group's second, or one in a rebalance) is alive: with
    # an 8 s limit its /healthz would say "stalled" by the last samples below (9-10 s after
    # the join) if that wait counted as not polling. (4 s failed a clean-clone run on a busy
    # machine: a starved 2-core box held one tick 4.6 s, a real stall, honestly reported.)
    base += ["--healthz-stale", "8"]
    first = subprocess.Popen([*base, "--http", f"127.0.0.1:{first_port}"], env=env)
    second = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and processed(first_port) < 1000:
            assert first.poll() is None, "the first worker exited"
            time.sleep(0.05)
        second = subprocess.Popen(
            [
                *base,
                *("--http", f"127.0.0.1:{second_port}"),
                # the rebalance may give it the samples: it reads them to the end within
                # the checks below, and must still be there for them
                *("--idle-flush", "1", "--idle-timeout", "12"),
            ],
            env=env,
        )
        health = []
        for i in range(10):  # the join's rebalance, and some work after it
            time.sleep(1)
            if i >= 5:
                health += [healthz(first_port), healthz(second_port)]
        assert set(health) == {200}, health
        print(f"at the first worker's stop: {processed(first_port)} processed by it")
        first.terminate()  # a clean stop: another rebalance hands everything to the second
        assert first.wait(timeout=60) == 0
        assert second.wait(timeout=300) == 0
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    asyncio.run(store(kafka, clickhouse))
    verify(clickhouse, json.loads(truth.read_text()), alerts_exactly_once=True)


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def processed(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("gpugap_worker_processed_total "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def store(kafka: KafkaSettings, ch: ClickHouseSettings) -> None:
    sink = ClickHouseSink(ch, max_age_s=0.5)
    async with KafkaPublisher(kafka) as dlq:
        await sink.run(kafka, DeadLetters(dlq, "sink", kafka.topic_prefix), idle_timeout_s=3.0)


def verify(
    clickhouse: ClickHouseSettings, truth: dict[str, Any], *, alerts_exactly_once: bool = True
) -> None:
    w0, w1 = utc(truth["window"]["start"]), utc(truth["window"]["end"])
    client = connect(clickhouse)
    try:
        rows = client.query(
            "SELECT workload_class, scheduler, team, allocation_id, sum(allocated_gpu_h), "
            "sum(consumed_gpu_h), sum(unmeasured_gpu_h) FROM v_capacity_gap "
            "WHERE hour >= %(a)s AND hour < %(b)s "
            "GROUP BY workload_class, scheduler, team, allocation_id",
            parameters={"a": w0.replace(tzinfo=None), "b": w1.replace(tzinfo=None)},
        ).result_rows
        alerts = client.query(
            "SELECT alert_id, kind, state, opened_at, resolved_at, allocation_id, gang_id "
            "FROM v_alerts"
        ).result_rows
    finally:
        client.close()
    # per allocation first: a failure then names the allocation, not only its class
    # unmeasured: the seconds lost samples would have covered (coverage by the second)
    per_alloc = {r[3]: (r[4] * 3600, r[5] * 3600, r[6] * 3600) for r in rows}
    for a in truth["allocations"]:
        g = per_alloc.get(a["id"], (0.0, 0.0, 0.0))
        assert close(g[0], a["allocated_gpu_s"]) and close(g[1], a["consumed_gpu_s"]), (a, g)
        assert close(g[2], a.get("unmeasured_gpu_s", 0.0)), (a, g)
    assert set(per_alloc) == {a["id"] for a in truth["allocations"]}
    dims = {"by_class": 0, "by_scheduler": 1, "by_team": 2}
    for name, i in dims.items():
        got: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for r in rows:
            got[r[i]][0] += r[4] * 3600
            got[r[i]][1] += r[5] * 3600
            got[r[i]][2] += r[6] * 3600
        for k, want in truth[name].items():
            assert close(got[k][0], want["allocated_gpu_s"]), (name, k, got[k], want)
            assert close(got[k][1], want["consumed_gpu_s"]), (name, k, got[k], want)
            assert close(got[k][2], want.get("unmeasured_gpu_s", 0.0)), (name, k, got[k], want)

    # every idle episode and partial gang: exactly one alert, in time, resolved when it ended
    n = truth["idle"]["minutes"]
    idle = [a for a in alerts if a[1] == "idle_gpu"]
    matched = set()
    for ep in truth["idle_episodes"]:
        s, e = utc(ep["start"]), utc(ep["end"])
        mine = [
            a
            for a in idle
            if a[5] == ep["allocation_id"]
            and a[3].replace(tzinfo=UTC).timestamp() <= e.timestamp()
            and (a[4] is None or a[4].replace(tzinfo=UTC) >= s)
        ]
        if not alerts_exactly_once:
            assert mine, ep
            matched |= {x[0] for x in mine}
            continue
        assert len(mine) == 1, (ep, mine)
        a = mine[0]
        matched.add(a[0])
        crossed = s.timestamp() + 60 * n
        assert a[3].replace(tzinfo=UTC).timestamp() <= crossed + 60, (ep, a)
        if e < w1:
            assert a[2] == "resolved" and a[4].replace(tzinfo=UTC) == e, (ep, a)
    assert matched == {a[0] for a in idle}, "an alert without an episode"
    gangs = [a for a in alerts if a[1] == "partial_gang"]
    assert len(gangs) == len(truth["partial_gangs"])
    for g in truth["partial_gangs"]:
        [a] = [x for x in gangs if x[6] == g["gang_id"]]
        assert a[3].replace(tzinfo=UTC).timestamp() <= utc(g["start"]).timestamp() + 60
        if g["end"] is not None:
            assert a[2] == "resolved" and a[4].replace(tzinfo=UTC) == utc(g["end"])
