"""What the Faust app's agent and timer share: delivery checks, checkpoints, rebalances.

No loss, no double counting:
- events are acked only at a checkpoint, after the outputs they produced were acknowledged
  by the broker and the state that includes them was written to the state topic;
  Faust commits acked offsets only;
- the snapshot carries the input offsets it covers, so after a restart the events between
  Faust's last commit and the snapshot are skipped instead of being applied twice;
- every input partition must arrive gap-free: repeats are dropped, offsets Faust skipped are
  read directly (see ``Runner._fill``);
- a worker that loses its inputs in a rebalance stores its state and forgets it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import faust

from groundfloor.kafka.admin import partition_counts
from groundfloor.kafka.consume import RawMessage, read_latest
from groundfloor.kafka.publish import KafkaPublisher
from groundfloor.kafka.trust import ClusterTrust
from groundfloor.settings import KafkaSettings
from schemas.topics import SAMPLES
from streams.checkpoint import Points, resume_offset, start_offset
from streams.core import CoreConfig
from streams.join import Join

log = logging.getLogger(__name__)

#: how long reading offsets Faust skipped may take before the batch fails (and is retried)
FILL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class AppOptions:
    group: str = "gpugap-worker"
    config: CoreConfig = field(default_factory=CoreConfig)
    max_records: int = 5000
    commit_interval_s: float = 1.0
    idle_flush_s: float | None = None
    idle_timeout_s: float | None = None
    web: tuple[str, int] | None = ("127.0.0.1", 6066)
    #: a killed worker's partitions move to its successor after this long (Faust's default
    #: of 60 s would stall a restarted worker that long)
    session_timeout_s: float = 10.0
    healthz_stale_s: float = 60.0
    #: shards: the partitions of the samples topic (``run`` reads them from the broker)
    partitions: int = 1


def episodes_topic(kafka: KafkaSettings, group: str) -> str:
    """Where a shard sends idle alerts and marks to the mergers (partition = merger)."""
    return f"{kafka.topic_prefix}{group}-idle-episodes"


def state_topic(kafka: KafkaSettings, group: str) -> str:
    """The shards' checkpoints (partition = shard), compacted. Named as the Faust table's
    changelog it replaces, so a group's stored state outlives the change."""
    return f"{kafka.topic_prefix}{group}-state-changelog"


class Runner:
    """What the agent and the timer share: the join, the checkpoint, idle handling."""

    def __init__(self, app: faust.App, kafka: KafkaSettings, opts: AppOptions) -> None:
        self.app = app
        self.kafka = kafka
        self.opts = opts
        self.pub = KafkaPublisher(kafka)
        self.samples = SAMPLES.qualified(kafka.topic_prefix)
        self.episodes = episodes_topic(kafka, opts.group)
        #: the clusters each topic may speak for (docs/kafka-trust.md), None: not mapped
        self.trust = ClusterTrust.from_settings(kafka)
        self.join = self._new_join()
        self.join.stats.stale_after_s = opts.healthz_stale_s
        #: what Faust delivers (partitioned over the group); what every worker reads whole;
        #: and the mergers' input, read for the shards this worker owns (partition = shard)
        self.inputs = set(self.join.samples_topics)  # with the clusters' own, co-partitioned
        self.globals = set(self.join.global_topics)
        self.state_topic = state_topic(kafka, opts.group)
        self.lock = asyncio.Lock()
        self._filler: Any = None  # our own consumer for offsets Faust skipped
        self._side: Any = None  # our own consumer of the scheduler topics (all partitions)
        self.last_input = time.monotonic()
        self.last_checkpoint = time.monotonic()
        self.stopping = False
        #: the generation whose partitions were last revoked, and the one the Join's shards
        #: were restored in: a Join holds the shards of one assignment only
        self.revoked_generation: int | None = None
        self.ready_generation: int | None = None
        self._forget()

    def _forget(self) -> None:
        """No state and no positions: what a worker holds before an assignment's restore."""
        self.ready = False
        self.flushed = True
        self.start: dict[Any, int] = {}  # partition -> where reading started
        self.next: dict[Any, int] = {}  # partition -> offset after the last one ingested
        self.expect: dict[Any, int] = {}  # partition -> the offset Faust must deliver next

    def _new_join(self) -> Join:
        opts = self.opts
        return Join(
            self.pub,
            self.kafka.topic_prefix,
            opts.config,
            partitions=opts.partitions,
            episodes_topic=self.episodes,
            trust=self.trust,
        )

    async def _ready(self) -> None:
        if self.ready:
            return
        await self.pub.start()
        shards = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.samples}
        records = await read_latest(self.kafka, self.state_topic, shards)
        restored = self.join.restore(records, shards)
        if restored:
            log.info("restored shard(s) %s at offsets %s", sorted(restored), restored)
            self.flushed = False  # a restored state may hold minutes only a flush closes
        await self._seek_globals(restored)
        self.ready_generation = self.app.consumer_generation_id
        # an assignment is work: in a group that winds down with --idle-timeout, a worker
        # idle since before it was handed another's shards must not exit before their
        # mergers' input (marks still on the way) is read
        self.last_input = time.monotonic()
        self.ready = True

    async def _seek_globals(self, restored: dict[int, Points]) -> None:
        """Every worker reads every scheduler partition, from the lowest point its shards'
        states hold (a shard skips what its own state already has), and the episodes
        partition of each shard it owns, from that shard's point. Not through Faust: its
        assignor hands a worker the episodes partitions of other numbers than its samples'
        when no table ties them, and a table's recovery can hang a rebalance for good (a
        test caught one waiting minutes for changelog records it had already been sent)."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition

        if self._side is None:
            self._side = AIOKafkaConsumer(**self.kafka.client_options(), enable_auto_commit=False)
            await self._side.start()
        counts = await partition_counts(self.kafka, sorted(self.globals))
        tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
        mergers = [TopicPartition(self.episodes, s) for s in sorted(self.join.shards)]
        self._side.assign(tps + mergers)
        for tp in tps + mergers:
            shards = [tp.partition] if tp.topic == self.episodes else self.join.shards
            offset = start_offset(restored, f"{tp.topic}:{tp.partition}", shards)
            if offset is None:
                await self._side.seek_to_beginning(tp)
                offset = (await self._side.beginning_offsets([tp]))[tp]
            else:
                self._side.seek(tp, offset)
            self.start[tp] = offset

    async def _pull_globals(self) -> bool:
        """Scheduler events and merger input fetched so far (no waiting); whether there
        were scheduler events. The mergers' input is applied as it comes; only data makes a
        worker busy (the marks of idle workers would otherwise keep waking each other)."""
        if self._side is None or not self.join.shards:
            return False
        got = False
        for tp, msgs in (await self._side.getmany(timeout_ms=0, max_records=5000)).items():
            for m in msgs:
                self.next[tp] = m.offset + 1
                await self.join.ingest(tp, RawMessage.of(m))
            got = got or (bool(msgs) and tp.topic != self.episodes)
        return got

    def _recovered(self) -> bool:
        """The inputs are assigned and Faust has resumed them (no rebalance going on).

        Faust's recovery runs on every assignment even with no tables (it pauses the inputs
        and seeks them to the committed offsets); its "completed" flag stays set from the
        first rebalance on, and the inputs stay paused until the current one is done."""
        app = self.app
        recovery = app.tables.recovery  # type: ignore[attr-defined]
        if app.rebalancing or not recovery.completed.is_set():
            return False
        consumer = app.consumer
        inputs = [tp for tp in consumer.assignment() if tp.topic in self.inputs]
        paused = consumer._paused_partitions  # type: ignore[attr-defined]
        return bool(inputs) and not any(tp in paused for tp in inputs)

    async def on_revoked(self, revoked: set[Any]) -> None:
        """A rebalance took input partitions away: store the state, then forget it.

        Whoever gets the partitions next (this worker again, or another) restores from the
        state topic, so a worker never goes on from state that another one has moved past.
        Nothing is acked here: Faust has dropped its bookkeeping for revoked partitions, and
        the stored offsets let the next owner skip what the state already holds."""
        # set first, even with nothing restored: a batch of this generation that waited for
        # the lock must not restore the old assignment afterwards
        self.revoked_generation = self.app.consumer_generation_id
        if not self.ready or not any(tp.topic in self.inputs for tp in revoked):
            return
        async with self.lock:
            await self._store()
            self._drop_state()
            log.info("input partitions revoked: state stored, will restore on assignment")

    def _drop_state(self) -> None:
        stats, dl = self.join.stats, self.join.dl
        self.join = self._new_join()
        self.join.stats, self.join.dl = stats, dl
        self._forget()

    async def on_batch(self, events: list[Any]) -> None:
        # events fetched before a rebalance: Faust seeks back to the committed offsets and
        # delivers them again in the new generation
        generation = self.app.consumer_generation_id
        events = [ev for ev in events if ev.message.generation_id == generation]
        if not events:
            return
        async with self.lock:
            stale = self.app.consumer_generation_id != generation
            if stale or generation == self.revoked_generation:
                # a rebalance came while this batch waited for the lock. Restoring now
                # would take the revoked assignment's shards: a clean-clone run restored
                # [0, 3] between the revoke and the new assignment, was given 4, and
                # dead-lettered its records (KeyError) while another worker also held 3
                return
            if self.ready and self.ready_generation != generation:
                # not reached with Faust's eager rebalancing (every new generation revokes
                # first); if it were, these shards may be another worker's by now: drop
                # them unstored (the stored state and the offsets make up for it)
                log.warning("assignment changed without a revoke: restoring again")
                self._drop_state()
            await self._ready()
            new = {ev.message.tp for ev in events} - set(self.expect)
            if new:
                self.expect.update(await self._positions(list(new)))
            for ev in events:
                m = ev.message
                tp = m.tp
                want = self.expect.get(tp)
                if want is not None and m.offset < want:
                    continue  # delivered again: the first copy is the one acked
                if want is not None and m.offset > want:
                    await self._fill(tp, want, m.offset)
                self.expect[tp] = m.offset + 1
                self.next[tp] = m.offset + 1
                await self.join.ingest(tp, RawMessage.of(m), ev)
            await self._pull_globals()
            self.join.stats.last_poll = time.monotonic()
            self.last_input = time.monotonic()
            self.flushed = False
            await self.join.drain(self.join.frontier(await self._lagging()))
            if self._checkpoint_due():
                await self.checkpoint()

    async def _fill(self, tp: Any, start: int, end: int) -> None:
        """Read offsets [start, end) of a partition ourselves: Faust skipped them.

        Faust does not hand every partition over gap-free: a restarted worker's stream
        partitions are resumed before Faust's seek to the committed offsets (recovery's
        ``on_recovery_completed``), and records fetched around that seek reach the agent
        twice, or not at all (the consumer drops those below its read offset). A SIGKILL
        test caught a restarted worker whose agent got offsets ..1897, then 1904..: its next
        checkpoint claimed everything below 1976 read, the worker after it skipped 1898-1903
        as already taken, and five nodes' minutes came out short. Seeking Faust's consumer
        back races its read offset (what the seek fetches can be dropped again), so the
        missing records are read here, in order, before the record after them; Faust is told
        they are a gap (which it counts as acked), and our checkpoints still ack nothing
        above a record before the state holding it is stored."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        log.warning("%s: Faust skipped offsets %d-%d: reading them directly", tp, start, end - 1)
        if self._filler is None:
            self._filler = AIOKafkaConsumer(**self.kafka.client_options(), enable_auto_commit=False)
            await self._filler.start()
        ktp = TopicPartition(tp.topic, tp.partition)
        self._filler.assign([ktp])
        self._filler.seek(ktp, start)
        at = start
        async with asyncio.timeout(FILL_TIMEOUT_S):
            while at < end:
                for r in (await self._filler.getmany(ktp, timeout_ms=500)).get(ktp, []):
                    at = r.offset + 1
                    if r.offset >= end:
                        break  # the log has no more below ``end`` (a compacted gap)
                    await self.join.ingest(tp, RawMessage.of(r))
        await self.app.consumer._add_gap(tp, start, end - 1)  # type: ignore[attr-defined]

    def _checkpoint_due(self) -> bool:
        since = time.monotonic() - self.last_checkpoint
        return self.join.checkpoint_due(since, self.opts.commit_interval_s)

    async def _lagging(self, *, frontier: bool = True) -> list[Any]:
        """Input partitions with records left to read. For the event-time ``frontier``
        leave out the mergers' input: it is applied in offset order, not merged in time."""
        consumer = self.app.consumer
        tps = [tp for tp in consumer.assignment() if tp.topic in self.inputs]
        unknown = [tp for tp in tps if tp not in self.next and tp not in self.start]
        if unknown:
            self.start.update(await self._start_offsets(unknown))
        lagging = []
        for tp in tps:
            hw = consumer.highwater(tp)
            nxt = self.next.get(tp, self.start.get(tp, 0))
            if hw is None or nxt < hw:
                lagging.append(tp)
        for tp in self._side.assignment() if self._side is not None else ():
            if frontier and tp.topic == self.episodes:
                continue
            hw = self._side.highwater(tp)
            if hw is None or self.next.get(tp, self.start.get(tp, 0)) < hw:
                lagging.append(tp)
        return lagging

    def lag(self) -> dict[str, int]:
        """Per input partition read here: records the broker holds beyond those taken."""
        out = {}
        # only what is assigned now: asking a consumer about another partition fails (a
        # clean-clone run's /metrics answered 500 between a rebalance and the revoke)
        faust = set(self.app.consumer.assignment())
        side = set(self._side.assignment()) if self._side is not None else set()
        for tp, n in self.next.items():
            if tp in side:
                hw = self._side.highwater(tp)
            elif tp in faust:
                hw = self.app.consumer.highwater(tp)
            else:
                continue
            out[f"{tp.topic}:{tp.partition}"] = max(0, (hw or 0) - n)
        return out

    async def _caught_up(self) -> bool:
        """Every input partition is assigned and read to its end (not merely paused, as
        during a rebalance)."""
        assigned = [tp for tp in self.app.consumer.assignment() if tp.topic in self.inputs]
        if not assigned or await self._lagging(frontier=False):
            return False
        # the fetcher's highwater is only as fresh as its last fetch (stale after a long
        # stall): ask the broker for the end offsets before closing every open minute
        ends = dict(await self.app.consumer.highwaters(*assigned))
        side = list(self._side.assignment()) if self._side is not None else []
        if side:
            ends.update(await self._side.end_offsets(side))
        return all(
            self.next.get(tp, self.start.get(tp, 0)) >= ends.get(tp, 0) for tp in assigned + side
        )

    async def _positions(self, tps: list[Any]) -> dict[Any, int]:
        """Where Faust starts delivering partitions that have delivered nothing yet: the
        group's committed offset (not below the log start), else the log start. Faust may
        fetch a partition's records long before it delivers them, so the consumer's
        position cannot tell."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.structs import TopicPartition

        admin = AIOKafkaAdminClient(**self.kafka.client_options())
        await admin.start()
        try:
            committed = await admin.list_consumer_group_offsets(self.app.conf.id)
        finally:
            await admin.close()
        earliest = await self.app.consumer.earliest_offsets(*tps)
        out = {}
        for tp in tps:
            c = committed.get(TopicPartition(tp.topic, tp.partition))
            start = earliest.get(tp, 0)
            out[tp] = max(c.offset, start) if c is not None and c.offset >= 0 else start
        return out

    async def _start_offsets(self, tps: list[Any]) -> dict[Any, int]:
        """Where reading starts: Faust's position, or past it what the state already holds."""
        pos = await self._positions(tps)
        skip = self.join.skip
        out = {}
        for tp, p in pos.items():
            point = skip.get(tp.partition, {}).get(f"{tp.topic}:{tp.partition}", 0)
            out[tp] = max(p, resume_offset(point))
        return out

    async def checkpoint(self) -> None:
        """Outputs acknowledged, then the state that includes them, then the acks."""
        points = await self._store()
        # ack strictly in offset order and only below each partition's resume point: Faust
        # commits the first run of consecutive acked offsets, wherever it starts (with no
        # commit yet), so one early ack (a dead letter) would commit past unread records
        starts = {key: resume_offset(p) for pts in points.values() for key, p in pts.items()}
        keep = []
        for ev in sorted(self.join.done, key=lambda e: (e.message.topic, e.message.offset)):
            m = ev.message
            if m.offset < starts.get(f"{m.topic}:{m.partition}", 0):
                ev.ack()
            else:
                keep.append(ev)
        self.join.done = keep
        self.last_checkpoint = time.monotonic()

    async def _store(self) -> dict[int, Points]:
        """Outputs acknowledged, then the state that includes them; returns its points."""
        await self.pub.flush()
        points = self.join.resume_points(self.next)
        # written by our own producer and awaited before any ack; a shard's records go to
        # the partition of its number, which the next owner of that samples partition reads
        for shard, key, value in self.join.snapshot(points):
            await self.pub.send_raw(self.state_topic, key, value, partition=shard)
        await self.pub.flush()
        self.join.snapshot_stored()
        return points

    async def tick(self) -> None:
        """Every half second: checkpoint what the agent left, flush and stop when idle."""
        if self.stopping:
            return
        if not self.ready:
            # alive, waiting for inputs (a second worker of a group may wait for good) or for
            # their recovery: /healthz must not call that stalled
            self.join.stats.last_poll = time.monotonic()
            # Faust's recovery "completed" flag is also set while the assignment is still
            # empty, and a restore then finds no shards (a SIGKILL test caught a
            # restarted worker starting from nothing): restore here only once the inputs
            # are assigned and resumed. Waiting for the agent's first batch
            # instead hangs a worker with nothing left to read (killed right after a
            # checkpoint that covered every input): it never flushes, never stops when idle.
            if not self._recovered():
                return
            async with self.lock:
                await self._ready()
        async with self.lock:
            if not self.ready:
                return  # revoked while this tick waited for the lock: nothing to store
            self.join.stats.last_poll = time.monotonic()
            if await self._pull_globals():  # scheduler events while the samples are quiet
                self.last_input, self.flushed = time.monotonic(), False
                await self.join.drain(self.join.frontier(await self._lagging()))
            idle = time.monotonic() - self.last_input
            if (
                not self.flushed
                and self.opts.idle_flush_s is not None
                and idle >= self.opts.idle_flush_s
                and await self._caught_up()
            ):
                await self.join.flush_all()
                self.flushed = True
                await self.checkpoint()
            elif self._checkpoint_due():
                await self.checkpoint()
            timeout = self.opts.idle_timeout_s
            # and not before the other workers' final marks are in: a merger that stops
            # early leaves its episodes to a worker that may be stopping too
            if timeout is not None and self.flushed and idle >= timeout and self.join.settled():
                self.stopping = True
                await self.app.consumer.commit()
                log.info("idle for %.1f s: stopping", idle)
                _stop_worker(self.app)


def _stop_worker(app: faust.App) -> None:
    # the same path as Ctrl-C / SIGTERM: the Faust worker stops its services in order
    os.kill(os.getpid(), signal.SIGTERM)
