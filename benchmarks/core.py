"""``python -m benchmarks core``: the core's sustained throughput in-process (no Kafka).

Feeds one Processor with 8-GPU node samples every 10 s (one Slurm job per node, activity
varying) in event time, as the worker does after decoding, and prints GPU samples/s and node
messages/s. It measures the core alone: the worker adds decoding and Kafka I/O on top.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from gpugap.schemas.models import AllocationEvent, GpuSample, NodeSample
from gpugap.schemas.types import (
    ActivityMetric,
    LifecycleKind,
    SampleSource,
    Scheduler,
    WorkloadClass,
)
from gpugap.streams.process import Processor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks core")
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--minutes", type=int, default=30, help="event-time minutes to feed")
    args = p.parse_args(argv)
    t0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
    proc = Processor()
    uuids = {
        n: [f"GPU-{n:08d}-0000-0000-0000-{g:012d}" for g in range(8)] for n in range(args.nodes)
    }
    for n in range(args.nodes):
        proc.handle(
            AllocationEvent(
                event_id=f"bench/{n}/start",
                kind=LifecycleKind.START,
                time=t0,
                cluster="bench",
                node=f"n{n:04d}",
                scheduler=Scheduler.SLURM,
                allocation_id=f"slurm/bench/{n}",
                gpus=8,
                gpu_indices=tuple(range(8)),
                workload_class=WorkloadClass.BATCH,
            )
        )
    samples = []
    for k in range(1, args.minutes * 6 + 1):
        t = t0 + timedelta(seconds=10 * k)
        for n in range(args.nodes):
            gpus = tuple(
                GpuSample(
                    uuid=u,
                    index=g,
                    activity=((k + g + n) % 10) / 10,
                    activity_metric=ActivityMetric.SM_ACTIVE,
                    memory_used_mib=1000.0,
                    power_w=200.0,
                )
                for g, u in enumerate(uuids[n])
            )
            samples.append(
                NodeSample(
                    cluster="bench",
                    node=f"n{n:04d}",
                    time=t,
                    source=SampleSource.SIMULATOR,
                    interval_s=10.0,
                    gpus=gpus,
                )
            )
    start = time.perf_counter()
    rows = 0
    for i, s in enumerate(samples):
        rows += len(proc.handle(s).minutes)
        if i % args.nodes == args.nodes - 1:  # the worker advances once per poll
            rows += len(proc.advance().minutes)
    secs = time.perf_counter() - start
    n = len(samples)
    print(
        f"core: {n:,} node messages ({n * 8:,} GPU samples, 8-GPU nodes) in {secs:.2f} s: "
        f"{n / secs:,.0f} node messages/s, {n * 8 / secs:,.0f} GPU samples/s, {rows:,} GPU-minutes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
