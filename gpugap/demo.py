"""``gpugap demo``: the whole pipeline on one machine, on the embedded defaults.

Starts (or reuses) Kafka and the ClickHouse endpoint, applies the migrations, starts the
worker and the sink, replays a scenario accelerated while showing progress, prints the
capacity-gap report and where ClickHouse answers, keeps running until Ctrl-C or
``--duration``, and stops everything it started, by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpugap.errors import ConfigError, ServiceError
from gpugap.services.kafka import free_port
from gpugap.settings import ClickHouseSettings, KafkaSettings, load

PREFIX = "demo."
GPUGAP = [sys.executable, "-m", "gpugap"]
WORKER_GROUP = "gpugap-worker"  # `gpugap worker` default
SINK_GROUP = "gpugap-sink-clickhouse"  # `gpugap sink clickhouse` default


@dataclass
class DemoOptions:
    scenario: str = "demo"
    duration_s: float | None = None
    speed: float | None = None  # None: fit the scenario into the duration, else 600x
    kafka: str | None = None
    clickhouse: str | None = None
    clickhouse_port: int | None = None
    truth: Path | None = None
    save_report: Path | None = None
    data_dir: Path | None = None
    engine: str = "asyncio"


@dataclass
class Demo:
    opts: DemoOptions
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kafka_service: Any = None
    kafka: KafkaSettings | None = None
    tmp: Path | None = None
    started: float = field(default_factory=time.monotonic)
    tty: bool = field(default_factory=sys.stdout.isatty)

    # --- set-up ----------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {msg}", flush=True)

    def _start_kafka(self, state: Path) -> str:
        if self.opts.kafka:
            return self.opts.kafka
        from gpugap.services.kafka import LocalKafka
        from gpugap.settings import ServicesSettings

        self._say("starting Kafka (KRaft, local broker; the first run downloads its jars)")
        self.kafka_service = LocalKafka.ephemeral(ServicesSettings(), state / "kafka")
        status, _ = self.kafka_service.up()
        return str(status.bootstrap)

    def _start_clickhouse(self, state: Path) -> str:
        if self.opts.clickhouse:
            return self.opts.clickhouse
        port = self.opts.clickhouse_port
        if port is None:
            port = 8123 if _port_free(8123) else free_port()
        elif not _port_free(port):
            raise ConfigError(f"port {port} is already taken: choose another --clickhouse-port")
        url = f"http://127.0.0.1:{port}"
        self._say(f"starting the embedded ClickHouse endpoint on {url}")
        cmd = [*GPUGAP, "clickhouse", "serve", "--path", str(state / "clickhouse")]
        self._spawn("clickhouse", [*cmd, "--port", str(port)], {})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/ping", timeout=1):  # noqa: S310 (our own http URL)
                return url
            if self.procs["clickhouse"].poll() is not None:
                raise ServiceError("the ClickHouse endpoint exited at start: see the lines above")
            time.sleep(0.2)
        raise ServiceError(f"the ClickHouse endpoint did not answer on {url} within 60 s")

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        quiet = name in ("clickhouse", "worker", "sink")
        self.procs[name] = subprocess.Popen(
            cmd,
            env={**os.environ, **env, "GPUGAP_DEMO_DIR": str(self.tmp)},  # marks ours
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=None,
            start_new_session=True,  # Ctrl-C reaches us only; we stop them in order
        )

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        from gpugap.report import render, report_for
        from sinks.warehouse import migrate

        self.tmp = self.opts.data_dir or Path(tempfile.mkdtemp(prefix="gpugap-demo-"))
        bootstrap = self._start_kafka(self.tmp)
        url = self._start_clickhouse(self.tmp)
        self.kafka = kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=PREFIX)
        ch = load().clickhouse.model_copy(update={"url": url})
        env = {
            "GPUGAP_KAFKA_BOOTSTRAP": bootstrap,
            "GPUGAP_KAFKA_TOPIC_PREFIX": PREFIX,
            "GPUGAP_CLICKHOUSE_URL": url,
            "GPUGAP_CLICKHOUSE_DATABASE": ch.database,
        }
        migrate(ch)
        _create_topics(kafka)
        metrics = free_port()
        truth = self.opts.truth or self.tmp / "truth.json"
        sim = [*GPUGAP, "simulate", "--scenario", self.opts.scenario, "--truth", str(truth)]
        speed = self._speed()
        sim += ["--as-fast-as-possible"] if speed is None else ["--speed", str(speed)]
        quiet = {**env, "GPUGAP_LOG_LEVEL": "ERROR"}  # errors still show; chatter does not
        worker = [*GPUGAP, "worker", "--group", WORKER_GROUP, "--http", f"127.0.0.1:{metrics}"]
        worker += ["--engine", self.opts.engine, "--idle-flush", "5"]
        if speed is None:
            # publish the whole scenario first, then let the worker read it: it merges the
            # topics in event time while catching up (a live replay at hundreds of times real
            # time compresses the 120 s lateness below the producers' batching delays)
            self._say(f"publishing scenario {self.opts.scenario!r} into Kafka")
            self._spawn("simulate", sim, env)
            if self.procs["simulate"].wait() != 0:
                raise ServiceError("the simulator failed: see the lines above")
            self._spawn("worker", worker, quiet)
            self._spawn("sink", [*GPUGAP, "sink", "clickhouse"], quiet)
            self._say("worker and sink started: processing the scenario")
        else:
            lateness = max(120.0, 2.0 * speed)  # event time: ~2 wall seconds at this speed
            worker += ["--lateness", str(lateness), "--alert-lateness", str(lateness / 4)]
            self._spawn("worker", worker, quiet)
            self._spawn("sink", [*GPUGAP, "sink", "clickhouse"], quiet)
            self._say(f"replaying scenario {self.opts.scenario!r} live at {speed:,.0f}x")
            self._spawn("simulate", sim, env)
        self._progress(ch, metrics, until_done=True)
        window = json.loads(truth.read_text())["window"] if truth.exists() else None
        # the scenario's window: allocations that began before it hold GPUs with no
        # telemetry yet (stored as unmeasured), which is not what the demo is about
        since = until = None
        if window:
            since, until = (_utc(window["start"]), _utc(window["end"]))
        report = report_for(ch, since=since, until=until)
        print()
        print(render(report, "table"))
        if self.opts.save_report:
            self.opts.save_report.write_text(render(report, "json"))
        if window:
            self._say(f"ground truth of the scenario: {truth}")
        self._where(url, ch)
        self._hold()
        return 0

    def _speed(self) -> float | None:
        """None (the default): publish everything first, then process; X: a live replay."""
        if self.opts.speed is not None and self.opts.speed > 0:
            return self.opts.speed
        return None

    def _progress(self, ch: ClickHouseSettings, port: int, *, until_done: bool) -> None:
        """Print a progress line every 2 s; return once the replay is over and everything it
        produced is stored and rolled up (asked of the broker and the warehouse: a busy
        worker's /metrics may not answer, and its gauges between two batches say little)."""
        from gpugap.demo_watch import Watch, stale_rollups
        from sinks.clickhouse import ClickHouseSink
        from sinks.warehouse import connect
        from streams.join import INPUTS

        assert self.kafka is not None
        client = connect(ch)
        watch = Watch(
            self.kafka,
            {
                WORKER_GROUP: tuple(t.name for t in INPUTS),
                SINK_GROUP: tuple(t.name for t in ClickHouseSink.topics),
            },
        )
        last_msgs, last_t, settled = 0, time.monotonic(), 0
        try:
            while True:
                time.sleep(2.0)
                for name in ("worker", "sink"):
                    code = self.procs[name].poll()
                    if code is not None:
                        raise ServiceError(f"the {name} exited ({code}): see the lines above")
                m = _metrics(port)  # {} while the worker is too busy to answer
                now = time.monotonic()
                msgs = int(m.get("gpugap_worker_messages_total", last_msgs))
                rate = max(0, msgs - last_msgs) / max(1e-6, now - last_t)
                last_msgs, last_t = msgs, now
                rows, latest, alerts = client.query(
                    "SELECT (SELECT count() FROM gpu_minutes), (SELECT max(minute) FROM "
                    "gpu_minutes), (SELECT uniqExact(alert_id) FROM alerts)"
                ).result_rows[0]
                progress = watch.progress()
                lag = progress.lag[WORKER_GROUP]
                reached = f"{latest:%Y-%m-%d %H:%M}" if rows else "(nothing stored yet)"
                line = (
                    f"simulated up to {reached} | {rate:,.0f} messages/s | "
                    f"worker lag {lag:,} | GPU-minutes stored {rows:,} | alerts {alerts:,}"
                )
                if self.tty:
                    print(f"\r{line}\033[K", end="", flush=True)
                else:
                    self._say(line)
                sim_done = self.procs["simulate"].poll() is not None
                if sim_done and self.procs["simulate"].returncode != 0:
                    raise ServiceError("the simulator failed: see the lines above")
                # done: the replay ended; the worker committed past every input record and
                # closed every minute (its idle flush); the sink committed past every output
                # record; and no hour's rollup is older than its rows. Twice in a row, so a
                # flush's outputs still in flight to the broker are not missed.
                done = (
                    sim_done
                    and progress.drained
                    and m.get("gpugap_worker_open_minutes", 1) == 0
                    and stale_rollups(client) == 0
                )
                settled = settled + 1 if done else 0
                if until_done and settled >= 2:
                    return
        finally:
            watch.close()
            client.close()
            if self.tty:
                print()

    def _where(self, url: str, ch: ClickHouseSettings) -> None:
        q = "SELECT workload_class, round(sum(gap_gpu_h), 1) FROM v_capacity_gap GROUP BY 1"
        print(
            f"\nClickHouse answers at {url} (database {ch.database}, user {ch.user}"
            f"{', no password' if ch.password is None else ''}); the views are the interface:\n"
            f"  curl '{url}/?database={ch.database}' --data-binary '{q}'\n"
            f'  python -c "import clickhouse_connect as c; '
            f"print(c.get_client(host='127.0.0.1', port={url.rsplit(':', 1)[1]}, "
            f"database='{ch.database}').query('{q}').result_rows)\"\n"
            f'  gpugap report --clickhouse {url}    gpugap sql --clickhouse {url} "..."\n'
        )

    def _hold(self) -> None:
        if self.opts.duration_s is None:
            self._say("running; Ctrl-C stops everything")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
            return
        left = self.opts.duration_s - (time.monotonic() - self.started)
        if left > 0:
            self._say(f"running for {left:.0f} s more (--duration); Ctrl-C stops earlier")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(left)

    def stop(self) -> None:
        for name in ("simulate", "worker", "sink", "clickhouse"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.kafka_service is not None:
            self.kafka_service.down()
        if self.tmp is not None and self.opts.data_dir is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self._say("stopped everything the demo started")


def _utc(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    url = f"http://127.0.0.1:{port}/metrics"
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def _create_topics(kafka: KafkaSettings) -> None:
    """The inputs keep records forever: replayed records carry event times from the
    scenario's past, which time-based retention would delete under the worker."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    from schemas import TOPICS

    async def create() -> None:
        admin = AIOKafkaAdminClient(**kafka.client_options())
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            new = [
                NewTopic(kafka.topic_prefix + n, 1, 1, topic_configs={"retention.ms": "-1"})
                for n in TOPICS
                if kafka.topic_prefix + n not in existing
            ]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(new)
        finally:
            await admin.close()

    asyncio.run(create())


def run_demo(opts: DemoOptions) -> int:
    demo = Demo(opts)
    try:
        return demo.run()
    finally:
        demo.stop()


def register(sub: Any, cmd: Any) -> None:
    d = cmd(
        "demo",
        _demo_cmd,
        "the whole pipeline on the embedded defaults: Kafka, ClickHouse, worker, sink and a "
        "replayed scenario, then the capacity-gap report",
    )
    d.add_argument("--scenario", default="demo", help="small, demo (default), scale or a file")
    d.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="stop S seconds after the start (never before the report); default: Ctrl-C",
    )
    d.add_argument(
        "--speed",
        type=float,
        metavar="X",
        help="replay live at X event-time seconds per wall second, the worker running "
        "alongside (default: publish the whole scenario first, then process it)",
    )
    d.add_argument("--kafka", metavar="HOST:PORT", help="use this Kafka instead of starting one")
    d.add_argument("--clickhouse", metavar="URL", help="use this ClickHouse instead")
    d.add_argument("--clickhouse-port", type=int, metavar="PORT", help="port for the endpoint")
    d.add_argument("--truth", metavar="FILE", help="write the scenario's ground truth here")
    d.add_argument("--save-report", metavar="FILE", help="also write the report as JSON")
    d.add_argument("--data-dir", metavar="DIR", help="keep Kafka/ClickHouse data here")
    d.add_argument(
        "--engine", choices=["asyncio", "faust"], default="asyncio", help="the worker's engine"
    )


def _demo_cmd(args: Any) -> int:
    if args.duration is not None and args.duration <= 0:
        raise ConfigError("--duration must be positive seconds")
    if args.speed is not None and args.speed < 0:
        raise ConfigError("--speed must be >= 0 (0: as fast as possible)")
    return run_demo(
        DemoOptions(
            scenario=args.scenario,
            duration_s=args.duration,
            speed=args.speed,
            kafka=args.kafka,
            clickhouse=args.clickhouse,
            clickhouse_port=args.clickhouse_port,
            truth=Path(args.truth) if args.truth else None,
            save_report=Path(args.save_report) if args.save_report else None,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            engine=args.engine,
        )
    )
