"""The worker's runtime: it owns the lifecycle once, whatever engine delivers the records.

Assignment and restore, positions, gap-free delivery, lag, the idle flush, checkpoints, the
stop when idle, and the text of ``/metrics`` and ``/healthz``. An engine (the Faust app,
``streams/app.py``) is a thin adapter: it hands over batches of input records with
``on_batch``, calls ``tick`` every half second and ``on_revoked`` in a rebalance, and answers
the few questions of :class:`Engine` about its group consumer.

No loss, no double counting:
- records are acked only at a checkpoint, after the outputs they produced were acknowledged
  by the broker and the state that includes them was written to the state topic; the engine
  commits acked offsets only;
- the snapshot carries the input offsets it covers, so after a restart the records between
  the group's last commit and the snapshot are skipped instead of being applied twice;
- every input partition must arrive gap-free: repeats are dropped, offsets the engine skipped
  are read directly (see ``WorkerRuntime._fill``);
- a worker that loses its inputs in a rebalance stores its state and forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpugap.groundfloor.kafka.admin import partition_counts
from gpugap.groundfloor.kafka.consume import RawMessage, read_latest
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.kafka.trust import ClusterTrust
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.topics import SAMPLES
from gpugap.streams.checkpoint import Points, resume_offset, start_offset
from gpugap.streams.core import CoreConfig
from gpugap.streams.join import Join

log = logging.getLogger(__name__)

#: how long reading offsets the engine skipped may take before the batch fails (the state
#: is then dropped and restored: ``WorkerRuntime._failed``)
FILL_TIMEOUT_S = 30.0
#: a failure that repeats is logged once in this long, with its count
FAILURE_LOG_EVERY_S = 30.0
#: checkpoints take at most 1/CHECKPOINT_SHARE of the worker's time
CHECKPOINT_SHARE = 10
#: how long a worker with input left takes no record before it reads that input itself
#: (``WorkerRuntime._fill_tails``; sooner with ``--idle-flush``)
TAIL_STALL_S = 5.0
#: the longest a checkpoint's wait for the broker may space the next one (its own CPU, the
#: snapshot's build, may space them more)
CHECKPOINT_SPACING_MAX_S = 10.0


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
    """The shards' checkpoints (partition = shard), compacted; the worker's one state topic.
    Named as the Faust table's changelog it replaced, so a group's stored state outlives it."""
    return f"{kafka.topic_prefix}{group}-state-changelog"


class Engine(Protocol):
    """What the runtime asks of the engine that runs the group consumer."""

    @property
    def group_id(self) -> str:
        """The consumer group (its committed offsets are where delivery starts)."""

    def generation(self) -> int:
        """The group generation of the current assignment."""

    def assignment(self) -> set[Any]:
        """The partitions the group gave this worker."""

    def recovered(self, inputs: set[str]) -> bool:
        """The input partitions are assigned and resumed: no rebalance is going on."""

    def highwater(self, tp: Any) -> int | None:
        """The end offset of an assigned partition as of its last fetch."""

    async def highwaters(self, tps: Iterable[Any]) -> dict[Any, int]:
        """The end offsets, asked of the broker now."""

    async def earliest_offsets(self, tps: Iterable[Any]) -> dict[Any, int]:
        """The log start offsets."""

    async def read_elsewhere(self, tp: Any, start: int, end: int) -> None:
        """Offsets [start, end) that the engine skipped were read by the runtime itself."""

    def read_to(self, tp: Any) -> int | None:
        """The offset below which the engine will deliver nothing more of ``tp`` (it has
        read those records, delivered or not); None: it has read nothing of it."""

    async def commit(self) -> None:
        """Commit the acked offsets now."""

    def stop(self) -> None:
        """Stop the worker the way SIGTERM does."""


class WorkerRuntime:
    """The join, positions, checkpoints, idle handling and stop: one worker's lifecycle."""

    def __init__(self, engine: Engine, kafka: KafkaSettings, opts: AppOptions) -> None:
        self.engine = engine
        self.kafka = kafka
        self.opts = opts
        self.pub = KafkaPublisher(kafka)
        self.samples = SAMPLES.qualified(kafka.topic_prefix)
        self.episodes = episodes_topic(kafka, opts.group)
        #: the clusters each topic may speak for (docs/kafka-trust.md), None: not mapped
        self.trust = ClusterTrust.from_settings(kafka)
        self.join = self._new_join()
        self.join.stats.stale_after_s = opts.healthz_stale_s
        #: what the engine delivers (split over the group); what every worker reads whole;
        #: and the mergers' input, read for the shards this worker owns (partition = shard)
        self.inputs = set(self.join.samples_topics)  # with the clusters' own, co-partitioned
        self.globals = set(self.join.global_topics)
        self.state_topic = state_topic(kafka, opts.group)
        self.lock = asyncio.Lock()
        self._filler: Any = None  # our own consumer for offsets the engine skipped
        self._side: Any = None  # our own consumer of the scheduler topics (all partitions)
        self.last_input = time.monotonic()
        self.last_checkpoint = time.monotonic()
        self.stopping = False
        #: partition -> the offset after the last record the engine delivered (kept when the
        #: state is dropped after a failure: ``_failed``), and what to read back once restored
        self.delivered: dict[Any, int] = {}
        self.refill: dict[Any, int] = {}
        self._closing: asyncio.Task[None] | None = None  # the publisher replaced after one
        self._failures_logged = 0
        self._failure_logged = -FAILURE_LOG_EVERY_S
        #: revokes so far (a batch that waited for the lock through one is of the old
        #: assignment), and the generation the Join's shards were restored in: a Join holds
        #: the shards of one assignment only. Not the revoked generation: a member that
        #: rejoins a stable group (after a commit refused with IllegalGeneration) is revoked
        #: and handed the same partitions in the same generation
        self.revokes = 0
        self.ready_generation: int | None = None
        self._forget()

    def _forget(self) -> None:
        """No state and no positions: what a worker holds before an assignment's restore."""
        self.ready = False
        self.flushed = True
        self.start: dict[Any, int] = {}  # partition -> where reading started
        self.next: dict[Any, int] = {}  # partition -> offset after the last one ingested
        self.expect: dict[Any, int] = {}  # partition -> the offset the engine must deliver next
        #: offsets [start, end) read directly, told to the engine once the state holds them
        self.filled: list[tuple[Any, int, int]] = []

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
        shards = {tp.partition for tp in self.engine.assignment() if tp.topic == self.samples}
        records = await read_latest(self.kafka, self.state_topic, shards)
        restored = self.join.restore(records, shards)
        if restored:
            log.info("restored shard(s) %s at offsets %s", sorted(restored), restored)
        # not flushed yet: a restored state may hold minutes only a flush closes, and the
        # mergers wait for every shard's final mark, sent by a flush even with nothing read
        self.flushed = False
        await self._seek_globals(restored)
        await self._refill()
        self.ready_generation = self.engine.generation()
        # an assignment is work: in a group that winds down with --idle-timeout, a worker
        # idle since before it was handed another's shards must not exit before their
        # mergers' input (marks still on the way) is read
        self.last_input = time.monotonic()
        self.ready = True

    async def _seek_globals(self, restored: dict[int, Points]) -> None:
        """Every worker reads every scheduler partition, from the lowest point its shards'
        states hold (a shard skips what its own state already has), and the episodes
        partition of each shard it owns, from that shard's point. Not through the group:
        Faust's assignor hands a worker the episodes partitions of other numbers than its
        samples' when no table ties them, and a table's recovery can hang a rebalance (it
        waits for changelog records it has already been sent)."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition

        if self._side is None:
            self._side = AIOKafkaConsumer(
                **self.kafka.client_options(),
                enable_auto_commit=False,
                auto_offset_reset="earliest",  # never skip forward (out of range: what is left)
            )
            await self._side.start()
        counts = await partition_counts(self.kafka, sorted(self.globals))
        tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
        mergers = [TopicPartition(self.episodes, s) for s in sorted(self.join.shards)]
        everything = tps + mergers
        first = await self._side.beginning_offsets(everything)
        # every position set explicitly, with no await after the assignment: the consumer's
        # own reset (seek_to_beginning's, or its default) races it (``seek_to_start``)
        self._side.assign(everything)
        for tp in everything:
            shards = [tp.partition] if tp.topic == self.episodes else self.join.shards
            offset = start_offset(restored, f"{tp.topic}:{tp.partition}", shards)
            if offset is None:
                offset = first[tp]
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

    async def on_revoked(self, revoked: set[Any]) -> None:
        """A rebalance took input partitions away: store the state, then forget it.

        Whoever gets the partitions next (this worker again, or another) restores from the
        state topic, so a worker never goes on from state that another one has moved past.
        Nothing is acked here: Faust has dropped its bookkeeping for revoked partitions, and
        the stored offsets let the next owner skip what the state already holds."""
        # first, even with nothing restored: a batch that waited for the lock must not
        # restore the old assignment afterwards
        self.revokes += 1
        # Faust delivers the next assignment from the committed offsets again
        self.delivered, self.refill = {}, {}
        if not self.ready or not any(tp.topic in self.inputs for tp in revoked):
            return
        async with self._locked("storing the state at a revoke"):
            await self._store()
            self._drop_state()
            log.info("input partitions revoked: state stored, will restore on assignment")

    def _drop_state(self) -> None:
        stats, dl = self.join.stats, self.join.dl
        self.join = self._new_join()
        self.join.stats, self.join.dl = stats, dl
        self._forget()

    async def on_batch(self, events: list[Any]) -> None:
        revokes = self.revokes  # before the lock: a revoke may come while it waits
        try:
            await self._on_batch(events, revokes)
        except Exception as exc:
            async with self.lock:
                self._failed("a batch", exc)

    @contextlib.asynccontextmanager
    async def _locked(self, what: str) -> AsyncIterator[None]:
        """The lock, and a failure inside it handled before the lock is let go: a tick or
        batch waiting for the lock would otherwise take it first and go on from the failed
        state (its checkpoint could then store state whose outputs were lost)."""
        async with self.lock:
            try:
                yield
            except Exception as exc:
                self._failed(what, exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """Something beside a record's own processing failed (Kafka refused or timed out a
        write, the state could not be read): the outputs of records the state has taken may
        be lost, so that state must never be stored nor its records acked. It is dropped
        unstored; the next batch or tick restores the last checkpoint and reads again from
        its offsets (what is written twice replaces itself downstream). Not raised: Faust
        would restart the agent (or end the timer) on top of the same state. Called with the
        lock held, and without an await: nothing runs between the failure and the drop."""
        assert self.lock.locked()
        stats = self.join.stats
        stats.restores_after_failure += 1
        n = stats.restores_after_failure
        now = time.monotonic()
        if now - self._failure_logged >= FAILURE_LOG_EVERY_S:  # not twice a second for long
            since, self._failure_logged = n - self._failures_logged, now
            self._failures_logged = n
            log.error(
                "%s failed (%s: %s; %d failure(s) since the last such line): this worker's "
                "state is dropped unstored; it restores the last checkpoint and reads its "
                "input again from there. If this repeats, check that Kafka is reachable and "
                "the worker's topics are writable",
                what,
                type(exc).__name__,
                exc,
                since,
            )
        # what Faust has delivered since the last checkpoint it will not deliver again:
        # read it back ourselves once restored (``_refill``). Also when the failure came
        # before a restore was done: the refill that restore had taken is not read yet
        for tp, offset in self.delivered.items():
            self.refill[tp] = max(offset, self.refill.get(tp, offset))
        self._drop_state()
        # a publisher that lost a batch refuses every later call (and an idempotent
        # producer's sequence numbers are broken after one): the next state writes with a
        # new one
        old, self.pub = self.pub, KafkaPublisher(self.kafka)
        self.join.pub = self.join.dl.publisher = self.pub
        self._closing = asyncio.create_task(_close_quietly(old))

    async def _refill(self) -> None:
        """After a failure: read again what Faust delivered past the restored state."""
        refill = self.refill  # cleared only once read: a failure on the way keeps it
        assigned = self.engine.assignment()
        tps = [tp for tp in refill if tp in assigned]
        if not tps:
            return
        starts = await self._positions(tps)
        for tp in tps:
            if starts[tp] < refill[tp]:
                await self._fill(tp, starts[tp], refill[tp])
            self.expect[tp] = self.next[tp] = max(starts[tp], refill[tp])
        self.refill = {}

    async def _on_batch(self, events: list[Any], revokes: int) -> None:
        # events fetched before a rebalance: Faust seeks back to the committed offsets and
        # delivers them again in the new generation
        generation = self.engine.generation()
        events = [ev for ev in events if ev.message.generation_id == generation]
        if not events:
            return
        async with self._locked("a batch"):
            if self.revokes != revokes or self.engine.generation() != generation:
                # a rebalance came while this batch waited for the lock. Restoring now
                # would take the revoked assignment's shards, which the next assignment
                # may give to another worker while this one is handed different ones
                return
            if self.ready and self.ready_generation != generation:
                # not reached with Faust's eager rebalancing (every new generation revokes
                # first); if it were, these shards may be another worker's by now: drop
                # them unstored (the stored state and the offsets make up for it)
                log.warning("assignment changed without a revoke: restoring again")
                self._drop_state()
            if not self.ready and not self.engine.recovered(self.inputs):
                # revoked, and the next assignment is not settled: restoring now would
                # take whatever the consumer holds meanwhile. What is dropped here the
                # engine does not deliver again; it is read directly once restored
                # (``_fill`` before the next record, ``_fill_tails`` at the end)
                return
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
                self.delivered[tp] = m.offset + 1
                await self.join.ingest(tp, RawMessage.of(m), ev)
            await self._pull_globals()
            self.join.stats.last_poll = time.monotonic()
            self.last_input = time.monotonic()
            self.flushed = False
            await self.join.drain(self.join.frontier(await self._lagging()))
            if self._checkpoint_due():
                await self.checkpoint()

    async def _fill(self, tp: Any, start: int, end: int) -> None:
        """Read offsets [start, end) of a partition ourselves: the engine skipped them.

        Faust does not hand every partition over gap-free: a restarted worker's stream
        partitions are resumed before Faust's seek to the committed offsets (recovery's
        ``on_recovery_completed``), and records fetched around that seek reach the agent
        twice, or not at all (the consumer drops those below its read offset). A checkpoint
        taken after such a gap would claim the skipped records read, and the next owner of
        the shard would never count them. Seeking the engine's consumer back races its read
        offset (what the seek fetches can be dropped again), so the missing records are
        read here, in order, before the record after them. The engine is told they were
        read elsewhere (Faust counts them acked) by the checkpoint that stores the state
        holding them, like the acks: told now, its commit would pass them, and a restart
        before that checkpoint would skip them."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        log.warning("%s: offsets %d-%d were skipped: reading them directly", tp, start, end - 1)
        if self._filler is None:
            self._filler = AIOKafkaConsumer(
                **self.kafka.client_options(),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
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
        self.filled.append((tp, start, end))

    def _tail_stall_s(self) -> float:
        flush = self.opts.idle_flush_s
        return TAIL_STALL_S if flush is None else min(flush, TAIL_STALL_S)

    async def _fill_tails(self) -> bool:
        """Read directly what the engine stopped delivering short of a partition's end;
        whether anything was read. A gap that ``_fill`` closes before the next record has
        no next record at the end of the input: records the engine delivered in a rebalance
        and the runtime dropped (``_on_batch``) are not delivered again, and the worker
        would wait for them for good (never caught up, never flushed, and with
        ``--idle-timeout`` its group never stopping: the other shards wait for this one's
        final marks). Only what the engine has read: the rest it still delivers itself."""
        got = False
        # ``_lagging`` also resolves where an input that delivered nothing starts
        for tp in await self._lagging(frontier=False):
            end = self.engine.read_to(tp) if tp.topic in self.inputs else None
            at = self.next.get(tp, self.start.get(tp, 0))
            if end is not None and at < end:
                await self._fill(tp, at, end)
                self.expect[tp] = self.next[tp] = end
                self.delivered[tp] = max(self.delivered.get(tp, 0), end)
                got = True
        return got

    def _checkpoint_due(self) -> bool:
        """Every ``commit_interval_s``, but never so often that checkpoints take more than a
        tenth of the time. Catching up, every node changes between two checkpoints and one
        costs its whole wall time: no record is taken while the broker acknowledges it. The
        wait for the broker spaces them by at most ``CHECKPOINT_SPACING_MAX_S``: one slowed by
        a broker fault (a leader moving) must not hold the commits back ten times as long."""
        since = time.monotonic() - self.last_checkpoint
        stats = self.join.stats
        waited = min(CHECKPOINT_SHARE * stats.checkpoint_s, CHECKPOINT_SPACING_MAX_S)
        built = CHECKPOINT_SHARE * stats.snapshot_s
        return since >= max(self.opts.commit_interval_s, built, waited)

    async def _lagging(self, *, frontier: bool = True) -> list[Any]:
        """Input partitions with records left to read. For the event-time ``frontier``
        leave out the mergers' input: it is applied in offset order, not merged in time."""
        tps = [tp for tp in self.engine.assignment() if tp.topic in self.inputs]
        unknown = [tp for tp in tps if tp not in self.next and tp not in self.start]
        if unknown:
            self.start.update(await self._start_offsets(unknown))
        lagging = []
        for tp in tps:
            hw = self.engine.highwater(tp)
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
        # only what is assigned now: asking a consumer about another partition fails (so
        # would /metrics, between a rebalance and the revoke)
        assigned = self.engine.assignment()
        side = set(self._side.assignment()) if self._side is not None else set()
        for tp, n in self.next.items():
            if tp in side:
                hw = self._side.highwater(tp)
            elif tp in assigned:
                hw = self.engine.highwater(tp)
            else:
                continue
            out[f"{tp.topic}:{tp.partition}"] = max(0, (hw or 0) - n)
        return out

    async def _caught_up(self) -> bool:
        """Every input partition is assigned and read to its end (not merely paused, as
        during a rebalance)."""
        assigned = [tp for tp in self.engine.assignment() if tp.topic in self.inputs]
        if not assigned:
            return False
        side_tps = set(self._side.assignment()) if self._side is not None else set()
        for tp in await self._lagging(frontier=False):
            hw = self._side.highwater(tp) if tp in side_tps else self.engine.highwater(tp)
            if hw is not None:
                return False  # known to have records left
            # else nothing was fetched from it yet (an empty partition never is): asked below
        # the fetcher's highwater is only as fresh as its last fetch (stale after a long
        # stall): ask the broker for the end offsets before closing every open minute
        ends = await self.engine.highwaters(assigned)
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
            committed = await admin.list_consumer_group_offsets(self.engine.group_id)
        finally:
            await admin.close()
        earliest = await self.engine.earliest_offsets(tps)
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
        started = time.monotonic()
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
        filled = []
        for tp, start, end in self.filled:
            stored = min(end, starts.get(f"{tp.topic}:{tp.partition}", 0))
            if start < stored:
                await self.engine.read_elsewhere(tp, start, stored)
            if stored < end:
                filled.append((tp, max(start, stored), end))
        self.filled = filled
        self.last_checkpoint = time.monotonic()
        self.join.stats.checkpoint_s = self.last_checkpoint - started

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
        try:
            await self._tick()
        except Exception as exc:
            async with self.lock:
                self._failed("a tick", exc)

    async def _tick(self) -> None:
        if self.stopping:
            return
        if not self.ready:
            # alive, waiting for inputs (a second worker of a group may wait for good) or for
            # their recovery: /healthz must not call that stalled
            self.join.stats.last_poll = time.monotonic()
            # Restore only once the inputs are assigned and resumed: Faust's recovery flag
            # is also set while the assignment is still empty, and a restore then finds no
            # shards (a restarted worker would start from nothing). Not at the first batch
            # either: a worker with nothing left to read (its last checkpoint covered every
            # input) would wait for one for good, and never flush nor stop when idle.
            if not self.engine.recovered(self.inputs):
                return
            async with self._locked("a tick"):
                await self._ready()
        async with self._locked("a tick"):
            if not self.ready:
                return  # revoked while this tick waited for the lock: nothing to store
            self.join.stats.last_poll = time.monotonic()
            got = await self._pull_globals()  # scheduler events while the samples are quiet
            idle = time.monotonic() - self.last_input
            if idle >= self._tail_stall_s() and await self._fill_tails():
                got = True
            if got:
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
                await self.engine.commit()
                log.info("idle for %.1f s: stopping", idle)
                self.engine.stop()

    def metrics(self) -> str:
        """``/metrics``: the worker's counters, dead letters and lag, Prometheus text."""
        return self.join.stats.prometheus(self.join.dl.counts, self.lag())

    def healthy(self) -> bool:
        """``/healthz``: false once the inputs have not been polled for ``healthz_stale_s``."""
        return not self.join.stats.stale()

    async def close(self) -> None:
        """The producer and the runtime's own consumers, at shutdown."""
        await self.pub.close()
        for consumer in (self._filler, self._side):
            if consumer is not None:
                await consumer.stop()


async def _close_quietly(pub: KafkaPublisher) -> None:
    """Stop a publisher that failed; what it still holds is sent again by the restored state."""
    try:
        await pub.close()
    except Exception as exc:
        log.debug("the failed publisher closed with %r", exc)
