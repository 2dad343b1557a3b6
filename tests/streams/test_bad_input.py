"""Hostile and malformed input never stops the worker and never makes it fabricate output:
bounded records, a receiver window around the wall clock, and a dead letter for any record the
core cannot process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.schemas import DeadLetter, GpuMinute, NodeSample, Record, decode, encode
from gpugap.schemas.errors import SchemaViolation
from gpugap.schemas.topics import K8S_PODS, SAMPLES, SLURM_JOBS, Topic
from gpugap.streams.core import CoreConfig
from gpugap.streams.join import Join
from tests.streams.helpers import Recording, gpu

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def node_sample(node: str, t: datetime, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cluster": "c",
        "node": node,
        "time": t.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "source": "simulator",
        "interval_s": 10.0,
        "gpus": [
            {"uuid": gpu(i), "index": i, "activity": 0.5, "activity_metric": "utilization"}
            for i in range(2)
        ],
    }
    doc.update(over)
    return doc


def raw(topic: Topic[Any], doc: dict[str, Any] | Record, offset: int) -> RawMessage:
    value = encode(doc) if isinstance(doc, Record) else encode(NodeSample.model_validate(doc))
    return RawMessage(topic.name, 0, offset, None, value)


@pytest.mark.parametrize(
    ("topic", "doc", "field"),
    [
        (SAMPLES, node_sample("n1", T0, interval_s=1e308), "interval_s"),
        (SAMPLES, node_sample("n1", T0, interval_s=172_800.0), "interval_s"),
        (
            SAMPLES,
            node_sample("n1", T0, gpus=[{"uuid": gpu(i), "index": i} for i in range(1000)]),
            "gpus",
        ),
        (
            K8S_PODS,
            {
                "event_id": "k8s/c/u/bound", "kind": "bound", "time": "2026-11-02T00:00:00.000Z",
                "source": "watch", "cluster": "c", "uid": "u", "namespace": "ns", "name": "p",
                "node": "n1", "phase": "Running", "gpus": 50_000,
            },
            "gpus",
        ),
        (
            SLURM_JOBS,
            {
                "event_id": "slurm/c/1/start", "kind": "start", "time": "2026-11-02T00:00:00.000Z",
                "source": "hook", "cluster": "c", "job_id": "1", "state": "RUNNING",
                "start_time": "2026-11-02T00:00:00.000Z",
                "nodes": [{"node": "n1", "gpu_indices": [5000]}], "gpus_total": 1,
            },
            "gpu_indices",
        ),
    ],
    ids=["interval-1e308", "interval-2-days", "1000-gpus", "pod-50000-gpus", "gpu-index-5000"],
)  # fmt: skip
def test_records_past_what_an_estate_produces_are_schema_violations(
    topic: Topic[Any], doc: dict[str, Any], field: str
) -> None:
    import json

    with pytest.raises(SchemaViolation) as exc:
        decode(topic, json.dumps(doc).encode())
    assert field in exc.value.reason


def test_a_record_the_core_cannot_process_is_a_dead_letter_and_the_worker_goes_on() -> None:
    """Before: an exception in the core left the worker at every restart (a crash loop)."""
    t0 = datetime(2026, 11, 2, 10, tzinfo=UTC)
    pub = Recording()
    join = Join(pub, "")
    real = join.proc.step
    bad = NodeSample.model_validate(node_sample("bad", t0))

    def handle(rec: Record) -> Any:
        if isinstance(rec, NodeSample) and rec.node == "bad":
            raise OverflowError("cannot convert float infinity to integer")
        return real(rec)

    join.proc.step = handle  # type: ignore[method-assign]

    async def go() -> None:
        for i in range(30):
            sample = node_sample("n1", t0 + timedelta(seconds=10 * i))
            await join.ingest("p", raw(SAMPLES, sample, i))
        await join.ingest("p", raw(SAMPLES, bad, 30))
        await join.ingest("p", raw(SAMPLES, node_sample("n1", t0 + timedelta(seconds=300)), 31))
        await join.flush_all()

    asyncio.run(go())
    dead = pub.of(DeadLetter)
    assert [(d.offset, d.kind.value) for d in dead] == [(30, "rejected")]
    assert "processing failed: OverflowError" in dead[0].reason
    assert join.stats.processed == 32  # the one after it too
    minutes = pub.of(GpuMinute)
    assert {m.node for m in minutes} == {"n1"} and len(minutes) == 2 * 6


def _run(records: list[RawMessage], cfg: CoreConfig) -> Recording:
    pub = Recording()
    join = Join(pub, "", cfg)

    async def go() -> None:
        for r in records:
            await join.ingest(("p", r.topic), r)
        await join.flush_all()

    asyncio.run(go())
    return pub


def test_a_sample_from_a_clock_a_day_ahead_is_a_dead_letter_and_moves_no_node() -> None:
    """Before: one sample dated a day ahead, on another node, made the worker emit a day of
    minutes for every node and refuse the next real sample as late."""
    now = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    good = [
        raw(SAMPLES, node_sample(n, now + timedelta(seconds=10 * i)), k)
        for k, (i, n) in enumerate((i, n) for i in range(60) for n in ("n1", "n2"))
    ]
    ahead = raw(SAMPLES, node_sample("n3", now + timedelta(days=1)), 500)
    cfg = CoreConfig(max_future_ms=600_000)
    clean = _run(good, cfg)
    attacked = _run([*good[:60], ahead, *good[60:]], cfg)
    dead = attacked.of(DeadLetter)
    assert len(dead) == 1 and dead[0].offset == 500
    assert "ahead of this worker's clock" in dead[0].reason
    assert sorted(m.minute for m in attacked.of(GpuMinute)) == sorted(
        m.minute for m in clean.of(GpuMinute)
    )
    assert len(clean.of(GpuMinute)) == 2 * 2 * 10  # 2 nodes x 2 GPUs x 10 minutes, no more


def test_a_record_older_than_the_past_window_needs_backfill() -> None:
    old = datetime.now(UTC) - timedelta(days=8)
    rec = raw(SAMPLES, node_sample("n1", old), 0)
    refused = _run([rec], CoreConfig(max_past_ms=7 * 86_400_000)).of(DeadLetter)
    assert len(refused) == 1 and "--backfill" in refused[0].reason
    assert _run([rec], CoreConfig(max_past_ms=None)).of(DeadLetter) == []


def test_idle_timeout_without_idle_flush_is_refused_with_the_reason() -> None:
    """Before: `--idle-timeout` alone never made the worker exit, and the help did not say."""
    out = subprocess.run(
        [sys.executable, "-m", "gpugap", "worker", "--idle-timeout", "3", "--http", ""],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode != 0
    assert "--idle-flush" in out.stderr
