"""Three simulated days (tests/backfill/three_days.toml: 8 GPUs, Slurm + Kubernetes) streamed
live, and the same days backfilled from history as a site keeps it: dcgm-exporter and
kube-state-metrics series in a REAL Prometheus (promtool's block import), Slurm's accounting
as a saved sacct dump. Both go through a real Kafka broker, the worker and the ClickHouse
sink; the backfilled report equals the live one and the ground truth within 0.1%, per class,
scheduler, team and allocation. A backfill killed halfway (SIGKILL) resumes from its
checkpoint; re-running a finished backfill publishes nothing; re-running it in full
(``--restart``, a fresh worker) changes no number in the warehouse."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher, KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, Settings
from gpugap.producers.backfill.kube import KubeStateHistory
from gpugap.producers.backfill.runner import Backfill
from gpugap.producers.backfill.settings import BackfillSettings
from gpugap.producers.backfill.slurm import SlurmHistory
from gpugap.producers.backfill.telemetry import PrometheusTelemetry
from gpugap.producers.base import run_producer
from gpugap.schemas import TOPICS, NodeSample, SlurmJobEvent
from gpugap.simulator.simulator import Simulator
from gpugap.warehouse.client import connect
from gpugap.warehouse.migrate import migrate
from tests.backfill.estate import dcgm_series, ksm_series, sacct_dump
from tests.backfill.history import Series, prometheus_with, read_jsonl
from tests.harness.commands import run_worker
from tests.harness.topics import create_topics
from tests.streams.test_end_to_end import store, utc

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(1800)]
SCENARIO = Path(__file__).with_name("three_days.toml")


def close(got: float, want: float) -> bool:
    return abs(got - want) <= 0.001 * abs(want) + 1e-3


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The scenario as published live, its truth, and a Prometheus holding its history."""
    root = tmp_path_factory.mktemp("history")
    capture, truth = root / "live.jsonl", root / "truth.json"
    sim = Simulator(Settings(), SCENARIO, speed=None, truth=truth)
    asyncio.run(run_producer(sim, JsonlPublisher(capture)))
    records = [r for _, r in read_jsonl(capture)]
    t = json.loads(truth.read_text())
    since, until = utc(t["window"]["start"]), utc(t["window"]["end"])
    series = Series()
    events = [r for r in records if not isinstance(r, NodeSample)]
    dcgm_series([r for r in records if isinstance(r, NodeSample)], events, series)
    ksm_series(events, since, until, series)
    dump = root / "sacct.txt"
    dump.write_text(sacct_dump(events))
    with prometheus_with(series, root) as prom:
        yield {
            "truth": t, "since": since, "until": until, "prom": prom, "sacct": dump,
            "capture": capture,
        }  # fmt: skip


def database(server: ClickHouseSettings) -> ClickHouseSettings:
    settings = server.model_copy(update={"database": f"t{uuid.uuid4().hex[:10]}"})
    migrate(settings)
    return settings


async def work(kafka: KafkaSettings, ch: ClickHouseSettings) -> dict[str, int]:
    """``gpugap worker`` over what is published, then the sink: the dead letters."""
    run = await asyncio.to_thread(run_worker, kafka)
    await store(kafka, ch)
    return run.dead


def of_k8s(kafka: KafkaSettings) -> KafkaSettings:
    """Where the k8s cluster's history goes: topics of its own, read by a worker of its own.
    One cluster's history published after another's into the same partitions would be late
    there: the worker's clock is per shard, and the first cluster's history has moved it to
    the end of the range (docs/backfill.md#the-worker-a-separate-backfill-run)."""
    return kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "k8s."})


def sources(
    h: dict[str, Any], kafka: KafkaSettings, cp: Path, restart: bool, *, hpc_telemetry: bool
) -> list[Backfill]:
    def cfg(cluster: str, match: str, **more: Any) -> BackfillSettings:
        return BackfillSettings(
            prometheus_url=h["prom"].url, cluster=cluster, matchers=match, checkpoint_dir=cp,
            scrape_interval_s=30.0, **more,
        )  # fmt: skip

    s, kw = Settings(kafka=kafka), {"since": h["since"], "until": h["until"], "restart": restart}
    k8s = Settings(kafka=of_k8s(kafka))
    telemetry = [PrometheusTelemetry(s, cfg("hpc", 'cluster="hpc"'), **kw)] if hpc_telemetry else []
    return [
        SlurmHistory(s, cfg("hpc", 'cluster="hpc"', chunk_s=86_400), sacct_file=h["sacct"], **kw),
        *telemetry,
        PrometheusTelemetry(k8s, cfg("k8s", 'cluster="k8s"'), **kw),
        KubeStateHistory(k8s, cfg("k8s", 'job="kube-state-metrics"'), **kw),
    ]


def telemetry_cmd(h: dict[str, Any], cp: Path) -> list[str]:
    return [
        sys.executable, "-m", "gpugap", "backfill", "prometheus", "--prometheus", h["prom"].url,
        "--cluster", "hpc", "--match", 'cluster="hpc"', "--scrape-interval", "30",
        "--checkpoint-dir", str(cp), "--since", h["since"].isoformat(),
        "--until", h["until"].isoformat(),
    ]  # fmt: skip


def kill_halfway_then_resume(h: dict[str, Any], kafka: KafkaSettings, cp: Path) -> None:
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_BACKFILL_CONCURRENCY": "2",
    }
    proc = subprocess.Popen(telemetry_cmd(h, cp), env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            done = [json.loads(f.read_text())["done"] for f in cp.glob("prometheus-hpc-*.json")]
            if done and len(done[0]) >= 20:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    [state] = [json.loads(f.read_text()) for f in cp.glob("prometheus-hpc-*.json")]
    assert 20 <= len(state["done"]) < 72, "not killed halfway"
    resumed = subprocess.run(
        telemetry_cmd(h, cp), check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stderr and "ETA" in resumed.stderr, resumed.stderr[-2000:]


def capacity(ch: ClickHouseSettings, h: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """allocated and consumed GPU-seconds by class, scheduler, team, allocation, in the window."""
    client = connect(ch)
    try:
        rows = client.query(
            "SELECT workload_class, scheduler, team, allocation_id, sum(allocated_gpu_h), "
            "sum(consumed_gpu_h) FROM v_capacity_gap WHERE hour >= %(a)s AND hour < %(b)s "
            "GROUP BY workload_class, scheduler, team, allocation_id",
            parameters={"a": _naive(h["since"]), "b": _naive(h["until"])},
        ).result_rows
    finally:
        client.close()
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for r in rows:
        for dim, key in (("by_class", r[0]), ("by_scheduler", r[1]), ("by_team", r[2]),
                         ("allocations", r[3])):  # fmt: skip
            out[dim][key][0] += r[4] * 3600
            out[dim][key][1] += r[5] * 3600
    return out


def _naive(t: datetime) -> datetime:
    return t.replace(tzinfo=None)


def against_truth(got: dict[str, dict[str, list[float]]], truth: dict[str, Any]) -> None:
    for dim in ("by_class", "by_scheduler", "by_team"):
        for k, want in truth[dim].items():
            g = got[dim][k]
            assert close(g[0], want["allocated_gpu_s"]), (dim, k, g, want)
            assert close(g[1], want["consumed_gpu_s"]), (dim, k, g, want)
    for a in truth["allocations"]:
        g = got["allocations"][a["id"]]
        assert close(g[0], a["allocated_gpu_s"]) and close(g[1], a["consumed_gpu_s"]), (a, g)


def test_three_days_backfilled_equal_the_same_days_streamed_live(
    history: dict[str, Any],
    kafka: KafkaSettings,
    clickhouse: ClickHouseSettings,
    tmp_path: Path,
) -> None:
    h, truth = history, history["truth"]
    # live: the simulator publishes the days as the producers would have, as they happened
    live_kafka = kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "live."})

    async def live() -> None:
        await create_topics(live_kafka, list(TOPICS))
        sim = Simulator(Settings(kafka=live_kafka), SCENARIO, speed=None)
        await run_producer(sim, KafkaPublisher(live_kafka))
        await work(live_kafka, clickhouse)

    asyncio.run(live())
    streamed = capacity(clickhouse, h)
    against_truth(streamed, truth)

    # backfill: the same days from history; the hpc telemetry killed halfway and resumed
    ch = database(clickhouse)
    cp = tmp_path / "checkpoints"
    started = time.monotonic()

    async def backfill(k: KafkaSettings, restart: bool = False, hpc: bool = True) -> list[int]:
        await create_topics(k, list(TOPICS))
        await create_topics(of_k8s(k), list(TOPICS))
        published = []
        for source in sources(h, k, cp, restart, hpc_telemetry=hpc):
            await run_producer(source, KafkaPublisher(source.settings.kafka))
            published.append(source.published)
        return published

    async def work_both(k: KafkaSettings, ch: ClickHouseSettings) -> dict[str, int]:
        hpc, k8s = await work(k, ch), await work(of_k8s(k), ch)
        return {kind: hpc.get(kind, 0) + k8s.get(kind, 0) for kind in {*hpc, *k8s}}

    asyncio.run(create_topics(kafka, list(TOPICS)))
    kill_halfway_then_resume(h, kafka, cp)  # the hpc telemetry: done here
    published = asyncio.run(backfill(kafka, hpc=False))
    assert all(published), published
    backfill_s = time.monotonic() - started
    dead = asyncio.run(work_both(kafka, ch))
    assert dead == {}, dead
    filled = capacity(ch, h)
    against_truth(filled, truth)
    for dim, keys in streamed.items():
        for k, (alloc, used) in keys.items():
            assert close(filled[dim][k][0], alloc) and close(filled[dim][k][1], used), (dim, k)
    print(f"backfill of 3 days: {backfill_s:.1f}s (published {published}); dead letters {dead}")

    # a finished range again: nothing published
    again = asyncio.run(
        backfill(kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "x."}))
    )
    assert again == [0, 0, 0, 0]
    # the whole range again (--restart), a fresh worker, the same warehouse: nothing changes
    fresh = kafka.model_copy(update={"topic_prefix": kafka.topic_prefix + "again."})
    asyncio.run(backfill(fresh, restart=True))
    asyncio.run(work_both(fresh, ch))
    assert capacity(ch, h) == filled


def test_history_gives_the_events_the_live_producers_gave(
    history: dict[str, Any], tmp_path: Path
) -> None:
    """Event for event: sacct (with GPU indices from dcgm-exporter's hpc_job label) and
    kube-state-metrics give the ids, kinds, times, GPUs and attribution of the live ones."""
    h = history
    live = {e.event_id: e for _, e in read_jsonl(h["capture"]) if hasattr(e, "event_id")}
    kafka = KafkaSettings()  # not used: --out
    got = {}
    for source in sources(h, kafka, tmp_path / "cp", False, hpc_telemetry=False):
        if isinstance(source, PrometheusTelemetry):
            continue
        out = tmp_path / f"{source.source}.jsonl"
        asyncio.run(run_producer(source, JsonlPublisher(out)))
        got.update({e.event_id: e for _, e in read_jsonl(out) if hasattr(e, "event_id")})
    assert set(got) == set(live)
    same = ("kind", "time", "cluster", "node", "gpus", "gpus_total", "start_time", "end_time",
            "state", "exit_code", "reason", "workload_class", "owner", "team", "user",
            "account", "job_name", "time_limit_s", "interactive", "namespace", "name")  # fmt: skip
    for event_id, e in live.items():
        for field in same:
            assert getattr(got[event_id], field, None) == getattr(e, field, None), (event_id, field)
        if isinstance(e, SlurmJobEvent) and e.kind.value == "start":  # indices from hpc_job
            assert got[event_id].nodes == e.nodes, event_id
