"""Property: whatever schema-valid records arrive, in whatever order, the core raises nothing and
what it emits is bounded by capacity: per GPU, minute and holder (an allocation, or nobody) at
most 60 seconds, consumption never above 60 s, and no minute outside the span of the event
times seen. (Two allocations may hold one GPU at once: GPU sharing, or a scheduler conflict
the rows then show.)"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugap.schemas.models import AllocationEvent, GpuSample, NodeSample
from gpugap.schemas.types import (
    MAX_GPUS_PER_NODE,
    MAX_INTERVAL_S,
    ActivityMetric,
    LifecycleKind,
    SampleSource,
    Scheduler,
    WorkloadClass,
)
from gpugap.streams.process import Processor
from tests.streams.helpers import gpu

T0 = datetime(2026, 11, 2, tzinfo=UTC)
SPAN_S = 3 * 3600
NODES = ("n1", "n2")

times = st.integers(0, SPAN_S * 1000).map(lambda ms: T0 + timedelta(milliseconds=ms))
activity = st.one_of(st.none(), st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0]))


@st.composite
def samples(draw: Any) -> NodeSample:
    n = draw(st.integers(0, 12))
    idx = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n, unique=True))
    gpus = []
    for i in idx:
        a = draw(activity)
        gpus.append(
            GpuSample(
                uuid=gpu(i),
                index=i,
                activity=a,
                activity_metric=ActivityMetric.UTILIZATION if a is not None else None,
            )
        )
    return NodeSample(
        cluster="c",
        node=draw(st.sampled_from(NODES)),
        time=draw(times),
        source=SampleSource.SIMULATOR,
        interval_s=draw(st.one_of(st.none(), st.floats(0.0, MAX_INTERVAL_S))),
        gpus=tuple(gpus),
    )


@st.composite
def allocations(draw: Any) -> AllocationEvent:
    alloc = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(list(LifecycleKind)))
    scheduler = draw(st.sampled_from(list(Scheduler)))
    n = draw(st.integers(0, MAX_GPUS_PER_NODE))
    indices = draw(
        st.one_of(st.none(), st.lists(st.integers(0, 20), max_size=min(n, 16), unique=True))
    )
    return AllocationEvent(
        event_id=f"a{alloc}/{kind.value}/{draw(st.integers(0, 2))}",
        kind=kind,
        time=draw(times),
        cluster="c",
        node=draw(st.sampled_from(NODES)),
        scheduler=scheduler,
        allocation_id=f"{scheduler.value}/c/{alloc}",
        gpus=n,
        gpu_indices=tuple(indices) if indices is not None else None,
        workload_class=draw(st.sampled_from(list(WorkloadClass))),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(samples(), allocations()), max_size=60))
def test_the_core_never_raises_and_never_emits_beyond_capacity(records: list[Any]) -> None:
    proc = Processor()
    rows = []
    for rec in records:
        rows += proc.handle(rec).minutes
        if len(rows) % 7 == 0:
            rows += proc.advance().minutes
    rows += proc.advance(proc.cfg.lateness_ms).minutes
    held: dict[tuple[str, str, datetime, str | None], float] = defaultdict(float)
    last = T0 + timedelta(seconds=SPAN_S, minutes=3)
    for r in rows:
        assert T0 - timedelta(hours=1, minutes=1) <= r.minute <= last
        assert 0.0 <= r.consumed_gpu_s <= 60.0 + 1e-6
        held[(r.node, r.gpu_uuid, r.minute, r.allocation_id)] += r.allocated_s + r.unallocated_s
    assert all(v <= 60.0 + 1e-6 for v in held.values()), max(held.values())
