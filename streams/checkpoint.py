"""What a checkpoint holds and where a restart resumes: one snapshot per shard.

A shard is one partition number of the inputs. Its snapshot is one record per node of the
shard plus its meta record (gangs, merged idle episodes, marks, and the input positions the
state covers). Shard 0 keeps the keys single-partition releases wrote (``node:<key>``,
``meta``), so their checkpoints restore; shard ``s`` > 0 writes ``<s>:node:<key>`` and
``<s>:meta``. The Faust engine writes a shard's records to the changelog partition of the same
number, the asyncio engine to its one-partition compacted topic.

Resume points, per input partition (``"topic:partition"``): the offset to resume from, or
``[offset, [offsets above it already taken]]`` (event-time order is not offset order).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_json

from gpugap.streams.state import ProcessorState

Points = dict[str, Any]


def prefix(shard: int) -> bytes:
    return b"" if shard == 0 else f"{shard}:".encode()


def shard_records(
    shard: int, state: ProcessorState, changed: set[str], points: Points
) -> list[tuple[bytes, bytes | None]]:
    """The records of one shard's snapshot: its changed nodes (a tombstone, None, for one
    no longer held: the node expiry dropped it), then its meta record."""
    pre = prefix(shard)
    nodes = state["nodes"]
    items: list[tuple[bytes, bytes | None]] = [
        (pre + f"node:{k}".encode(), pack(nodes[k]) if k in nodes else None)
        for k in sorted(changed)
    ]
    meta: dict[str, Any] = {k: v for k, v in state.items() if k != "nodes"}
    meta["node_keys"] = sorted(nodes)
    meta["offsets"] = points
    items.append((pre + b"meta", pack(meta)))
    return items


def restore_shard(shard: int, records: Mapping[bytes, bytes | None]) -> tuple[Any, Points] | None:
    """A shard's state and resume points from the latest record per key (None: a tombstone),
    or None."""
    pre = prefix(shard)
    meta_raw = records.get(pre + b"meta")
    if meta_raw is None:
        return None
    state = unpack(meta_raw)
    points: Points = state.pop("offsets")
    keys = set(state.pop("node_keys"))
    node_pre = pre + b"node:"
    nodes = {
        k[len(node_pre) :].decode(): v
        for k, v in records.items()
        if v is not None and k.startswith(node_pre)
    }
    state["nodes"] = {k: unpack(v) for k, v in nodes.items() if k in keys}
    return state, points


def resume_offset(point: Any) -> int:
    return int(point[0] if isinstance(point, list) else point)


def already_taken(points: Points, topic: str, partition: int, offset: int) -> bool:
    """Whether the restored state already includes this input record."""
    p = points.get(f"{topic}:{partition}")
    if p is None:
        return False
    if isinstance(p, list):
        return offset < p[0] or offset in p[1]
    return bool(offset < p)


def keep_restored(restored: Points, now: Points) -> Points:
    """This run's resume points over the restored ones: a partition not yet read past its
    restored point keeps that point instead of moving back to this run's read position, and
    offsets the restored state took above the new point stay taken."""
    points = dict(restored)
    for key, p in now.items():
        old = points.get(key)
        start = resume_offset(p)
        if old is not None and start < resume_offset(old):
            continue
        above = set(p[1]) if isinstance(p, list) else set()
        if isinstance(old, list):
            above |= {o for o in old[1] if o >= start}
        points[key] = [start, sorted(above)] if above else start
    return points


def start_offset(restored: dict[int, Points], key: str, shards: Any) -> int | None:
    """Where reading an input partition starts for ``shards`` that need it: the lowest of
    their restored points, or None when one of them has none (it needs the committed or
    first offset)."""
    found = []
    for s in shards:
        p = restored.get(s, {}).get(key)
        if p is None:
            return None
        found.append(resume_offset(p))
    return min(found) if found else None


def pack(obj: Any) -> bytes:
    # pydantic-core's JSON writer: the same bytes as ``json.dumps(obj, separators=(",", ":"))``
    # but for the spelling of small floats ("0.00001", "2.5e-7"), in 40 % of the time (the
    # snapshot of every node changed between two checkpoints is ~7 % of a catching-up
    # worker's time); deterministic like it, and read back by any JSON reader
    return zlib.compress(to_json(obj, ensure_ascii=True), 1)


def unpack(data: bytes) -> Any:
    return json.loads(zlib.decompress(data))
