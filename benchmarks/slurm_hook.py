"""``python -m benchmarks slurm-hook``: how long slurmctld waits for the hook, on a throwaway Slurm.

Starts the test Slurm (tests/harness/slurm_cluster.py) and a local Kafka broker, runs ``--jobs``
one-GPU jobs (``--parallel`` at a time: on a 2-core machine, hooks of many jobs at once
measure the contention, not the hook), and reads each hook run's wall time as the wrapper
slurmctld calls measured it (interpreter start-up, scontrol, the send to Kafka with acks=all:
everything) and its CPU time. Prints p50, p99 and max per hook, and the start-up alone (a
context the hook ignores) for comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness.slurm_cluster import GPUGAP, SlurmCluster


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))]


def row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"  {name:<28} n={len(ms):<4} p50 {pct(ms, 50):6.1f} ms   p99 {pct(ms, 99):6.1f} ms"
        f"   max {max(ms):6.1f} ms   mean {statistics.fmean(ms):6.1f} ms"
    )


def startup_only(n: int) -> list[float]:
    env = {"PATH": "/usr/bin:/bin", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([str(GPUGAP), "slurm-hook"], env=env, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks slurm-hook")
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--parallel", type=int, default=1, help="jobs in flight at once")
    args = p.parse_args(argv)
    from gpugap.groundfloor.settings import ServicesSettings
    from gpugap.services.kafka import LocalKafka

    root = Path(tempfile.mkdtemp(prefix="gpugap-slurm-bench-"))
    root.chmod(0o755)
    kafka = LocalKafka.ephemeral(ServicesSettings(), root / "kafka")
    cluster = SlurmCluster(root / "slurm")
    try:
        t0 = time.monotonic()
        kafka.up()
        cluster.start()
        print(f"slurm + kafka up in {time.monotonic() - t0:.1f}s", flush=True)
        cluster.set_hook_env(
            {
                "GPUGAP_KAFKA_BOOTSTRAP": kafka.bootstrap,
                "GPUGAP_KAFKA_TOPIC_PREFIX": "bench.",
                "GPUGAP_SLURM_SPOOL_DIR": str(root / "spool"),
                "GPUGAP_SLURM_CLUSTER": "bench",
            }
        )
        warm = cluster.submit("--gres=gpu:1", wrap="true")  # creates the topic: not counted
        cluster.wait(lambda j: j[warm]["job_state"] == "COMPLETED", "the warm-up job", 60)
        t1 = time.monotonic()
        ids: list[str] = []
        while len(ids) < args.jobs:  # at most --parallel in flight: hooks of one job at a time
            jobs = cluster.jobs()
            busy = sum(1 for i in ids if jobs[i]["job_state"] not in ("COMPLETED", "FAILED"))
            for _ in range(min(args.parallel - busy, args.jobs - len(ids))):
                ids.append(cluster.submit("--gres=gpu:1", "-J", f"b{len(ids)}", wrap="true"))
            time.sleep(0.05)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every job's jobcomp has run
            if {j for c, j, _ in cluster.timings() if c == "jobcomp"} >= set(ids):
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - t1
        wall = [(c, t) for c, j, t in cluster.timings() if j in ids]
        cpu = [(c, t) for c, j, t in cluster.timings(cpu=True) if j in ids]
        spooled = list((root / "spool" / "events").glob("*.json"))
        print(
            f"{args.jobs} one-GPU jobs, {args.parallel} at a time, in {elapsed:.1f}s; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        print(f"events spooled (Kafka missed the deadline): {len(spooled)}")
        print("wall time slurmctld waits for the hook (measured by the wrapper it runs):")
        for ctx in ("prolog_slurmctld", "jobcomp", "epilog_slurmctld"):
            print(row(ctx, [t for c, t in wall if c == ctx]))
        print("CPU time of the hook process (user + system):")
        for ctx in ("prolog_slurmctld", "jobcomp", "epilog_slurmctld"):
            print(row(ctx, [t for c, t in cpu if c == ctx]))
        print(row("start-up only, wall", startup_only(30)))
    finally:
        cluster.stop()
        kafka.down()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
