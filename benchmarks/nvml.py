"""``python -m benchmarks nvml`` (or ``python -m benchmarks nvml``): the cost of one NVML sampling
tick
of an 8-GPU node, with the fake NVML of tests/harness/nvml_fake.py.

This measures **our** overhead (the sampler's bookkeeping, error handling, building the
pydantic records, encoding) plus the fake's trivial Python calls, which are measured on their
own and subtracted. It says nothing about the driver: real NVML calls cost what the driver
takes (typically tens of microseconds each, more for power and energy on some boards), and
only a GPU machine can measure that.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pynvml

from gpugap.groundfloor.settings import Settings
from gpugap.producers.nvml.producer import NvmlProducer
from gpugap.producers.nvml.sampler import NvmlSampler
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.schemas import NodeSample, encode, utc_now
from gpugap.schemas.types import SampleSource
from tests.harness.nvml_fake import FakeNvml

TARGET_MS = 5.0

#: an agent process as deployed (Kafka client, gRPC, NVML bindings loaded), fake NVML,
#: 30 ticks at 1 s into JSON lines; prints its peak RSS and CPU seconds
_AGENT = """
import asyncio, resource, aiokafka, grpc
from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers.nvml.settings import NvmlSettings
from gpugap.producers import run_producer
from gpugap.producers.nvml.producer import NvmlProducer
from tests.harness.nvml_fake import FakeNvml

class Ticks(NvmlProducer):
    async def poll(self):
        self.left = getattr(self, "left", 30) - 1
        if self.left < 0:
            self.stop.set()
        return await super().poll()

with FakeNvml("a100x8").installed():
    p = Ticks(Settings(), NvmlSettings(node="n", pod_resources_socket=None, interval_s=1))
    p.stop = asyncio.Event()
    asyncio.run(run_producer(p, JsonlPublisher("/dev/null"), stop=p.stop))
r = resource.getrusage(resource.RUSAGE_SELF)
print(r.ru_maxrss // 1024, r.ru_utime + r.ru_stime)
"""


def _per_tick_us(fn: Callable[[], object], ticks: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(ticks):
            fn()
        runs.append((time.perf_counter() - t) / ticks * 1e6)
    return statistics.median(runs)


def main(repeats: int = 5, ticks: int = 2000) -> int:
    fake = FakeNvml("a100x8")
    with fake.installed():
        sampler = NvmlSampler(rediscover_s=float("inf"))
        sampler.start()
        handles = [d.handle for d in sampler.devices]

        def bare() -> None:  # the same 40 library calls, nothing of ours
            for h in handles:
                pynvml.nvmlDeviceGetUtilizationRates(h)
                pynvml.nvmlDeviceGetMemoryInfo(h)
                pynvml.nvmlDeviceGetPowerUsage(h)
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)

        def node_sample() -> NodeSample:
            return NodeSample(
                cluster="c",
                node="dgx-a100-017",
                time=utc_now(),
                source=SampleSource.NVML,
                interval_s=10.0,
                gpus=tuple(sampler.sample()),
            )

        fake_us = _per_tick_us(bare, ticks, repeats)
        sample_us = _per_tick_us(sampler.sample, ticks, repeats)
        record_us = _per_tick_us(node_sample, ticks, repeats)
        encoded_us = _per_tick_us(lambda: encode(node_sample()), ticks, repeats)
        producer = NvmlProducer(
            Settings(), NvmlSettings(node="dgx-a100-017", pod_resources_socket=None)
        )

        async def polls() -> float:
            t = time.perf_counter()
            for _ in range(ticks // 4):
                await producer.poll()
            return (time.perf_counter() - t) / (ticks // 4) * 1e6

        poll_us = statistics.median(asyncio.run(polls()) for _ in range(repeats))
        asyncio.run(producer.close())
        sampler.stop()
    ours = encoded_us - fake_us
    agent = subprocess.run(
        [sys.executable, "-c", _AGENT],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    print(
        f"nvml tick, 8x A100 (fake NVML: 40 library calls a tick), median of {repeats} x "
        f"{ticks} ticks\n"
        f"  fake NVML calls alone                 {fake_us:8.1f} us  (not ours: subtracted)\n"
        f"  sampler.sample() (8 GpuSample)        {sample_us:8.1f} us\n"
        f"  + NodeSample                          {record_us:8.1f} us\n"
        f"  + encode to bytes                     {encoded_us:8.1f} us\n"
        f"  producer.poll() (worker thread hop)   {poll_us:8.1f} us\n"
        f"our overhead per tick: {ours / 1000:.3f} ms (encode included), "
        f"{(poll_us - fake_us) / 1000:.3f} ms through poll(); target < {TARGET_MS:.0f} ms: "
        f"{'met' if max(ours, poll_us - fake_us) / 1000 < TARGET_MS else 'NOT met'}\n"
        f"agent process, 30 ticks at 1 s: peak RSS {agent[0]} MiB, {float(agent[1]):.2f} s CPU "
        "(start-up and imports included)\n"
        "(the driver's own time per call is not in these figures: measure it on a GPU node)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
