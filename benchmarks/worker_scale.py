"""``python -m benchmarks scale``: aggregate throughput of 1 and of 2 Faust workers of one group
on the same records, side by side, and the Faust pass-through ceiling in the same run.

The ``scale`` estate (8-GPU nodes, both schedulers, its duplicates, late and malformed
records) is generated once; per run it goes into fresh topics with 2 partitions each. The
workers start first, on the empty topics, and are given time to settle their group (so the
figure is the steady split, not the first rebalance); then the records are published and the
workers' ``/metrics`` are polled, summed over the workers, from the end of the publishing to
the last record processed: the publisher (this process, a core's worth while it runs) is not
measured with them, and what they read then is a backlog, as the pass-through's is.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.processes import metrics, stop
from benchmarks.worker import run_passthrough
from benchmarks.worker_inproc import decoded, estate
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import TOPICS
from gpugap.schemas.topics import SAMPLES
from gpugap.services.kafka import free_port
from tests.harness.topics import create_topics

PARTITIONS = 2
SETTLE_S = 12.0  # Faust's group join and the rebalance of the second worker


async def publish(kafka: KafkaSettings, messages: list[Any]) -> None:
    async with KafkaPublisher(kafka) as pub:
        for topic, key, value, ts in messages:
            await pub.send_raw(kafka.topic_prefix + topic, key, value, ts)


def run_group(
    kafka: KafkaSettings, workers: int, messages: list[Any], expected: int
) -> tuple[float, float, float]:
    """``workers`` Faust workers of one group over the records: (GPU samples/s summed, GPU
    samples in the measured window, its seconds)."""
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    asyncio.run(create_topics(kafka, list(TOPICS), PARTITIONS))
    ports = [free_port() for _ in range(workers)]
    cmd = [sys.executable, "-m", "gpugap", "worker", "--backfill", "--group", f"scale{workers}"]
    procs = [
        subprocess.Popen([*cmd, "--http", f"127.0.0.1:{p}"], env=env, stderr=subprocess.PIPE)
        for p in ports
    ]
    try:
        time.sleep(SETTLE_S)
        asyncio.run(publish(kafka, messages))
        first: tuple[float, float] | None = None
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a worker exited: {p.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            ms = [metrics(port) for port in ports]
            now = time.monotonic()
            done = sum(m.get("gpugap_worker_processed_total", 0) for m in ms)
            gpus = sum(m.get("gpugap_worker_gpu_samples_total", 0) for m in ms)
            if first is None:
                if done >= expected:
                    raise RuntimeError("the workers kept up with the publisher: use more --samples")
                first = (now, gpus)
            elif done >= expected:
                seconds = now - first[0]
                return (gpus - first[1]) / seconds, gpus - first[1], seconds
            time.sleep(0.1)
        raise RuntimeError(f"{workers} worker(s) did not finish")
    finally:
        stop(procs)


def main(samples: int = 100_000, repeats: int = 3) -> int:
    from gpugap.groundfloor.settings import ServicesSettings
    from gpugap.services.kafka import LocalKafka

    messages, what = estate(samples)
    expected = len(decoded(messages))
    node_share = sum(m[0] == SAMPLES.name for m in messages) / len(messages)
    rates: dict[str, list[float]] = {"1 worker": [], "2 workers": [], "pass-through": []}
    print(f"scale-out: {what}; {PARTITIONS} partitions; median of {repeats}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpugap-bench-scale-") as tmp:
        broker = LocalKafka.ephemeral(ServicesSettings(), Path(tmp))
        broker.up()
        try:
            for _ in range(repeats):
                for n in (1, 2):
                    kafka = KafkaSettings(
                        bootstrap=broker.bootstrap, topic_prefix=f"bs{uuid.uuid4().hex[:8]}."
                    )
                    rate, measured, seconds = run_group(kafka, n, messages, expected)
                    rates[f"{n} worker" + ("s" if n > 1 else "")].append(rate)
                    print(
                        f"  ({n} worker(s): {rate:,.0f} GPU samples/s: "
                        f"{measured:,.0f} GPU samples after publishing, in {seconds:.1f} s)",
                        file=sys.stderr,
                    )
                msgs, _ = run_passthrough(kafka, len(messages))  # the last run's topics
                rates["pass-through"].append(msgs * node_share * 8)
        finally:
            broker.down()
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"{k:<34} {v:>15,.0f} GPU samples/s")
    print(f"  2 workers / 1 worker: {med['2 workers'] / med['1 worker']:.2f}x")
    print(f"  1 worker / Faust pass-through: {med['1 worker'] / med['pass-through']:.0%}")
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks scale")
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    raise SystemExit(main(a.samples, a.repeats))
