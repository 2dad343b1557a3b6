"""The Faust app: ``gpugap worker`` (or ``faust -A gpugap.streams.app worker -l info``).

One agent, ``join``, reads ``gpu.samples.v1``, ``slurm.jobs.v1`` and ``k8s.pods.v1`` with
``concurrency=1`` (faust-streaming #606: more can commit past in-flight messages) in batches
(``noack_take``), and hands them to the runner-independent :class:`streams.join.Join` (decode,
event-time merge, the pure core, publish). Faust's windowed tables are not used (they expire
windows on the wall clock), nor are its tables: the core's state lives in a compacted topic
of the worker's own, ``<group>-state-changelog``, one partition per shard.

This module is the engine's adapter only: the lifecycle (restore, positions, gap-free
delivery, lag, idle flush, checkpoints, stop, metrics) is :class:`streams.runtime.WorkerRuntime`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import tempfile
from collections.abc import Iterable
from typing import Any

import faust

from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.schemas.errors import FatalError
from gpugap.schemas.topics import SAMPLES
from gpugap.streams.join import check_copartitioned, input_topics
from gpugap.streams.runtime import AppOptions, WorkerRuntime, episodes_topic, state_topic

__all__ = ["AppOptions", "FaustEngine", "WorkerRuntime", "create_app", "run"]


app: faust.App  # for ``faust -A gpugap.streams.app``: built from the environment on first access


class FaustEngine:
    """The runtime's :class:`streams.runtime.Engine`, answered by a Faust app's consumer."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    @property
    def group_id(self) -> str:
        return str(self.app.conf.id)

    def generation(self) -> int:
        return int(self.app.consumer_generation_id)

    def assignment(self) -> set[Any]:
        return set(self.app.consumer.assignment())

    def recovered(self, inputs: set[str]) -> bool:
        # Faust's recovery runs on every assignment even with no tables (it pauses the
        # inputs and seeks them to the committed offsets); its "completed" flag stays set
        # from the first rebalance on, and the inputs stay paused until the current one is
        # done
        app = self.app
        recovery = app.tables.recovery  # type: ignore[attr-defined]
        if app.rebalancing or not recovery.completed.is_set():
            return False
        consumer = app.consumer
        assigned = [tp for tp in consumer.assignment() if tp.topic in inputs]
        paused = consumer._paused_partitions  # type: ignore[attr-defined]
        return bool(assigned) and not any(tp in paused for tp in assigned)

    def highwater(self, tp: Any) -> int | None:
        return self.app.consumer.highwater(tp)

    async def highwaters(self, tps: Iterable[Any]) -> dict[Any, int]:
        return dict(await self.app.consumer.highwaters(*tps))

    async def earliest_offsets(self, tps: Iterable[Any]) -> dict[Any, int]:
        return dict(await self.app.consumer.earliest_offsets(*tps))

    async def read_elsewhere(self, tp: Any, start: int, end: int) -> None:
        # a gap is what Faust counts as acked without a message
        await self.app.consumer._add_gap(tp, start, end - 1)  # type: ignore[attr-defined]

    def read_to(self, tp: Any) -> int | None:
        # the last offset Faust handed to its streams (or, after its seek, the committed
        # one): it drops what it fetches below that, and may hand that one over again
        offset = self.app.consumer._read_offset.get(tp)  # type: ignore[attr-defined]
        return None if offset is None else int(offset) + 1

    async def commit(self) -> None:
        await self.app.consumer.commit()

    def stop(self) -> None:
        # the same path as Ctrl-C / SIGTERM: the Faust worker stops its services in order
        os.kill(os.getpid(), signal.SIGTERM)


def create_app(
    settings: Settings, opts: AppOptions | None = None
) -> tuple[faust.App, WorkerRuntime]:
    opts = opts or AppOptions()
    kafka = settings.kafka
    app = faust.App(
        f"{kafka.topic_prefix}{opts.group}",
        broker=[f"kafka://{h.strip()}" for h in kafka.bootstrap.split(",") if h.strip()],
        broker_credentials=_credentials(kafka),
        store="memory://",
        # no tables: nothing worth a folder in the working directory (Faust's default), so
        # its scratch folder goes under the temp dir
        datadir=os.path.join(_scratch(), "{conf.name}"),
        autodiscover=False,
        topic_partitions=1,
        table_standby_replicas=0,
        topic_allow_declare=True,
        # nothing here runs on the leader only; Faust's leader topic would be made with its
        # default replication factor, 1: an offline partition once that broker is lost
        topic_disable_leader=True,
        broker_max_poll_records=opts.max_records,
        broker_commit_interval=opts.commit_interval_s,
        broker_session_timeout=opts.session_timeout_s,
        broker_heartbeat_interval=min(3.0, opts.session_timeout_s / 3),
        consumer_auto_offset_reset="earliest",
        # Faust waits for every message its streams took to be acked before a rebalance or
        # a stop. A worker could wait forever: records Faust delivers twice (dropped here)
        # are never acked, nor are records taken ahead of a lower offset still buffered in
        # the event-time merge, which needs more input to move. Nothing depends on that
        # wait: the stored state carries its own offsets (see ``on_revoked``).
        stream_wait_empty=False,
        producer_compression_type=None if kafka.compression == "none" else kafka.compression,
        web_enabled=opts.web is not None,
        web_bind=opts.web[0] if opts.web else "127.0.0.1",
        web_host=opts.web[0] if opts.web else "127.0.0.1",
        web_port=opts.web[1] if opts.web else 6066,
        web_in_thread=False,
    )
    runner = WorkerRuntime(FaustEngine(app), kafka, opts)
    # Faust splits the samples over the group (a shard per partition); the scheduler
    # topics and the shards' episodes partitions are read outside the group
    # (``WorkerRuntime._pull_globals``), the state topic by whoever restores a shard
    topic = app.topic(
        *sorted(runner.inputs), key_type=bytes, value_type=bytes, value_serializer="raw"
    )

    @app.agent(topic, concurrency=1, name="join")
    async def join(stream: Any) -> None:
        async for events in stream.noack_take(opts.max_records, within=0.2):
            await runner.on_batch(list(events))

    # faust's App.timer is annotated as returning a bare Callable (its other decorators
    # are typed), so mypy cannot see what it makes of the function
    @app.timer(0.5)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        await runner.tick()

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        return web.text(runner.metrics(), content_type="text/plain")

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        ok = runner.healthy()
        return web.text("ok\n" if ok else "stalled\n", status=200 if ok else 503)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        await runner.on_revoked(revoked)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def _close(app: faust.App, **kwargs: Any) -> None:
        await runner.close()

    return app, runner


def _scratch() -> str:
    """The parent of Faust's data folder (Faust creates only the last level)."""
    path = os.path.join(tempfile.gettempdir(), "gpugap-faust")
    os.makedirs(path, exist_ok=True)
    return path


def _credentials(kafka: KafkaSettings) -> Any:
    """Faust's form of ``kafka.client_options()``: the same protocol, SASL login and TLS
    context (CA, client certificate, hostname check) for every client the app creates."""
    if kafka.security_protocol == "PLAINTEXT":
        return None
    context = kafka.ssl_context()  # None for SASL_PLAINTEXT
    if kafka.security_protocol == "SSL":
        return faust.SSLCredentials(context)
    # SASL_PLAINTEXT, SASL_SSL (Faust says SASL_SSL when it is given a context)
    return faust.SASLCredentials(
        username=kafka.sasl_username,
        password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
        mechanism=kafka.sasl_mechanism or "PLAIN",  # aiokafka's default too
        ssl_context=context,
    )


def run(settings: Settings, opts: AppOptions, loglevel: str = "WARNING") -> WorkerRuntime:
    """Run the app in this process until SIGTERM/SIGINT or the idle timeout."""
    opts = dataclasses.replace(opts, partitions=_prepare(settings.kafka, opts.group))
    app, runner = create_app(settings, opts)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    return runner


def _prepare(kafka: KafkaSettings, group: str) -> int:
    """The inputs exist, the mergers' topic is partitioned like the samples, and the group
    can be joined before Faust subscribes (else aiokafka logs ERRORs on a fresh broker);
    returns the number of shards. On a loop of its own: Faust's worker runs on the thread's
    default loop, which this must neither close nor replace."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_shards(kafka, group))
    finally:
        loop.close()


async def _shards(kafka: KafkaSettings, group: str) -> int:
    from gpugap.groundfloor.kafka.admin import ensure_topics, partition_counts, prepare
    from gpugap.groundfloor.kafka.trust import ClusterTrust

    app_id = f"{kafka.topic_prefix}{group}"
    trust = ClusterTrust.from_settings(kafka)
    inputs = input_topics(kafka.topic_prefix, trust)
    await prepare(kafka, inputs, app_id)
    samples = [inputs[0], *(trust.topics_for([SAMPLES]) if trust is not None else [])]
    counts = await partition_counts(kafka, samples)
    check_copartitioned(counts, kafka.topic_prefix)
    shards = counts[inputs[0]]
    episodes = episodes_topic(kafka, group)
    await ensure_topics(kafka, [episodes], partitions=shards)
    changelog = state_topic(kafka, group)
    await ensure_topics(
        kafka, [changelog], partitions=shards, configs={"cleanup.policy": "compact"}
    )
    found = await partition_counts(kafka, [episodes, changelog])
    for name in (episodes, changelog):
        if found.get(name, shards) != shards:
            raise FatalError(
                f"worker: {name} has {found[name]} partition(s), {inputs[0]} has {shards}: "
                "the state is split like the samples, so their partitions must match. A "
                "changed partition count moves keys between partitions: start a new group "
                "(--group) and replay, or delete the group's topics"
            )
    return shards


def __getattr__(name: str) -> Any:
    # ``faust -A gpugap.streams.app worker``: the app from the environment, built on first access
    if name == "app":
        from gpugap.groundfloor.settings import load, read_part
        from gpugap.streams.settings import WorkerSettings

        global app
        from gpugap.streams.core import CoreConfig, state_bounds

        settings = load()
        opts = AppOptions(
            partitions=_prepare(settings.kafka, AppOptions().group),
            config=CoreConfig(**state_bounds(read_part(WorkerSettings))),  # GPUGAP_WORKER_*
        )
        app, _ = create_app(settings, opts)
        return app
    raise AttributeError(name)
