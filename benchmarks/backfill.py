"""``python -m benchmarks backfill [--hours H] [--gpus N] [--interval S] [--concurrency 1,4]``:
days of dcgm-exporter history backfilled per minute, from a real Prometheus.

A 256-GPU estate (32 nodes of 8 GPUs, dcgm-exporter's labels, SM active, GPU_UTIL, memory
used and free, power) scraped every 30 s is written as OpenMetrics and loaded into a real
Prometheus (tests/harness/prometheus.py: built once from the Go module proxy, promtool's block
import). ``gpugap backfill prometheus`` (``PrometheusTelemetry``) then reads it back: every
query, answer, node sample and record encoding, with each record encoded as a Kafka
publisher would (the broker is measured by ``python -m benchmarks kafka``). Printed: wall
time, node samples and GPU samples per second, and days of history per minute of backfill.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpugap.groundfloor.kafka.publish import Publisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.backfill.settings import BackfillSettings
from gpugap.producers.backfill.telemetry import PrometheusTelemetry
from gpugap.schemas import Record, Topic, encode
from tests.harness.prometheus import Prometheus, ensure_built, load_openmetrics

START = datetime(2026, 9, 1, tzinfo=UTC)


class _Encoding(Publisher):
    """Encodes every record as the Kafka publisher would; keeps counts only."""

    def __init__(self) -> None:
        self.bytes = 0
        self.gpus = 0

    async def send(self, topic: Topic[Any], record: Record) -> None:
        self.bytes += len(encode(record))
        self.gpus += len(getattr(record, "gpus", ()))
        self.sent += 1

    async def flush(self) -> None:
        pass


def history(gpus: int, hours: float, interval: int) -> str:
    """OpenMetrics of ``gpus`` GPUs (8 a node) every ``interval`` s for ``hours``."""
    steps = int(hours * 3600 // interval)
    t0 = int(START.timestamp())
    metrics = {
        "DCGM_FI_PROF_SM_ACTIVE": lambda g, k: ((g * 7 + k) % 100) / 100,
        "DCGM_FI_DEV_GPU_UTIL": lambda g, k: float((g * 7 + k) % 100),
        "DCGM_FI_DEV_FB_USED": lambda g, k: float(1000 + (g + k) % 40000),
        "DCGM_FI_DEV_FB_FREE": lambda g, k: float(80000 - (1000 + (g + k) % 40000)),
        "DCGM_FI_DEV_POWER_USAGE": lambda g, k: 70.0 + (g + k) % 600,
    }
    lines = []
    for name, value in metrics.items():
        lines.append(f"# TYPE {name} gauge")
        for g in range(gpus):
            node = f"gpu-node-{g // 8:03d}"
            labels = (
                f'gpu="{g % 8}",UUID="GPU-{g:08x}-0000-4000-8000-000000000000",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",'
                f'instance="{node}:9400",job="dcgm"'
            )
            offset = (g // 8) % interval  # each node scraped at its own offset
            lines += [
                f"{name}{{{labels}}} {value(g, k)!r} {t0 + offset + k * interval}"
                for k in range(steps)
            ]
    return "\n".join([*lines, "# EOF", ""])


async def _run(
    prom: Prometheus, hours: float, interval: int, concurrency: int
) -> tuple[float, _Encoding]:
    root = Path(tempfile.mkdtemp(prefix="gpugap-bench-cp-"))
    try:
        cfg = BackfillSettings(
            prometheus_url=prom.url,
            cluster="bench",
            checkpoint_dir=root,
            concurrency=concurrency,
            scrape_interval_s=float(interval),
        )
        source = PrometheusTelemetry(
            Settings(), cfg, since=START, until=START + timedelta(hours=hours)
        )
        pub = _Encoding()
        started = time.perf_counter()
        await run_producer(source, pub)
        return time.perf_counter() - started, pub
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks backfill", description=__doc__)
    p.add_argument("--hours", type=float, default=6.0, help="hours of history (default 6)")
    p.add_argument("--gpus", type=int, default=256, help="GPUs, 8 a node (default 256)")
    p.add_argument("--interval", type=int, default=30, help="scrape interval, s (default 30)")
    p.add_argument("--concurrency", default="1,4", help="chunks fetched at once, each measured")
    args = p.parse_args(argv)
    exe, promtool = ensure_built()
    root = Path(tempfile.mkdtemp(prefix="gpugap-bench-backfill-"))
    try:
        t = time.perf_counter()
        text = history(args.gpus, args.hours, args.interval)
        load_openmetrics(promtool, text, root / "tsdb")
        print(
            f"history: {args.gpus} GPUs x {args.hours:g} h at {args.interval} s "
            f"({len(text) / 1e6:.0f} MB of OpenMetrics, loaded in {time.perf_counter() - t:.0f} s)"
        )
        del text
        with Prometheus(exe, root / "tsdb") as prom:
            for c in (int(x) for x in args.concurrency.split(",")):
                wall, pub = asyncio.run(_run(prom, args.hours, args.interval, c))
                days_per_min = args.hours / 24 / (wall / 60)
                print(
                    f"concurrency {c}: {wall:.1f} s, {pub.sent:,} node samples "
                    f"({pub.sent / wall:,.0f}/s), {pub.gpus:,} GPU samples "
                    f"({pub.gpus / wall:,.0f}/s), {pub.bytes / 1e6:.0f} MB encoded: "
                    f"{days_per_min:.2f} days of history per minute"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0
