"""End-to-end latency at a fixed load (``python -m benchmarks worker``, second part).

A throwaway broker, the embedded ClickHouse endpoint (migrated), ``gpugap worker`` and
``gpugap sink clickhouse`` run as their own processes; this process publishes, in real time
(event time = now), ``nodes`` 8-GPU node samples every 10 s, each node running one Slurm job.
Some jobs go idle at staggered times, so that their idle alerts open during the run (an
alert opens at the end of the 10th idle minute; 11 minutes of history are published first,
as fast as possible, so the run need not last that long).

Measured, for what became due during the live part:
- a GPU-minute row (of a minute that ended during the live part): (when it was first
  queryable in ClickHouse, polled every second) - (the end of its minute); it waits the
  allowed lateness (120 s) by design, plus the sink's batch;
- an idle alert: (when the OPEN record arrived on ``alerts.v1`` / was first queryable) -
  ``opened_at`` (the event time its threshold was crossed); it waits the alert lateness (30 s);
- the workers' lag: records on their input partitions not taken yet (``gpugap_worker_lag``
  summed over the workers, read every second during the live part).

With ``workers`` > 1, the topics get that many partitions and the workers share one
group (``python -m benchmarks scale``: the ``scale`` estate's 1,350 nodes over 2 workers).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.processes import metrics, stop
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import TOPICS, GpuSample, NodeSample, SlurmJobEvent, decode
from gpugap.schemas.models import NodeGpus
from gpugap.schemas.topics import ALERTS, SAMPLES, SLURM_JOBS
from gpugap.schemas.types import (
    ActivityMetric,
    AlertKind,
    AlertState,
    EventSource,
    LifecycleKind,
    SampleSource,
    SlurmJobState,
)
from gpugap.services.kafka import free_port

CLUSTER = "bench"
HISTORY_S = 11 * 60  # published first: an alert needs 10 idle minutes
IDLE_SHARE = 10  # every 10th node's job goes idle


@dataclass(frozen=True)
class Run:
    """The running parts a watcher may look at: the topics, the warehouse, the processes
    by name (``worker0``.., ``sink``, ``notify``) and the workers' ``/metrics`` ports."""

    kafka: KafkaSettings
    clickhouse: ClickHouseSettings
    pids: dict[str, int]
    worker_ports: list[int]


@dataclass
class Seen:
    """Latencies in seconds, by what was measured."""

    minutes: list[float] = field(default_factory=list)
    alerts_topic: list[float] = field(default_factory=list)
    alerts_table: list[float] = field(default_factory=list)
    alerts_alertmanager: list[float] = field(default_factory=list)
    #: (when, records) every second, summed over the workers
    lag: list[tuple[float, float]] = field(default_factory=list)

    def live_lag(self, tick: int) -> tuple[float | None, list[float]]:
        """Seconds until the workers first had less than a tick's records (``tick``) left
        of the history published first, and the lag from then on."""
        behind = next((i for i, (_, n) in enumerate(self.lag) if n >= tick), 0)
        for i in range(behind, len(self.lag)):
            if self.lag[i][1] < tick:
                return self.lag[i][0] - self.lag[0][0], [n for _, n in self.lag[i:]]
        return None, []

    #: alert_id -> opened_at (epoch s) of the idle alerts that opened during the live part
    opened: dict[str, float] = field(default_factory=dict)
    #: OPEN records on alerts.v1 whose alert id had opened before (a replay: at-least-once)
    reopened: int = 0


#: a watcher run beside the measuring ones until the live part ends (``stop`` is set)
Watch = Callable[[Seen, asyncio.Event], Coroutine[Any, Any, None]]


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{gpu:012x}"


class Estate:
    def __init__(self, nodes: int, live_start: float, live_s: float, interval_s: int) -> None:
        self.nodes = [f"n{i:05d}" for i in range(nodes)]
        self.interval = interval_s
        self.start = (int(live_start) - HISTORY_S) // 60 * 60  # jobs start on a minute
        # one idle job per node group, its 10th idle minute ending inside the live part,
        # staggered over its minutes (an alert opens at the end of that minute)
        live_min = int(live_start) // 60 * 60
        minutes = max(1, (int(live_s) - 150) // 60)
        idle = [i for i in range(nodes) if i % IDLE_SHARE == 0]
        self.idle_from = {i: live_min - 540 + 60 * (k % minutes) for k, i in enumerate(idle)}

    def jobs(self) -> list[SlurmJobEvent]:
        t = datetime.fromtimestamp(self.start, UTC)
        return [
            SlurmJobEvent(
                event_id=f"bench/{CLUSTER}/{i}/start",
                kind=LifecycleKind.START,
                time=t,
                source=EventSource.SIMULATOR,
                cluster=CLUSTER,
                job_id=str(1000 + i),
                user="alice",
                account="vision",
                nodes=(NodeGpus(node=name, gpu_indices=tuple(range(8))),),
                gpus_total=8,
                start_time=t,
                state=SlurmJobState.RUNNING,
            )
            for i, name in enumerate(self.nodes)
        ]

    def samples(self, t: int) -> list[NodeSample]:
        when = datetime.fromtimestamp(t, UTC)
        out = []
        for i, name in enumerate(self.nodes):
            idle = t - self.interval >= self.idle_from.get(i, 1 << 62)
            gpus = tuple(
                GpuSample(
                    uuid=_uuid(i, g),
                    index=g,
                    activity=0.0 if idle else 0.3 + 0.05 * ((i + g + t // 60) % 10),
                    activity_metric=ActivityMetric.SM_ACTIVE,
                    memory_used_mib=1000.0 if idle else 40000.0,
                    power_w=80.0 if idle else 450.0,
                )
                for g in range(8)
            )
            out.append(
                NodeSample(
                    cluster=CLUSTER,
                    node=name,
                    time=when,
                    source=SampleSource.SIMULATOR,
                    interval_s=float(self.interval),
                    gpus=gpus,
                )
            )
        return out


async def produce(kafka: KafkaSettings, estate: Estate, live_start: float, end: float) -> None:
    async with KafkaPublisher(kafka) as pub:
        for job in estate.jobs():
            await pub.send(SLURM_JOBS, job)
        t = estate.start + estate.interval
        while t < end:
            if t > time.time():
                await pub.flush()
                await asyncio.sleep(t - time.time())
            for s in estate.samples(t):
                await pub.send(SAMPLES, s)
            t += estate.interval
            if t >= live_start:
                await pub.flush()


async def watch_alerts(kafka: KafkaSettings, since: float, seen: Seen, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(
        ALERTS.qualified(kafka.topic_prefix),
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await c.start()
    try:
        while not stop.is_set():
            for msgs in (await c.getmany(timeout_ms=200)).values():
                now = time.time()
                for m in msgs:
                    a = decode(ALERTS, m.value)
                    opened = a.opened_at.timestamp()
                    idle_open = a.kind is AlertKind.IDLE_GPU and a.state is AlertState.OPEN
                    if idle_open and opened >= since:
                        seen.reopened += a.alert_id in seen.opened
                        seen.alerts_topic.append(now - opened)
                        seen.opened[a.alert_id] = opened
    finally:
        await c.stop()


async def watch_tables(
    ch: ClickHouseSettings, since: float, seen: Seen, stop: asyncio.Event
) -> None:
    from gpugap.warehouse.client import connect

    client = connect(ch)
    counts: dict[int, int] = {}
    alerts: set[str] = set()
    minutes_q = (
        "SELECT toUnixTimestamp(minute), count() FROM gpu_minutes "
        "WHERE minute >= toDateTime({since:UInt32}) - 60 GROUP BY 1"
    )
    alerts_q = (
        "SELECT alert_id, toUnixTimestamp64Milli(min(opened_at)) FROM alerts "
        "WHERE state = 'open' AND kind = 'idle_gpu' AND opened_at >= toDateTime({since:UInt32}) "
        "GROUP BY alert_id"
    )
    params = {"since": int(since)}
    try:
        while not stop.is_set():
            rows = await asyncio.to_thread(
                lambda: client.query(minutes_q, parameters=params).result_rows
            )
            opened = await asyncio.to_thread(
                lambda: client.query(alerts_q, parameters=params).result_rows
            )
            now = time.time()
            for m, n in rows:
                new = n - counts.get(m, 0)
                seen.minutes += [now - (m + 60)] * new
                counts[m] = n
            for aid, ms in opened:
                if aid not in alerts:
                    alerts.add(aid)
                    seen.alerts_table.append(now - ms / 1000)
            await asyncio.sleep(1.0)
    finally:
        client.close()


async def watch_alertmanager(url: str, seen: Seen, stop: asyncio.Event) -> None:
    """Poll Alertmanager's API every second: when each idle alert first shows as active."""
    import json
    import urllib.request

    shown: set[str] = set()

    def active() -> list[dict[str, object]]:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true", timeout=5) as r:
            out: list[dict[str, object]] = json.load(r)
        return out

    while not stop.is_set():
        alerts = await asyncio.to_thread(active)
        now = time.time()
        for a in alerts:
            labels = a.get("labels")
            aid = labels.get("alert_id") if isinstance(labels, dict) else None
            if isinstance(aid, str) and aid not in shown and aid in seen.opened:
                shown.add(aid)
                seen.alerts_alertmanager.append(now - seen.opened[aid])
        await asyncio.sleep(1.0)


async def watch_lag(ports: list[int], seen: Seen, stop: asyncio.Event) -> None:
    """Every second: the records the workers' input partitions hold beyond what they took."""
    while not stop.is_set():
        try:
            ms = await asyncio.gather(*(asyncio.to_thread(metrics, p) for p in ports))
        except OSError:  # a worker between a rebalance and its next answer: next second
            ms = []
        if ms:
            lag = [v for m in ms for k, v in m.items() if k.startswith("gpugap_worker_lag{")]
            seen.lag.append((time.time(), sum(lag)))
        await asyncio.sleep(1.0)


def _row(label: str, xs: list[float], unit: str = "s") -> str:
    if not xs:
        return f"{label:<36} {0:>7}      -        -        -"
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else xs * 99
    if unit != "s":
        return f"{label:<36} {len(xs):>7,} {q[49]:>9,.0f} {q[98]:>9,.0f} {max(xs):>9,.0f}"
    return f"{label:<36} {len(xs):>7,} {q[49]:>7.1f} s {q[98]:>7.1f} s {max(xs):>7.1f} s"


async def _run(
    kafka: KafkaSettings,
    ch: ClickHouseSettings,
    estate: Estate,
    live_start: float,
    end: float,
    *,
    worker_ports: list[int],
    alertmanager: str | None = None,
    extra: Watch | None = None,
) -> Seen:
    seen, stop = Seen(), asyncio.Event()
    watchers = [
        asyncio.create_task(watch_alerts(kafka, live_start, seen, stop)),
        asyncio.create_task(watch_tables(ch, live_start, seen, stop)),
        asyncio.create_task(watch_lag(worker_ports, seen, stop)),
    ]
    if alertmanager is not None:
        watchers.append(asyncio.create_task(watch_alertmanager(alertmanager, seen, stop)))
    if extra is not None:
        watchers.append(asyncio.create_task(extra(seen, stop)))
    try:
        await produce(kafka, estate, live_start, end)
        await asyncio.sleep(5)  # the last due rows and alerts come through
    finally:
        stop.set()
        await asyncio.gather(*watchers)
    return seen


def bench_latency(
    duration_s: float,
    nodes: int,
    engine: str = "faust",
    interval_s: int = 10,
    *,
    workers: int = 1,
    alertmanager: bool = False,
    watch: Callable[[Run], Watch] | None = None,
) -> list[str]:
    """``workers``: Faust workers of one group, over topics of as many partitions.
    ``alertmanager``: also a real Alertmanager and ``gpugap notify alertmanager`` (from a
    source checkout: built like the tests build it), and when each alert shows in its API.
    ``watch``: given the running parts, a coroutine run beside the measuring ones for the
    live part (the soak's minute-by-minute report)."""
    from gpugap.groundfloor.settings import ServicesSettings
    from gpugap.services.kafka import LocalKafka
    from gpugap.warehouse.migrate import migrate
    from tests.harness.embedded_clickhouse import EmbeddedClickHouse
    from tests.harness.topics import create_topics

    with tempfile.TemporaryDirectory(prefix="gpugap-bench-latency-") as tmp:
        broker = LocalKafka.ephemeral(ServicesSettings(), Path(tmp))
        server = EmbeddedClickHouse(Path(tmp) / "clickhouse", free_port())
        procs: list[subprocess.Popen[bytes]] = []
        am = None
        if alertmanager:
            from tests.harness.alertmanager import Alertmanager, ensure_built

            # nothing listens at the receiver: routing is not what is measured
            am = Alertmanager(ensure_built(), f"http://127.0.0.1:{free_port()}/", Path(tmp) / "am")
            am.start()
        broker.up()
        try:
            server.start()
            ch = ClickHouseSettings(
                url=server.url, database="gpugap", password_file=server.password_file
            )
            migrate(ch)
            kafka = KafkaSettings(
                bootstrap=broker.bootstrap, topic_prefix=f"bl{uuid.uuid4().hex[:8]}."
            )
            asyncio.run(create_topics(kafka, list(TOPICS), workers))
            env = {
                **os.environ,
                "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
                "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
                "GPUGAP_CLICKHOUSE_URL": ch.url,
                "GPUGAP_CLICKHOUSE_DATABASE": ch.database,
                "GPUGAP_LOG_LEVEL": "WARNING",
            }
            gpugap = [sys.executable, "-m", "gpugap"]
            ports = [free_port() for _ in range(workers)]
            parts = [
                (f"worker{i}", ["worker", "--engine", engine, "--http", f"127.0.0.1:{port}"])
                for i, port in enumerate(ports)
            ]
            parts.append(("sink", ["sink", "clickhouse"]))
            if am is not None:
                env["GPUGAP_ALERTMANAGER_URLS"] = am.url
                parts.append(("notify", ["notify", "alertmanager"]))
            for name, cmd in parts:
                with open(Path(tmp) / f"{name}.log", "wb") as log:
                    procs.append(subprocess.Popen([*gpugap, *cmd], env=env, stdout=log, stderr=log))
            # all started, a group settled (a worker catches up on the history anyway)
            time.sleep(5 if workers == 1 else 15)
            live_start = time.time()
            estate = Estate(nodes, live_start, duration_s, interval_s)
            seen = asyncio.run(
                _run(
                    kafka,
                    ch,
                    estate,
                    live_start,
                    live_start + duration_s,
                    worker_ports=ports,
                    alertmanager=am.url if am is not None else None,
                    extra=None
                    if watch is None
                    else watch(
                        Run(
                            kafka,
                            ch,
                            {n: p.pid for (n, _), p in zip(parts, procs, strict=True)},
                            ports,
                        )
                    ),
                )
            )
            for (name, _), p in zip(parts, procs, strict=True):
                if p.poll() is not None:
                    text = (Path(tmp) / f"{name}.log").read_text(errors="replace")
                    raise RuntimeError(f"the {name} exited during the run:\n{text[-3000:]}")
        finally:
            stop(procs)
            server.stop()
            broker.down()
            if am is not None:
                am.close()
    rate = nodes * 8 / interval_s
    who = f"{engine} worker" if workers == 1 else f"{workers} {engine} workers of one group"
    lines = [
        f"latency at a fixed load: {nodes} nodes x 8 GPUs every {interval_s} s "
        f"({rate:,.0f} GPU samples/s), {len(estate.idle_from)} jobs going idle; {who} "
        f"+ sink + embedded ClickHouse; {duration_s:.0f} s live after {HISTORY_S // 60} min of "
        "history; lateness 120 s, alert lateness 30 s, sink batches <= 1 s",
        f"{'':<36} {'count':>7} {'p50':>9} {'p99':>9} {'max':>9}",
        _row("GPU-minute row queryable", seen.minutes),
        _row("idle alert OPEN on alerts.v1", seen.alerts_topic),
        f"  ({len(seen.opened):,} alert ids; {seen.reopened:,} OPEN records repeat one)",
        _row("idle alert OPEN queryable", seen.alerts_table),
    ]
    caught_up, lag = seen.live_lag(nodes)
    lines.append(_row("worker lag, records (every 1 s)", lag, unit="records"))
    lines.append(
        "  (the history caught up after "
        + ("never" if caught_up is None else f"{caught_up:.0f} s")
        + "; the lag from then on)"
    )
    if alertmanager:
        lines.append(_row("idle alert active in Alertmanager", seen.alerts_alertmanager))
    print("\n".join(lines), flush=True)
    return lines
