"""``python -m benchmarks worker``: one worker's sustained throughput, and end-to-end latency at a
fixed
load (benchmarks/worker_latency.py).

Throughput: the ``scale`` estate with every node at 8 GPUs (1,350 nodes, 10,800 GPUs, Slurm
and Kubernetes, its duplicates, late and malformed records) is generated once and pre-loaded
into the input topics of a throwaway broker (``retention.ms=-1``, records stamped with event
time); then ONE worker (``gpugap worker``, the Faust engine, a process of its own) reads them
from the start to the end, and after it the Faust pass-through (benchmarks/faust_passthrough.py:
consume and ack, nothing else), the ceiling the worker is compared against. Their ``/metrics``
are polled: the rate counts from the first poll that shows input consumed to the first that
shows every record handed to the core, so start-up (group join, table recovery) is excluded.
The same records go through the codec alone and the core alone (in-process) to show where the
time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import worker_profile as bench_profile
from benchmarks.processes import ENGINES, cpu_seconds, metrics, stop
from benchmarks.processes import engines as engines_arg
from benchmarks.topics import preload
from benchmarks.worker_inproc import Rate, bench_core, bench_decode, decoded, estate
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.topics import SAMPLES
from gpugap.services.kafka import free_port


def run_worker(
    kafka: KafkaSettings,
    engine: str,
    expected: int,
    profile: Path | None = None,
    timeout: float = 900,
) -> tuple[float, float, float]:
    """One ``gpugap worker`` over the pre-loaded topics: (node msgs/s, GPU samples/s, its CPU
    use), from the first poll showing input consumed to the first showing all of it
    processed."""
    cmd = [
        sys.executable,
        "-m",
        "gpugap",
        "worker",
        "--engine",
        engine,
        "--group",
        f"bench-{engine}",
        "--backfill",
    ]  # fmt: skip  (--backfill: the estate is dated)
    secs, first, last, cpu = _measure(
        lambda port: [*cmd, "--http", f"127.0.0.1:{port}"], kafka,
        done_key="gpugap_worker_processed_total", expected=expected, profile=profile,
        timeout=timeout, what=engine,
    )  # fmt: skip
    key = "gpugap_worker_gpu_samples_total"
    gpus = last[key] - first[key]
    return gpus / 8 / secs, gpus / secs, cpu


def run_passthrough(
    kafka: KafkaSettings, messages: int, timeout: float = 900
) -> tuple[float, float]:
    """Faust's ceiling on this machine: benchmarks/faust_passthrough.py (consume and ack the
    same topics, nothing else) until it has taken ``messages``: (messages/s, its CPU use)."""

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "benchmarks.faust_passthrough", kafka.bootstrap,
                kafka.topic_prefix, "bench-passthrough", str(port)]  # fmt: skip

    key = "gpugap_worker_messages_total"
    secs, first, last, cpu = _measure(
        cmd, kafka, done_key=key, expected=messages, profile=None, timeout=timeout,
        what="pass-through",
    )  # fmt: skip
    return (last[key] - first[key]) / secs, cpu


def _measure(
    cmd: Any,
    kafka: KafkaSettings,
    *,
    done_key: str,
    expected: int,
    profile: Path | None,
    timeout: float,
    what: str,
) -> tuple[float, dict[str, float], dict[str, float], float]:
    """Run ``cmd(port)`` and poll its /metrics from the first poll showing input consumed to
    the first with ``done_key`` >= ``expected``: (seconds, first and last metrics, CPU use)."""
    port = free_port()
    env = {
        **os.environ,
        "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUGAP_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUGAP_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(cmd(port), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    spy = None  # py-spy, from the first record consumed to the last one processed
    first: tuple[float, dict[str, float]] | None = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not finish within {timeout:.0f} s")
            try:
                m = metrics(port)
            except OSError:
                time.sleep(0.2)
                continue
            now = time.monotonic()
            if first is None and m.get("gpugap_worker_messages_total", 0) > 0:
                first, cpu0 = (now, m), cpu_seconds(proc.pid)
                if profile is not None:
                    spy = bench_profile.attach(proc.pid, profile)
            if first is not None and m.get(done_key, 0) >= expected:
                secs = now - first[0]
                return secs, first[1], m, (cpu_seconds(proc.pid) - cpu0) / secs
            time.sleep(0.1)
    finally:
        if spy is not None:
            bench_profile.stop(spy)
        stop([proc])


def bench_throughput(
    samples: int, repeats: int, engines: Sequence[str], profile: Path | None = None
) -> list[str]:
    from gpugap.groundfloor.settings import ServicesSettings
    from gpugap.services.kafka import LocalKafka

    messages, what = estate(samples)
    good = decoded(messages)
    expected = len(good)  # records the worker hands to its core (malformed ones are not)
    lines = [f"worker throughput: {what}; median of {repeats}"]
    lines.append(f"{'':<34} {'node msgs/s':>14} {'GPU samples/s':>15} {'CPU':>6}")
    print("\n".join(lines), flush=True)
    for rate in (bench_decode(messages, repeats), bench_core(good, repeats)):
        lines.append(rate.row())
        print(lines[-1], flush=True)
    with tempfile.TemporaryDirectory(prefix="gpugap-bench-worker-") as tmp:
        broker = LocalKafka.ephemeral(ServicesSettings(), Path(tmp))
        broker.up()
        try:
            rates = {e: Rate(f"worker, {e} engine (Kafka in/out)", [], []) for e in engines}
            ceiling = Rate("Faust pass-through (consume+ack)", [], [])
            # its rate is in messages; the estate's share of node samples turns it into rows
            node_share = sum(m[0] == SAMPLES.name for m in messages) / len(messages)
            for r in range(repeats):
                kafka = KafkaSettings(
                    bootstrap=broker.bootstrap, topic_prefix=f"bw{uuid.uuid4().hex[:8]}."
                )
                asyncio.run(preload(kafka, messages))
                for e in engines:
                    spy = profile / f"{e}.txt" if profile is not None and r == 0 else None
                    nodes, gpus, cpu = run_worker(kafka, e, expected, spy)
                    rates[e].node_msgs.append(nodes)
                    rates[e].gpu_samples.append(gpus)
                    rates[e].cpu.append(cpu)
                    print(f"  ({e}: {gpus:,.0f} GPU samples/s)", file=sys.stderr, flush=True)
                msgs, cpu = run_passthrough(kafka, len(messages))
                ceiling.node_msgs.append(msgs * node_share)
                ceiling.gpu_samples.append(msgs * node_share * 8)  # 8-GPU nodes
                ceiling.cpu.append(cpu)
            for e in engines:
                lines.append(rates[e].row())
                print(lines[-1], flush=True)
            lines.append(ceiling.row())
            top = statistics.median(ceiling.gpu_samples)
            for e in engines:
                share = statistics.median(rates[e].gpu_samples) / top
                lines.append(f"  {e} worker / Faust pass-through: {share:.0%}")
            print("\n".join(lines[-1 - len(engines) :]), flush=True)
        finally:
            broker.down()
    if profile is not None:
        lines.append("where the worker's busy time goes (py-spy, first run):")
        for e in engines:
            lines += bench_profile.lines(profile / f"{e}.txt", e)
        print(
            "\n".join(
                lines[lines.index("where the worker's busy time goes (py-spy, first run):") :]
            )
        )
    return lines


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that the broker and the workers are stopped


def main(
    samples: int = 100_000,
    *,
    repeats: int = 3,
    duration: float = 300.0,
    live_nodes: int = 200,
    engines: Sequence[str] = ENGINES,
    profile: Path | None = None,
) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    if samples > 0:
        if profile is not None and not bench_profile.available():
            print("(--profile: py-spy is not installed; no profile)", file=sys.stderr)
            profile = None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
        bench_throughput(samples, repeats, engines, profile)
    if duration > 0:
        from benchmarks.worker_latency import bench_latency

        for engine in engines:
            bench_latency(duration, live_nodes, engine)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks worker")
    p.add_argument("--samples", type=int, default=100_000, help="node samples pre-loaded")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=300.0, help="latency run (s); 0 = skip")
    p.add_argument("--live-nodes", type=int, default=200, help="latency: nodes every 10 s")
    p.add_argument(
        "--engines", type=engines_arg, default=list(ENGINES), help="faust (the only engine)"
    )
    p.add_argument("--profile", type=Path, help="py-spy each worker's first run into DIR")
    a = p.parse_args()
    raise SystemExit(
        main(
            a.samples,
            repeats=a.repeats,
            duration=a.duration,
            live_nodes=a.live_nodes,
            engines=a.engines,
            profile=a.profile,
        )
    )
