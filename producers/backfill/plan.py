"""A backfill's range in chunks, its checkpoint, and its progress line.

- **Chunks** are aligned to multiples of the chunk length (UTC epoch), so two runs over
  overlapping ranges cut the same chunks; the first and last are cut at the range's ends.
  Each chunk is ``[start, end)`` in epoch milliseconds.
- **Checkpoint**: one JSON file per source, cluster and selection (not per range: ``--since
  -30d --until now`` moves on every run, its aligned chunks do not), listing the chunks
  published and flushed, rewritten atomically (temporary file, fsync, rename) after each.
  A run skips every chunk already done, so a killed run resumes where it stopped and a
  finished range publishes nothing again unless ``--restart``. What a killed run published
  of its last chunk is published again, with the same event ids and times: downstream
  dedupes it.
- **Progress** on stderr: chunks, records, rate and ETA, at most once a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gpugap.schemas.errors import ConfigError

Chunk = tuple[int, int]


def chunks(start_ms: int, end_ms: int, chunk_ms: int) -> list[Chunk]:
    """``[start, end)`` cut at multiples of ``chunk_ms``."""
    if start_ms >= end_ms:
        raise ConfigError("backfill: --since must be before --until")
    out, lo = [], start_ms
    while lo < end_ms:
        hi = min((lo // chunk_ms + 1) * chunk_ms, end_ms)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class Checkpoint:
    """The chunks of one source and range already published and flushed."""

    path: Path
    key: dict[str, str]
    done: set[Chunk] = field(default_factory=set)
    records: int = 0

    @classmethod
    def open(cls, folder: Path, key: dict[str, str], *, restart: bool) -> Checkpoint:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        name = f"{key['source']}-{key['cluster']}-{digest}.json"
        path = folder.expanduser() / "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        cp = cls(path, key)
        if restart or not path.exists():
            return cp
        try:
            data = json.loads(path.read_text())
            cp.done = {(int(lo), int(hi)) for lo, hi in data["done"]}
            cp.records = int(data.get("records", 0))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"backfill: the checkpoint {path} is unreadable ({exc}): remove it or --restart"
            ) from None
        if data.get("key") != key:
            raise ConfigError(f"backfill: the checkpoint {path} is another backfill's: --restart")
        return cp

    def mark(self, chunk: Chunk, records: int) -> None:
        self.done.add(chunk)
        self.records += records
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        done = [list(c) for c in sorted(self.done)]
        state = {"key": self.key, "done": done, "records": self.records}
        with tmp.open("w") as f:
            f.write(json.dumps(state))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)


@dataclass
class Progress:
    """``backfill prometheus: 12/72 chunks 16.7% | 0.5 d of 3.0 d | 34,000 records
    1,200/s | 2.1 d of history/min | ETA 1m20s``, at most once a second."""

    what: str
    total_chunks: int
    total_ms: int
    out: TextIO = field(default_factory=lambda: sys.stderr)
    done_chunks: int = 0
    done_ms: int = 0
    records: int = 0
    started: float = field(default_factory=time.monotonic)
    _shown: float = 0.0

    def skip(self, chunk: Chunk) -> None:
        """A chunk an earlier run did: it counts as done, not in the rate."""
        self.total_chunks -= 1
        self.total_ms -= chunk[1] - chunk[0]

    def advance(self, chunk: Chunk, records: int) -> None:
        self.done_chunks += 1
        self.done_ms += chunk[1] - chunk[0]
        self.records += records
        self.show(final=self.done_chunks == self.total_chunks)

    def show(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._shown < 1.0:
            return
        self._shown = now
        self.out.write(self.line(now) + "\n")
        self.out.flush()

    def line(self, now: float) -> str:
        spent = max(now - self.started, 1e-6)
        share = self.done_ms / self.total_ms if self.total_ms else 1.0
        eta = spent / share - spent if share else float("inf")
        days, total_days = self.done_ms / 86_400_000, self.total_ms / 86_400_000
        return (
            f"backfill {self.what}: {self.done_chunks}/{self.total_chunks} chunks "
            f"{100 * share:.1f}% | {days:.2f} d of {total_days:.2f} d | {self.records:,} "
            f"records {self.records / spent:,.0f}/s | {days / spent * 60:.2f} d of history/min"
            f" | ETA {_duration(eta)}"
        )


def _duration(s: float) -> str:
    if s == float("inf"):
        return "?"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
