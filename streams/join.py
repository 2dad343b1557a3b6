"""The runner-independent half of a worker: decode, merge the inputs in event time, hand them
to the pure core, publish what it produced, and turn its state into snapshot records.

Both runners use it: the Faust app (streams/app.py, ``gpugap worker``) and the plain aiokafka
loop (streams/worker.py, ``gpugap worker --engine asyncio``). Records are buffered and handed
to the core in event-time order up to the **frontier** (the oldest latest-timestamp among input
partitions that are not caught up), so a fast samples partition cannot run ahead of the
scheduler events and make them late during a replay or a catch-up.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import json
import logging
import time
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpugap.kafka.consume import DeadLetters, RawMessage
from gpugap.kafka.publish import Publisher
from schemas import NodeSample, Record, encode
from schemas.clock import SECOND_MS, ms
from schemas.topics import ALERTS, ALLOCATIONS, K8S_PODS, MINUTES, SAMPLES, SLURM_JOBS
from schemas.types import DeadLetterKind
from streams.core import CoreConfig
from streams.process import Processor, Result

log = logging.getLogger(__name__)
INPUTS = (SAMPLES, SLURM_JOBS, K8S_PODS)
#: a buffer this large is drained regardless of the frontier (bounded memory)
MAX_BUFFERED = 500_000


@dataclass
class WorkerStats:
    started: float = field(default_factory=time.monotonic)
    messages: int = 0
    processed: int = 0  # records handed to the core (in event-time order)
    gpu_samples: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # outputs by topic
    last_poll: float = field(default_factory=time.monotonic)
    buffered: int = 0
    open_minutes: int = 0
    core: dict[str, int] = field(default_factory=dict)
    snapshot_s: float = 0.0  # how long building the last snapshot took
    #: /healthz answers 503 once the worker has not polled for this long
    stale_after_s: float = 60.0

    def stale(self) -> bool:
        return time.monotonic() - self.last_poll > self.stale_after_s

    def prometheus(self, dead: Counter[str], lag: dict[str, int] | None = None) -> str:
        up = time.monotonic() - self.started
        lines = [
            f"gpugap_worker_uptime_seconds {up:.1f}",
            f"gpugap_worker_messages_total {self.messages}",
            f"gpugap_worker_processed_total {self.processed}",
            f"gpugap_worker_gpu_samples_total {self.gpu_samples}",
            f"gpugap_worker_buffered_records {self.buffered}",
            f"gpugap_worker_open_minutes {self.open_minutes}",
            f"gpugap_worker_seconds_since_poll {time.monotonic() - self.last_poll:.1f}",
        ]
        lines += [f'gpugap_worker_output_total{{topic="{k}"}} {v}' for k, v in self.counts.items()]
        lines += [f'gpugap_worker_core_total{{what="{k}"}} {v}' for k, v in self.core.items()]
        lines += [f'gpugap_worker_dead_letters_total{{kind="{k}"}} {v}' for k, v in dead.items()]
        lines += [f'gpugap_worker_lag{{partition="{k}"}} {v}' for k, v in (lag or {}).items()]
        return "\n".join(lines) + "\n"


class Join:
    def __init__(
        self, publisher: Publisher, topic_prefix: str, config: CoreConfig | None = None
    ) -> None:
        self.pub = publisher
        self.prefix = topic_prefix
        self.proc = Processor(config)
        self.dl = DeadLetters(publisher, "worker", topic_prefix)
        self.stats = WorkerStats()
        #: (event ms, arrival seq, partition, raw message, record, runner's handle)
        self._buf: list[tuple[int, int, Any, RawMessage, Record, Any]] = []
        self._seq = 0
        self.latest: dict[Any, int] = {}  # partition -> latest event time fetched
        #: handles (e.g. Faust events) of records the core has taken, for the runner to ack
        self.done: list[Any] = []
        #: offsets taken by the core above a partition's lowest buffered one (event-time
        #: order is not offset order): a restart must skip them too, not apply them twice
        self.taken: dict[Any, set[int]] = {}
        self._unstored: set[str] = set()  # nodes changed since the last snapshot stored

    async def ingest(self, tp: Any, raw: RawMessage, handle: Any = None) -> None:
        """Decode one message (bad bytes -> dead letter) and buffer it in event-time order."""
        self.stats.messages += 1
        rec = await self.dl.decode(raw)
        t = 0 if rec is None else ms(rec.time)  # type: ignore[attr-defined]
        if rec is not None and (reason := self._outside_window(t)):
            await self.dl.route(raw, reason, DeadLetterKind.REJECTED)
            rec = None
        if rec is None:
            if handle is not None:
                self.done.append(handle)
            return
        self.latest[tp] = max(self.latest.get(tp, t), t)
        if isinstance(rec, NodeSample):
            self.stats.gpu_samples += len(rec.gpus)
        self._seq += 1
        heapq.heappush(self._buf, (t, self._seq, tp, raw, rec, handle))

    def _outside_window(self, t: int) -> str | None:
        cfg = self.proc.cfg
        if cfg.max_future_ms is None and cfg.max_past_ms is None:
            return None
        now = int(time.time() * SECOND_MS)
        if cfg.max_future_ms is not None and t > now + cfg.max_future_ms:
            off_s, bound_s = (t - now) / SECOND_MS, cfg.max_future_ms / SECOND_MS
            return (
                f"event time {off_s:,.0f} s ahead of this worker's clock (more than "
                f"--max-future {bound_s:g} s): a producer's clock is wrong"
            )
        if cfg.max_past_ms is not None and t < now - cfg.max_past_ms:
            off_s, bound_s = (now - t) / SECOND_MS, cfg.max_past_ms / SECOND_MS
            return (
                f"event time {off_s:,.0f} s behind this worker's clock (more than "
                f"--max-past {bound_s:g} s): replay or backfill with --backfill"
            )
        return None

    def frontier(self, lagging: Iterable[Any]) -> float:
        """Event time up to which every input has been read (``lagging``: partitions with
        records left to fetch; with none, everything buffered may go)."""
        behind = [self.latest.get(tp, -1) for tp in lagging]
        return min(behind) if behind else float("inf")

    async def drain(self, frontier: float) -> None:
        buf = self._buf
        handle_record, taken, done, stats = self.proc.handle, self.taken, self.done, self.stats
        while buf and (buf[0][0] <= frontier or len(buf) > MAX_BUFFERED):
            _, _, tp, raw, rec, handle = heapq.heappop(buf)
            try:
                res = handle_record(rec)
            except Exception as exc:
                # (an exception here at every restart was a crash loop: the record is kept,
                # with the reason, and the worker goes on)
                log.warning("dead-lettered a record the core could not process: %r", exc)
                await self.dl.route(
                    raw, f"processing failed: {type(exc).__name__}: {exc}", DeadLetterKind.REJECTED
                )
                res = None
            if res is not None and (res.minutes or res.alerts or res.allocations or res.refused):
                await self.publish(res, raw)
            stats.processed += 1
            if raw.offset is not None:
                offsets = taken.get(tp)
                if offsets is None:
                    offsets = taken[tp] = set()
                offsets.add(raw.offset)
            if handle is not None:
                done.append(handle)
            if not stats.processed % 200:
                # let /metrics and /healthz answer while catching up: a liveness probe
                # must not see a worker draining a large backlog as dead
                await asyncio.sleep(0)
        await self.publish(self.proc.advance(), None)
        self.stats.buffered = len(buf)
        self.stats.open_minutes = self.proc.open_minutes()

    async def flush_all(self) -> None:
        """Input is quiet: process everything buffered and close every minute seen."""
        await self.drain(float("inf"))
        await self.publish(self.proc.advance(self.proc.cfg.lateness_ms), None)
        self.stats.open_minutes = self.proc.open_minutes()

    def lowest_buffered(self) -> dict[Any, int]:
        """Per partition, the lowest offset still buffered (not yet in the core's state)."""
        low: dict[Any, int] = {}
        for _, _, tp, raw, _, _ in self._buf:
            if raw.offset is not None:
                low[tp] = min(low.get(tp, raw.offset), raw.offset)
        return low

    def resume_points(self, next_offsets: dict[Any, int]) -> dict[str, Any]:
        """Per partition ("topic:partition"): the offset to resume from, and the offsets
        above it the core has already taken."""
        low = self.lowest_buffered()
        out: dict[str, Any] = {}
        for tp, nxt in next_offsets.items():
            start = low.get(tp, nxt)
            taken = self.taken.get(tp, set())
            above = sorted(o for o in taken if o >= start)
            self.taken[tp] = set(above)
            out[f"{tp.topic}:{tp.partition}"] = [start, above] if above else start
        return out

    async def publish(self, res: Result, raw: RawMessage | None) -> None:
        for a in res.allocations:
            await self.pub.send(ALLOCATIONS, a)
        send = self.pub.send_encoded
        for m in res.minutes:  # the bulk of the output: the key and timestamp directly
            await send(MINUTES, MINUTES.key_for(m), encode(m), ms(m.minute))
        for al in res.alerts:
            await self.pub.send(ALERTS, al)
        for r in res.refused:
            src = raw if raw is not None and r.record is not None else None
            if src is None or encode(r.record) != src.value:
                src = RawMessage(
                    ALLOCATIONS.qualified(self.prefix), None, None, None, encode(r.record)
                )
            await self.dl.route(src, r.reason, r.kind)
        c = self.stats.counts
        c[ALLOCATIONS.name] += len(res.allocations)
        c[MINUTES.name] += len(res.minutes)
        c[ALERTS.name] += len(res.alerts)

    # --- snapshots: one record per node plus "meta" (gangs, alerts, input offsets) ----------

    def checkpoint_due(self, since_last_s: float, interval_s: float) -> bool:
        """Every ``interval_s``, but never so often that writing the state takes more than
        a tenth of the time: catching up, every node changes between two checkpoints."""
        return since_last_s >= max(interval_s, 10 * self.stats.snapshot_s)

    def snapshot(self, offsets: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """The records to write: the nodes changed since the last snapshot stored (the topic
        is compacted, so it keeps every other node's last record) and the meta record. Call
        :meth:`snapshot_stored` once they are acknowledged; until then they are written
        again with the next snapshot."""
        started = time.perf_counter()
        st = self.proc.state
        self._unstored |= self.proc.changed()
        nodes = st["nodes"]
        items = [(f"node:{k}".encode(), _pack(nodes[k])) for k in sorted(self._unstored)]
        meta = {k: v for k, v in st.items() if k != "nodes"}
        meta["node_keys"] = sorted(st["nodes"])
        meta["offsets"] = offsets
        items.append((b"meta", _pack(meta)))
        self.stats.core = self.proc.counts()
        self.stats.snapshot_s = time.perf_counter() - started
        return items

    def snapshot_stored(self) -> None:
        self._unstored = set()

    def restore(self, records: dict[bytes, bytes]) -> dict[str, Any] | None:
        """Load a snapshot (latest value per key); returns the resume points stored with it
        (see :meth:`resume_points`; :func:`already_taken` reads them), or None."""
        records = dict(records)
        meta_raw = records.pop(b"meta", None)
        if meta_raw is None:
            return None
        state = _unpack(meta_raw)
        offsets: dict[str, Any] = state.pop("offsets")
        keys = set(state.pop("node_keys"))
        nodes = {k.decode()[5:]: _unpack(v) for k, v in records.items() if k.startswith(b"node:")}
        state["nodes"] = {k: v for k, v in nodes.items() if k in keys}
        self.proc = Processor(self.proc.cfg, state=state)
        self._unstored = set()
        return offsets


def tune_gc() -> None:
    """For a worker process: what is loaded so far is permanent (never scanned again), and
    young collections run every 100,000 allocations instead of 700. The core allocates a
    few small lists per GPU sample that live for minutes; with the default thresholds the
    collector's passes over them took as long as the core itself."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def resume_offset(point: Any) -> int:
    return int(point[0] if isinstance(point, list) else point)


def already_taken(points: dict[str, Any], topic: str, partition: int, offset: int) -> bool:
    """Whether the restored state already includes this input record."""
    p = points.get(f"{topic}:{partition}")
    if p is None:
        return False
    if isinstance(p, list):
        return offset < p[0] or offset in p[1]
    return bool(offset < p)


def _pack(obj: Any) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 1)


def _unpack(data: bytes) -> Any:
    return json.loads(zlib.decompress(data))
