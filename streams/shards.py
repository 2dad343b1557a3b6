"""The shards of a worker's state and their checkpoints (the half of ``streams.join.Join``
that knows which shard holds what; docs/worker.md#scale-out)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.partitioner import murmur2

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.streams.checkpoint import (
    Points,
    already_taken,
    keep_restored,
    restore_shard,
    shard_records,
)
from gpugap.streams.core import CoreConfig
from gpugap.streams.process import Held, Processor
from gpugap.streams.stats import WorkerStats

log = logging.getLogger(__name__)
#: the node cap's warning is logged at most this often
CAP_WARN_EVERY_S = 60.0


def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, every client of ours) gives a key."""
    return (int(murmur2(key.encode())) & 0x7FFFFFFF) % partitions


class Shards:
    """The shards a worker owns; ``Join`` routes records to them."""

    cfg: CoreConfig
    partitions: int
    global_topics: set[str]
    stats: WorkerStats
    shards: dict[int, Processor]
    skip: dict[int, Points]  # shard -> the input its restored state holds
    taken: dict[Any, set[int]]
    _parts: dict[str, int]
    _unstored: dict[int, set[str]]
    _buf: list[tuple[int, int, Any, RawMessage, Any, Any]]
    _held: Held  # what the shards here hold together (the caps)
    #: (when the node cap was last logged, nodes refused then)
    _cap_warned: tuple[float, int] = (-CAP_WARN_EVERY_S, 0)

    @property
    def proc(self) -> Processor:
        """The one shard of a single-partition worker."""
        return self.shards[0]

    def part(self, key: str) -> int:
        if self.partitions == 1:
            return 0
        p = self._parts.get(key)
        if p is None:
            if len(self._parts) > 100_000:
                self._parts.clear()
            p = self._parts[key] = partition_for(key, self.partitions)
        return p

    def _has(self, shard: int, raw: RawMessage) -> bool:
        """Whether the shard's restored state already includes this input record."""
        points = self.skip.get(shard)
        if not points or raw.offset is None:
            return False
        return already_taken(points, raw.topic, raw.partition or 0, raw.offset)

    def _owns(self, shard: int) -> Any:
        if self.partitions == 1:
            return lambda key: True
        return lambda key: self.part(key) == shard

    def settled(self) -> bool:
        """Every merger here has every shard's final mark (a flushed group can stop)."""
        return all(p.settled() for p in self.shards.values())

    def open_minutes(self) -> int:
        return sum(p.open_minutes() for p in self.shards.values())

    def nodes_held(self) -> int:
        """Nodes held over every shard here: what the node cap counts."""
        return self._held.nodes

    def gpus_held(self) -> int:
        """GPUs held over every shard here: what the GPU cap counts."""
        return self._held.gpus

    def allocations_held(self) -> int:
        """Allocations held over every shard here: what the allocation cap counts."""
        return self._held.allocs

    def lowest_buffered(self) -> dict[Any, int]:
        """Per partition, the lowest offset still buffered (not yet in the core's state)."""
        low: dict[Any, int] = {}
        for _, _, tp, raw, _, _ in self._buf:
            if raw.offset is not None:
                low[tp] = min(low.get(tp, raw.offset), raw.offset)
        return low

    def resume_points(self, next_offsets: dict[Any, int]) -> dict[int, Points]:
        """Per shard, per input partition it reads ("topic:partition"): the offset to resume
        from and the offsets above it already taken (``streams.checkpoint``)."""
        low = self.lowest_buffered()
        now: dict[Any, Any] = {}
        for tp, nxt in next_offsets.items():
            start = low.get(tp, nxt)
            above = sorted(o for o in self.taken.get(tp, ()) if o >= start)
            self.taken[tp] = set(above)
            now[tp] = [start, above] if above else start
        out = {}
        for s in self.shards:
            mine = {
                f"{tp.topic}:{tp.partition}": p
                for tp, p in now.items()
                if tp.topic in self.global_topics or tp.partition == s
            }
            out[s] = keep_restored(self.skip.get(s, {}), mine)
        return out

    def snapshot(self, points: dict[int, Points]) -> list[tuple[int, bytes, bytes | None]]:
        """(shard, key, value) to write: per shard, the nodes changed since its last snapshot
        stored (the topic is compacted: it keeps the others' last records; a node dropped
        gets a tombstone, value None) and its meta record. Call :meth:`snapshot_stored`
        once they are acknowledged; until then they are written again with the next
        snapshot."""
        started = time.perf_counter()
        items = []
        for s in sorted(self.shards):
            proc = self.shards[s]
            changed = self._unstored.setdefault(s, set())
            changed |= proc.changed()
            items += [(s, k, v) for k, v in shard_records(s, proc.state, changed, points[s])]
        total: Counter[str] = Counter()
        for proc in self.shards.values():
            total.update(proc.counts())
        self.stats.core = dict(total)
        held = self._held
        self.stats.nodes, self.stats.gpus, self.stats.allocations = (
            held.nodes,
            held.gpus,
            held.allocs,
        )
        refused = ("nodes_refused", "gpus_refused", "allocations_refused")
        self._warn_cap(sum(total.get(k, 0) for k in refused))
        self.stats.snapshot_s = time.perf_counter() - started
        return items

    def _warn_cap(self, refused: int) -> None:
        at, before = self._cap_warned
        now = time.monotonic()
        if refused > before and now - at >= CAP_WARN_EVERY_S:
            cfg = self.cfg
            log.warning(
                "state caps: %d record(s) refused (dead letters, kind rejected, each with its "
                "reason) since the last warning; held: %d nodes (at most %s, "
                "GPUGAP_WORKER_MAX_NODES), %d GPUs (%s, GPUGAP_WORKER_MAX_GPUS), %d "
                "allocations (%s, GPUGAP_WORKER_MAX_ALLOCATIONS)",
                refused - before,
                self.stats.nodes,
                _cap(cfg.max_nodes),
                self.stats.gpus,
                _cap(cfg.max_gpus),
                self.stats.allocations,
                _cap(cfg.max_allocs),
            )
            self._cap_warned = (now, refused)

    def snapshot_stored(self) -> None:
        self._unstored = {}

    def restore(
        self, records: Mapping[bytes, bytes | None], shards: Iterable[int] | None = None
    ) -> dict[int, Points]:
        """Own ``shards`` (default: all), each from its snapshot in ``records`` (latest value
        per key) or from nothing; returns the resume points of those restored."""
        self.shards, self.skip, self._unstored = {}, {}, {}
        self._held = Held()
        for s in range(self.partitions) if shards is None else sorted(shards):
            got = restore_shard(s, records)
            state, points = got if got is not None else (None, {})
            self.shards[s] = Processor(self.cfg, state=state, held=self._held)
            self.skip[s] = points
        return {s: p for s, p in self.skip.items() if p}


def _cap(n: int | None) -> str:
    return f"{n:,}" if n is not None else "no cap"
