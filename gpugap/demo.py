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
import secrets
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

from pydantic import SecretStr

from gpugap.demo_watch import against_truth, create_topics, worker_metrics
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings, load
from gpugap.schemas.errors import ConfigError, ServiceError
from gpugap.services.kafka import free_port
from gpugap.warehouse.embedded.password import password_file
from gpugap.warehouse.embedded.password import read as read_password

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
    notify: tuple[str, ...] = ()  # alert targets for a `gpugap notify` beside the worker


@dataclass
class Demo:
    opts: DemoOptions
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kafka_service: Any = None
    kafka: KafkaSettings | None = None
    tmp: Path | None = None
    started: float = field(default_factory=time.monotonic)
    tty: bool = field(default_factory=sys.stdout.isatty)
    reader_password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    reader_file: Path = Path()
    admin_file: Path = Path()
    web_url: str = ""

    # --- set-up ----------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {msg}", flush=True)

    def _start_kafka(self, state: Path) -> str:
        if self.opts.kafka:
            return self.opts.kafka
        from gpugap.groundfloor.settings import ServicesSettings
        from gpugap.services.kafka import LocalKafka

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
        data = state / "clickhouse"
        cmd = [*GPUGAP, "clickhouse", "serve", "--path", str(data)]
        # passwords reach the endpoint and the page as files, never in an environment: the
        # read-only user's is the page's; the admin's the endpoint generates (password.py)
        self.reader_file = _secret_file(state / "reader.password", self.reader_password)
        self.admin_file = password_file(data)
        reader = {"GPUGAP_CLICKHOUSE_READONLY_PASSWORD_FILE": str(self.reader_file)}
        self._spawn("clickhouse", [*cmd, "--port", str(port)], reader)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/ping", timeout=1):  # noqa: S310 (our own http URL)
                return url
            if self.procs["clickhouse"].poll() is not None:
                raise ServiceError("the ClickHouse endpoint exited at start: see the lines above")
            time.sleep(0.2)
        raise ServiceError(f"the ClickHouse endpoint did not answer on {url} within 60 s")

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        quiet = name in ("clickhouse", "worker", "sink", "web")
        self.procs[name] = subprocess.Popen(
            cmd,
            env={**os.environ, **env, "GPUGAP_DEMO_DIR": str(self.tmp)},  # marks ours
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=None,
            start_new_session=True,  # Ctrl-C reaches us only; we stop them in order
        )

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        from gpugap.warehouse.migrate import migrate

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
        if not self.opts.clickhouse:  # our endpoint: its generated password, from its file
            ch = ch.model_copy(update={"password": SecretStr(read_password(self.admin_file))})
            env["GPUGAP_CLICKHOUSE_PASSWORD_FILE"] = str(self.admin_file)
        migrate(ch)
        self._start_web(env)
        create_topics(kafka, WORKER_GROUP)
        metrics = free_port()
        truth = self.opts.truth or self.tmp / "truth.json"
        sim = [*GPUGAP, "simulate", "--scenario", self.opts.scenario, "--truth", str(truth)]
        speed = self._speed()
        sim += ["--as-fast-as-possible"] if speed is None else ["--speed", str(speed)]
        quiet = {**env, "GPUGAP_LOG_LEVEL": "ERROR"}  # errors still show; chatter does not
        worker = [*GPUGAP, "worker", "--group", WORKER_GROUP, "--http", f"127.0.0.1:{metrics}"]
        worker += ["--idle-flush", "5", "--backfill"]
        if speed is None:
            # publish the whole scenario first, then let the worker read it: it merges the
            # topics in event time while catching up (a live replay at hundreds of times real
            # time compresses the 120 s lateness below the producers' batching delays)
            self._say(f"publishing scenario {self.opts.scenario!r} into Kafka")
            self._spawn("simulate", sim, env)
            if self.procs["simulate"].wait() != 0:
                raise ServiceError("the simulator failed: see the lines above")
            self._pipeline(worker, quiet, env)
            self._say("worker and sink started: processing the scenario")
        else:
            lateness = max(120.0, 2.0 * speed)  # event time: ~2 wall seconds at this speed
            worker += ["--lateness", str(lateness), "--alert-lateness", str(lateness / 4)]
            self._pipeline(worker, quiet, env)
            self._say(f"replaying scenario {self.opts.scenario!r} live at {speed:,.0f}x")
            self._spawn("simulate", sim, env)
        self._progress(ch, metrics, until_done=True)
        truth_data = json.loads(truth.read_text()) if truth.exists() else None
        window = truth_data["window"] if truth_data else None
        # the scenario's window: allocations that began before it hold GPUs with no
        # telemetry yet (stored as unmeasured), which is not what the demo is about
        since = until = None
        if window:
            since, until = (_utc(window["start"]), _utc(window["end"]))
        report = self._show(ch, since, until)
        if truth_data:
            print()
            print(against_truth(report.breakdown, truth_data))
            self._say(f"ground truth of the scenario: {truth}")
        self._recommendations(ch)
        self._where(url, ch)
        self._hold()
        return 0

    def _show(self, ch: ClickHouseSettings, since: Any, until: Any) -> Any:
        """Print the report with its queue section (and save it as JSON); the report."""
        from gpugap.queue.report import render_table
        from gpugap.queue.report import render_with as with_queue
        from gpugap.report import render, report_for

        report = report_for(ch, since=since, until=until)
        queue = self._queue(ch, since, until)
        print()
        print(render(report, "table") + (f"\n{render_table(queue)}" if queue else ""))
        if self.opts.save_report:
            doc = render(report, "json")
            self.opts.save_report.write_text(with_queue(doc, queue, "json") if queue else doc)
        return report

    def _queue(self, ch: ClickHouseSettings, since: Any, until: Any) -> Any:
        """The report's queue section (gpugap report --queue): waits and the padding's cost."""
        from gpugap.queue.report import build_queue
        from gpugap.warehouse.client import connect

        client = connect(ch)
        try:
            return build_queue(client, since, until)
        except Exception as exc:  # the demo goes on: the gap report is what it is about
            self._say(f"queue section: not computed ({exc})")
            return None
        finally:
            client.close()

    def _recommendations(self, ch: ClickHouseSettings) -> None:
        """The top recommendations (gpugap recommend compute), after the report."""
        from gpugap.recommend import recommend_for
        from gpugap.recommend.cli import summary_lines

        try:
            w, recs = recommend_for(ch, kafka=self.kafka)  # stored by the demo's sink
        except Exception as exc:  # the demo goes on: the report is what it is about
            self._say(f"recommendations: not computed ({exc})")
            return
        print()
        print(
            f"Top recommendations ({len(recs)} from {w.history_days:.1f} days; gpugap "
            "recommend list / show ID / decide ID accept --by WHO --why ...):"
        )
        print("\n".join(summary_lines(recs, 5)) if recs else "  none")

    def _speed(self) -> float | None:
        """None (the default): publish everything first, then process; X: a live replay."""
        if self.opts.speed is not None and self.opts.speed > 0:
            return self.opts.speed
        return None

    def _worker_group(self) -> str:
        # a Faust app's id is its consumer group, and it carries the topic prefix
        return PREFIX + WORKER_GROUP

    def _progress(self, ch: ClickHouseSettings, port: int, *, until_done: bool) -> None:
        """Print a progress line every 2 s; return once the replay is over and everything it
        produced is stored and rolled up (asked of the broker and the warehouse: a busy
        worker's /metrics may not answer, and its gauges between two batches say little)."""
        from gpugap.demo_watch import Watch, stale_rollups
        from gpugap.schemas.topics import SAMPLES
        from gpugap.sinks import plugin as sink_plugin
        from gpugap.warehouse.client import connect

        assert self.kafka is not None
        client = connect(ch)
        # what the worker's group commits: the workers read the scheduler topics whole,
        # outside the group (its idle flush waits for them to be read)
        committed = (SAMPLES,)
        watch = Watch(
            self.kafka,
            {
                self._worker_group(): tuple(t.name for t in committed),
                SINK_GROUP: tuple(t.name for t in sink_plugin("clickhouse").load().topics),
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
                m = worker_metrics(port)  # {} while the worker is too busy to answer
                now = time.monotonic()
                msgs = int(m.get("gpugap_worker_messages_total", last_msgs))
                rate = max(0, msgs - last_msgs) / max(1e-6, now - last_t)
                last_msgs, last_t = msgs, now
                rows, latest, alerts = client.query(
                    "SELECT (SELECT count() FROM gpu_minutes), (SELECT max(minute) FROM "
                    "gpu_minutes), (SELECT uniqExact(alert_id) FROM alerts)"
                ).result_rows[0]
                progress = watch.progress()
                lag = progress.lag[self._worker_group()]
                reached = f"{latest:%Y-%m-%d %H:%M}" if rows else "(nothing stored yet)"
                speed = f"{rate:,.0f} messages/s" if m else "worker busy"
                line = (
                    f"simulated up to {reached} | {speed} | "
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
        secret = f"$(cat {self.admin_file})" if not self.opts.clickhouse else "PASSWORD"
        env = (
            f"GPUGAP_CLICKHOUSE_PASSWORD_FILE={self.admin_file} "
            if not self.opts.clickhouse
            else ""
        )
        print(
            f"\nClickHouse answers at {url} (database {ch.database}, user {ch.user}"
            f"{f', its password in {self.admin_file}' if not self.opts.clickhouse else ''}); "
            "the views are the interface:\n"
            f"  curl -u \"{ch.user}:{secret}\" '{url}/?database={ch.database}' "
            f"--data-binary '{q}'\n"
            f"  {env}gpugap report --clickhouse {url}\n"
            f'  {env}gpugap sql --clickhouse {url} "..."\n'
        )
        if self.web_url:
            print(f"The capacity-gap page: {self.web_url}\n", flush=True)

    def _hold(self) -> None:
        if self.opts.duration_s is None:
            with contextlib.suppress(KeyboardInterrupt):  # from here on, a stop is normal
                self._say("running; Ctrl-C stops everything")
                while True:
                    time.sleep(3600)
            return
        left = self.opts.duration_s - (time.monotonic() - self.started)
        if left > 0:
            with contextlib.suppress(KeyboardInterrupt):  # from here on, a stop is normal
                self._say(f"running for {left:.0f} s more (--duration); Ctrl-C stops earlier")
                time.sleep(left)

    def _start_web(self, env: dict[str, str]) -> None:
        """``gpugap web`` over the demo's warehouse, as the endpoint's read-only user."""
        from gpugap.web import DEFAULT_PORT, answers

        port = DEFAULT_PORT if _port_free(DEFAULT_PORT) else free_port()
        if not self.opts.clickhouse:  # our endpoint: its read-only user is the page's
            env = {**env, "GPUGAP_CLICKHOUSE_READONLY_PASSWORD_FILE": str(self.reader_file)}
        self._spawn("web", [*GPUGAP, "web", "--port", str(port)], env)
        url = f"http://127.0.0.1:{port}/"
        if answers(url):
            self.web_url = url
            self._say(f"the capacity-gap page: {url} (it fills in as the data arrives)")
        else:
            self._say("the capacity-gap page did not start: see the lines above")

    def _pipeline(self, worker: list[str], quiet: dict[str, str], env: dict[str, str]) -> None:
        """The worker, the sink and, with ``--notify``, the alert targets as a newcomer would
        run them (their own process; ``console`` prints each alert opened and resolved)."""
        self._spawn("worker", worker, quiet)
        self._spawn("sink", [*GPUGAP, "sink", "clickhouse"], quiet)
        if self.opts.notify:
            self._spawn("notify", [*GPUGAP, "notify", *self.opts.notify], env)
            self._say(f"notifying: {', '.join(self.opts.notify)}")

    def stop(self) -> None:
        for name in ("simulate", "worker", "notify", "sink", "web", "clickhouse"):
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


def _secret_file(path: Path, secret: str) -> Path:
    """``secret`` in a new file only its owner may read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    return path


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_demo(opts: DemoOptions) -> int:
    demo = Demo(opts)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops everything like Ctrl-C does

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return demo.run()
    finally:
        demo.stop()
