"""Several Faust workers of one group split the state like the inputs: the first 2 h of the
demo day over 6 partitions equal the ground truth with 3 workers, and again while a 4th joins
and one is SIGKILLed and restarted mid-run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import TOPICS
from gpugap.services.kafka import free_port
from gpugap.streams.join import partition_for
from gpugap.warehouse.client import connect
from tests.harness.topics import create_topics
from tests.streams.test_end_to_end import GPUGAP, env_for, processed, store, verify

pytestmark = pytest.mark.kafka

PARTITIONS = 6


def simulate(kafka: KafkaSettings, truth: Path) -> None:
    asyncio.run(create_topics(kafka, list(TOPICS), partitions=PARTITIONS))
    sim = [*GPUGAP, "simulate", "--scenario", "demo", "--duration", "2h", "--as-fast-as-possible"]
    subprocess.run([*sim, "--truth", str(truth)], env=env_for(kafka), timeout=300, check=True)


class Group:
    """Workers of one group, each with its /metrics; what each processed is kept."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.env = env_for(kafka)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.seen: list[int] = []

    def start(self) -> int:
        port = free_port()
        cmd = [
            *GPUGAP,
            "worker",
            "--backfill",
            *("--max-records", "200"),
            # idle for longer than the group's session timeout (the runtime's 10 s) before
            # stopping: after a SIGKILL the survivors must still be there when the group
            # notices and hands them the dead member's partitions (with 6 s they could all
            # have stopped first on a loaded machine, leaving those partitions to nobody)
            *("--idle-flush", "1", "--idle-timeout", "15"),
            *("--http", f"127.0.0.1:{port}"),
        ]
        self.procs.append(subprocess.Popen(cmd, env=self.env))
        self.ports.append(port)
        self.seen.append(0)
        return len(self.procs) - 1

    def poll(self) -> int:
        """Records processed so far, over the workers still running."""
        for i, port in enumerate(self.ports):
            if self.procs[i].poll() is None:
                self.seen[i] = max(self.seen[i], processed(port))
        return sum(self.seen)

    def wait_for(self, total: int, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while self.poll() < total:
            assert time.monotonic() < deadline, f"processed {self.seen}, waiting for {total}"
            time.sleep(0.05)

    def finish(self, timeout_s: float = 400) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.2)
        return [p.poll() for p in self.procs]

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def cross_shard_alerts(ch: ClickHouseSettings) -> tuple[int, int]:
    """Merged idle alerts whose nodes are on several shards, and partial-gang alerts whose
    pods are on shards other than the gang's own."""
    client = connect(ch)
    try:
        rows = client.query(
            "SELECT kind, any(cluster), groupUniqArrayArray(nodes), any(gang_id) FROM alerts"
            " WHERE kind IN ('idle_gpu', 'partial_gang') GROUP BY alert_id, kind"
        ).result_rows
    finally:
        client.close()
    merged = gangs = 0
    for kind, cluster, nodes, gang in rows:
        shards = {partition_for(f"{cluster}/{n}", PARTITIONS) for n in nodes}
        if kind == "idle_gpu" and len(shards) > 1:
            merged += 1
        if kind == "partial_gang" and shards - {partition_for(f"{cluster}/{gang}", PARTITIONS)}:
            gangs += 1
    return merged, gangs


def check(
    kafka: KafkaSettings, ch: ClickHouseSettings, truth: Path, group: Group, killed: int = -1
) -> None:
    codes = group.finish()
    assert all(c == 0 for i, c in enumerate(codes) if i != killed), f"exit codes {codes}"
    asyncio.run(store(kafka, ch))
    verify(ch, json.loads(truth.read_text()), alerts_exactly_once=True)
    merged, gangs = cross_shard_alerts(ch)
    print(f"processed per worker {group.seen}; cross-shard: {merged} merged, {gangs} gangs")
    assert merged and gangs, "the scenario should merge alerts across shards"


def three_workers(kafka: KafkaSettings, truth: Path) -> Group:
    """The scenario published, then three workers of one group well into it."""
    simulate(kafka, truth)
    group = Group(kafka)
    for _ in range(3):
        group.start()
    group.wait_for(3000)
    return group


def test_three_workers_over_six_partitions_equal_the_truth(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.json"
    group = three_workers(kafka, truth)
    try:
        check(kafka, clickhouse, truth, group)
        assert all(group.seen), f"a worker took no part: {group.seen}"
    finally:
        group.kill_all()


def test_a_fourth_worker_joins_and_one_is_killed_and_restarted(
    kafka: KafkaSettings, clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.json"
    group = three_workers(kafka, truth)
    try:
        group.start()  # a 4th joins: partitions move to it, their state with them
        group.wait_for(group.poll() + 3000)
        victim: Any = group.procs[1]
        victim.kill()  # SIGKILL: no store, no commit; its shards restore elsewhere
        victim.wait()
        group.wait_for(group.poll() + 2000)
        group.start()  # and it comes back
        check(kafka, clickhouse, truth, group, killed=1)
    finally:
        group.kill_all()
