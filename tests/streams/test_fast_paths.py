"""The worker's fast paths give what the plain paths give: rows built without validation,
minutes reused between the alert pass and the close, windowed sample reads, snapshots of the
changed nodes only."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from gpugap.groundfloor.kafka.consume import RawMessage
from gpugap.schemas import GpuMinute, Record, by_name, decode, encode
from gpugap.schemas.errors import InvalidRecord
from gpugap.simulator import build, scenario
from gpugap.simulator.emit import Emitter
from gpugap.streams import window
from gpugap.streams.core import NodeCore, Output
from gpugap.streams.join import Join
from gpugap.streams.process import Processor
from tests.harness.capture import Capture
from tests.streams.helpers import Null


@pytest.fixture(scope="module")
def records() -> list[Record]:
    sc = scenario.load("small")  # late, duplicated and malformed records included
    cap = Capture()
    asyncio.run(Emitter(sc, build(sc), sc.scenario.duration).run(cap))
    out = []
    for topic, _, value, _ in cap.messages:
        try:
            out.append(decode(by_name(topic), value))
        except InvalidRecord:
            continue
    return out


def run(records: list[Record], proc: Processor) -> list[GpuMinute]:
    rows = []
    for i, r in enumerate(records):
        rows += proc.handle(r).minutes
        if i % 50 == 49:
            rows += proc.advance().minutes
    return rows + proc.advance(proc.cfg.lateness_ms).minutes


def test_rows_built_without_validation_are_valid_and_encode_alike(records: list[Record]) -> None:
    rows = run(records, Processor())
    assert len(rows) > 1000
    for r in rows:
        again = GpuMinute.model_validate(r.model_dump())
        assert again == r
        assert encode(again) == encode(r)
        assert GpuMinute.model_validate_json(encode(r)) == r


def test_reusing_the_alert_pass_rows_changes_nothing(
    records: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = run(records, Processor())

    class NoCache(dict[int, Any]):
        def __setitem__(self, key: int, value: Any) -> None:
            pass  # every minute is computed again when it closes

    real_init = NodeCore.__init__

    def init(self: NodeCore, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        self._rows = NoCache()

    monkeypatch.setattr(NodeCore, "__init__", init)
    assert run(records, Processor()) == cached


def effective(samples: list[window.Sample]) -> list[tuple[int, int, window.Sample]]:
    """The whole buffer's intervals, overlaps trimmed: the plain reading that
    ``window.effective_in`` must agree with on any window."""
    out: list[tuple[int, int, window.Sample]] = []
    prev: int | None = None
    for s in samples:
        t, dt = int(s[0] or 0), int(s[1] or 0)
        start = t - dt if prev is None else max(t - dt, prev)
        if t > start:
            out.append((start, t, s))
        prev = t
    return out


def test_windowed_sample_reads_match_the_whole_buffer() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        t, buf = 0, []
        for _ in range(rng.randint(0, 12)):
            t += rng.choice([1, 500, 5_000, 10_000, 30_000])
            buf.append([t, rng.choice([0, 1_000, 10_000, 60_000]), 0.5, "sm_active", 1.0, 2.0])
        lo = rng.randint(-10_000, t + 10_000)
        hi = lo + rng.choice([1, 60_000])
        whole = [e for e in effective(buf) if min(e[1], hi) > max(e[0], lo)]
        got = window.effective_in(buf, lo, hi)
        assert [e for e in got if min(e[1], hi) > max(e[0], lo)] == whole
        assert window.usage([(lo, hi)], got) == window.usage([(lo, hi)], effective(buf))


def test_snapshots_of_changed_nodes_restore_every_node(records: list[Record]) -> None:
    async def go() -> None:
        join = Join(Null(), "")
        topic: dict[bytes, bytes] = {}  # a compacted topic: the latest value per key
        written = []
        for i, r in enumerate(records):
            raw = RawMessage("gpu.samples.v1", 0, i, None, encode(r))
            await join.ingest("p", raw)
            if i % 5 == 4:
                await join.drain(float("inf"))
                items = join.snapshot({0: {"gpu.samples.v1:0": i + 1}})
                topic.update((k, v) for _, k, v in items)
                join.snapshot_stored()
                written.append(len(items) - 1)
        assert min(written) < max(written)  # some snapshots left unchanged nodes out
        restored = Join(Null(), "")
        restored.restore(topic)
        want = json.loads(json.dumps(join.proc.state))
        assert json.loads(json.dumps(restored.proc.state)) == want

    asyncio.run(go())


def test_unstored_snapshots_are_written_again() -> None:
    join = Join(Null(), "")
    join.proc.core("c", "n1")

    def keys() -> set[bytes]:
        return {k for _, k, _ in join.snapshot({0: {}})}

    assert b"node:c/n1" in keys()
    # not acknowledged (no snapshot_stored): the next snapshot carries the node again
    assert b"node:c/n1" in keys()
    join.snapshot_stored()
    assert b"node:c/n1" not in keys()
    assert Output() == Output()
