"""``python -m benchmarks fuzz [--hostile N] [--engine faust]``: hostile records through a
real worker process on a real (throwaway) Kafka broker.

The ``small`` scenario is published twice, into two topic namespaces: once as it is, once with
N hostile records spread through its input topics: random bytes, truncated and non-JSON text,
JSON that breaks the schema (numbers past their bounds, 50,000 GPUs, a 2-day interval, 1e308,
naive times, unknown enums, strings for numbers, records on the wrong topic), and valid records
dated a day to a century ahead of the clock. One ``gpugap worker`` runs over each namespace
until its input is quiet. Printed: the worker's exit code, the dead letters beyond the clean
run's and how many carry a reason, and the good records' GPU-seconds per class, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.processes import ENGINES
from benchmarks.topics import preload
from gpugap.groundfloor.settings import KafkaSettings, ServicesSettings
from gpugap.schemas import DeadLetter, GpuMinute, decode
from gpugap.schemas.topics import DEAD_LETTER, K8S_PODS, MINUTES, SAMPLES, SLURM_JOBS
from tests.harness.capture import Capture, Msg

INPUTS = (SAMPLES.name, SLURM_JOBS.name, K8S_PODS.name)


def scenario() -> list[Msg]:
    from gpugap.simulator import build
    from gpugap.simulator import scenario as scenarios
    from gpugap.simulator.emit import Emitter

    sc = scenarios.load("small")
    cap = Capture()
    asyncio.run(Emitter(sc, build(sc), sc.scenario.duration).run(cap))
    return cap.messages


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def hostile(rng: random.Random, good: list[Msg]) -> Msg:
    """One record the worker must dead-letter (never count)."""
    topic, key, value, ts = rng.choice(good)
    doc: Any = json.loads(value) if value.startswith(b"{") else {}
    kind = rng.random()
    if kind < 0.15:  # bytes that are not JSON
        body = rng.randbytes(rng.randint(0, 300))
        return topic, key, body if not body.startswith(b"{") else b"x" + body, ts
    if kind < 0.25:  # a truncated record
        return topic, key, value[: rng.randint(0, max(0, len(value) - 1))], ts
    if kind < 0.35:  # a valid record on the wrong topic
        other = rng.choice([t for t in INPUTS if t != topic])
        return other, key, value, ts
    ahead = datetime.now(UTC) + timedelta(days=rng.choice([1, 30, 365, 36_500]))
    if kind < 0.55 and isinstance(doc, dict) and "time" in doc:  # a clock far ahead
        doc["time"] = _ts(ahead)
        for f in ("start_time", "end_time"):
            if doc.get(f):
                doc[f] = _ts(ahead)
        return topic, key, json.dumps(doc).encode(), ts
    # the schema's bounds and types
    breaks = {
        SAMPLES.name: [
            ("interval_s", rng.choice([1e308, 172_800.0, -1.0, "10"])),
            ("gpus", [{"uuid": "GPU-x", "index": 0}]),
            ("gpus", [{"uuid": f"GPU-{uuid.UUID(int=i)}", "index": i % 9} for i in range(300)]),
            ("time", "2026-11-02T00:00:00"),  # naive
            ("cluster", ""),
            ("node", "a/b"),
            ("source", "nvml-ish"),
        ],
        SLURM_JOBS.name: [
            ("gpus_total", 10**9),
            ("nodes", [{"node": "gpu01", "gpu_indices": [0, 0]}]),
            ("nodes", [{"node": "gpu01", "gpu_indices": [5000]}]),
            ("state", "EXPLODED"),
            ("time", None),
            ("job_id", "x" * 300),
        ],
        K8S_PODS.name: [
            ("gpus", rng.choice([50_000, -1, 1.5, "4"])),
            ("gang_size", 10**9),
            ("phase", "Bogus"),
            ("owner", "o" * 5000),
            ("uid", ""),
        ],
    }
    field, bad = rng.choice(breaks[topic])
    doc = doc if isinstance(doc, dict) else {}
    doc[field] = bad
    return topic, key, json.dumps(doc).encode(), ts


def build(n: int, seed: int) -> tuple[list[Msg], list[Msg]]:
    from gpugap.schemas import by_name
    from gpugap.schemas.errors import InvalidRecord

    rng = random.Random(seed)
    good = scenario()
    inputs = []  # templates: the scenario's valid input records (it has malformed ones too)
    for m in good:
        if m[0] in INPUTS:
            try:
                decode(by_name(m[0]), m[2])
            except InvalidRecord:
                continue
            inputs.append(m)
    # hostile records at random places among the good ones, which keep their order
    placed = [(float(i), m) for i, m in enumerate(good)]
    placed += [(rng.uniform(0, len(good)), hostile(rng, inputs)) for _ in range(n)]
    placed.sort(key=lambda p: p[0])
    return good, [m for _, m in placed]


def run_worker(kafka: KafkaSettings, engine: str, timeout_s: float) -> tuple[int, float, str]:
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": "ERROR",
    }
    cmd = [sys.executable, "-m", "gpugap", "worker", "--engine", engine, "--http", ""]
    cmd += ["--group", f"fuzz-{uuid.uuid4().hex[:6]}", "--backfill"]
    cmd += ["--idle-flush", "3", "--idle-timeout", "3"]
    started = time.monotonic()
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return out.returncode, time.monotonic() - started, out.stderr[-1500:]


async def read_all(kafka: KafkaSettings, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        **kafka.client_options(), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tp = TopicPartition(kafka.topic_prefix + topic, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[bytes] = []
        while len(out) < end:
            for msgs in (await consumer.getmany(tp, timeout_ms=1000)).values():
                out += [m.value for m in msgs]
        return out
    finally:
        await consumer.stop()


def totals(kafka: KafkaSettings) -> tuple[dict[str, tuple[float, float]], list[DeadLetter]]:
    minutes = [decode(MINUTES, v) for v in asyncio.run(read_all(kafka, MINUTES.name))]
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for m in minutes:
        assert isinstance(m, GpuMinute)
        acc = per[m.workload_class.value if m.workload_class else "(unallocated)"]
        acc[0] += m.allocated_s
        acc[1] += m.consumed_gpu_s
    dead = [decode(DEAD_LETTER, v) for v in asyncio.run(read_all(kafka, DEAD_LETTER.name))]
    return {k: (round(a, 3), round(c, 3)) for k, (a, c) in per.items()}, dead


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fuzz", description=__doc__)
    ap.add_argument("--hostile", type=int, default=100_000)
    ap.add_argument("--engine", choices=ENGINES, default="faust", help="the only engine")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    from gpugap.services.kafka import LocalKafka

    good, attacked = build(args.hostile, args.seed)
    print(
        f"small scenario: {len(good):,} messages; with {args.hostile:,} hostile: {len(attacked):,}"
    )
    with tempfile.TemporaryDirectory(prefix="gpugap-fuzz-") as tmp:
        broker = LocalKafka.ephemeral(ServicesSettings(), Path(tmp))
        broker.up()
        try:
            runs = {}
            for name, msgs in (("clean", good), ("hostile", attacked)):
                kafka = KafkaSettings(bootstrap=broker.bootstrap, topic_prefix=f"fz{name}.")
                asyncio.run(preload(kafka, msgs))
                code, secs, err = run_worker(kafka, args.engine, args.timeout)
                per, dead = totals(kafka)
                runs[name] = (code, secs, err, per, dead)
                print(f"{name}: worker exit {code} after {secs:.0f} s; dead letters {len(dead):,}")
        finally:
            broker.down()
    (c0, _, _, clean, dead0), (c1, _, err, fuzzed, dead1) = runs["clean"], runs["hostile"]
    extra = len(dead1) - len(dead0)
    reasons = sum(1 for d in dead1 if d.reason.strip())
    kinds = Counter(d.kind.value for d in dead1) - Counter(d.kind.value for d in dead0)
    print(f"\n{'':<16}{'clean':>22}{'with hostile':>22}")
    print(f"{'worker exit':<16}{c0:>22}{c1:>22}")
    for cls in sorted(set(clean) | set(fuzzed)):
        for i, what in enumerate(("allocated GPU-s", "consumed GPU-s")):
            a, b = clean.get(cls, (0, 0))[i], fuzzed.get(cls, (0, 0))[i]
            print(f"{cls + ' ' + what:<34}{a:>16,.3f}{b:>22,.3f}")
    print(
        f"dead letters beyond the clean run: {extra:,} of {args.hostile:,} hostile ({dict(kinds)})"
    )
    print(f"dead letters with a reason: {reasons:,} of {len(dead1):,}")
    ok = c0 == 0 and c1 == 0 and clean == fuzzed and extra == args.hostile and reasons == len(dead1)
    print("verdict:", "PASS" if ok else "FAIL")
    if c1:
        print(err)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
