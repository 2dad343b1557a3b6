"""``python -m benchmarks soak``: the ``scale`` estate's real-time load (1,350 8-GPU nodes every
10 s) for 30 minutes over 2 workers of one group, the sink and the embedded ClickHouse, with a
line every minute: each process's resident memory, the workers' lag, the latency of the
GPU-minute rows that became queryable in that minute, and the dead letters so far.

Pass or fail is printed at the end, by the soak's three claims: resident memory flat after the
warm-up (each process's last minute within ``RSS_GROWTH`` of its fifth), the lag bounded (the
last 10 minutes' maximum no more than the 10 minutes' after the warm-up, plus one tick),
nothing dead-lettered (the estate publishes only valid records).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from benchmarks.worker_latency import Run, Seen, Watch, bench_latency
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.topics import DEAD_LETTER

NODES = 1350
WORKERS = 2
WARM_UP_MIN = 5
#: resident memory may grow this much from the end of the warm-up to the end (allocator noise)
RSS_GROWTH = 0.10


def rss_mib(pid: int) -> float:
    """A process's resident set (VmRSS), MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def dead_letters(kafka: KafkaSettings) -> int:
    """Records on the dead-letter topic (its end offsets summed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(**kafka.client_options())
    await c.start()
    try:
        topic = DEAD_LETTER.qualified(kafka.topic_prefix)
        await c.topics()  # fetches the cluster's metadata
        parts = c.partitions_for_topic(topic) or set()
        ends = await c.end_offsets([TopicPartition(topic, p) for p in parts]) if parts else {}
        return sum(ends.values())
    finally:
        await c.stop()


class Soak:
    """The minute-by-minute report, and the figures the verdict needs."""

    def __init__(self) -> None:
        self.rss: dict[str, list[float]] = {}
        self.lag_max: list[float] = []
        self.dead: list[int] = []

    def watcher(self, run: Run) -> Watch:
        async def watch(seen: Seen, stop: asyncio.Event) -> None:
            names = list(run.pids)
            print(
                f"{'min':>4} "
                + " ".join(f"{n + ' MiB':>12}" for n in names)
                + f" {'lag max':>9} {'rows':>7} {'row p50':>8} {'row p99':>8} {'dead':>5}",
                flush=True,
            )
            rows_seen, lag_seen, minute = 0, 0, 0
            next_at = time.time() + 60
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - time.time()))
                    break
                except TimeoutError:
                    pass
                minute += 1
                next_at += 60
                mem = {n: rss_mib(pid) for n, pid in run.pids.items()}
                for n, v in mem.items():
                    self.rss.setdefault(n, []).append(v)
                lags = [n for _, n in seen.lag[lag_seen:]]
                lag_seen = len(seen.lag)
                rows = seen.minutes[rows_seen:]
                rows_seen = len(seen.minutes)
                dead = await dead_letters(run.kafka)
                self.lag_max.append(max(lags, default=0.0))
                self.dead.append(dead)
                q = statistics.quantiles(rows, n=100) if len(rows) > 1 else rows * 99
                print(
                    f"{minute:>4} "
                    + " ".join(f"{mem[n]:>12.0f}" for n in names)
                    + f" {self.lag_max[-1]:>9,.0f} {len(rows):>7,}"
                    + (f" {q[49]:>6.1f} s {q[98]:>6.1f} s" if rows else f" {'-':>8} {'-':>8}")
                    + f" {dead:>5}",
                    flush=True,
                )

        return watch

    def verdict(self) -> tuple[bool, list[str]]:
        lines, ok = [], True
        for name, xs in self.rss.items():
            if len(xs) <= WARM_UP_MIN:
                lines.append(f"{name}: too short a run to judge its memory")
                ok = False
                continue
            warm, end = xs[WARM_UP_MIN - 1], xs[-1]
            growth = (end - warm) / warm if warm else 0.0
            flat = growth <= RSS_GROWTH
            ok &= flat
            lines.append(
                f"{name}: RSS {warm:,.0f} MiB at minute {WARM_UP_MIN}, {end:,.0f} MiB at the end "
                f"({growth:+.1%}; {'flat' if flat else 'GROWING'})"
            )
        # from the end of the warm-up (the history published first is caught up by then)
        first = self.lag_max[WARM_UP_MIN : WARM_UP_MIN + 10]
        last = self.lag_max[-10:]
        bounded = bool(first) and max(last) <= max(first) + NODES
        ok &= bounded
        lines.append(
            f"workers' lag: max {max(first, default=0.0):,.0f} records in the 10 minutes after "
            f"the warm-up, "
            f"{max(last, default=0.0):,.0f} in the last 10 ({'bounded' if bounded else 'GROWING'})"
        )
        dead = self.dead[-1] if self.dead else 0
        ok &= dead == 0
        lines.append(f"dead letters: {dead:,}")
        return ok, lines


def main(duration_s: float = 1800.0, nodes: int = NODES) -> int:
    soak = Soak()
    print(
        f"soak: {nodes:,} 8-GPU nodes every 10 s for {duration_s / 60:.0f} min over {WORKERS} "
        "workers, the sink and the embedded ClickHouse; a line a minute",
        flush=True,
    )
    bench_latency(duration_s, nodes, "faust", workers=WORKERS, watch=soak.watcher)
    ok, lines = soak.verdict()
    print("\n".join(lines), flush=True)
    print("soak: PASS" if ok else "soak: FAIL", flush=True)
    return 0 if ok else 1
