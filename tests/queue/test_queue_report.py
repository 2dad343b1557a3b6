"""``gpugap report --queue`` on the worked example of test_cost.py recorded in the warehouse:
the jobs really started where the model, limits as asked, starts them, so the measured wait,
the model's and the hand-computed figures are one number."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.queue.report import build_queue, extend_schema
from gpugap.report import report_schema
from gpugap.schemas import NodeGpus, Record, SlurmJobEvent
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect

H = 3600
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
# id, user, submitted (s), GPUs, ran (s), limit (s), started (s): test_cost.py's JOBS and
# their start under the limits as asked
JOBS = [
    ("B", "bob", 0, 2, 1 * H, 2 * H, 0),
    ("C", "carol", 1, 4, 1 * H, 2 * H, H),
    ("A1", "alice", 2, 1, H // 2, 10 * H, 2 * H),
    ("A2", "alice", 3, 1, H // 2, 10 * H, 2 * H),
    ("A3", "alice", 4, 1, H // 2, 10 * H, 2 * H),
    ("D", "dave", 2 * H, 4, 1 * H, 2 * H, 5 * H // 2),
]
ASKED_H = (4 * 3599 + 21591 + 4 * 1800) / H
SIZED_H = (4 * 3601 + 1798 + 4 * 2) / H


def events() -> list[Record]:
    out: list[Record] = []
    gpu = 0
    for job_id, user, submit, gpus, ran, limit, start in JOBS:
        # which of n1's GPUs does not matter to the queue; spread them over the four
        idx = tuple((gpu + i) % 4 for i in range(gpus))
        gpu += gpus
        common = dict(
            source="hook", cluster="c", job_id=job_id, user=user, account=f"{user}-lab",
            partition="gpu", job_name="train", nodes=(NodeGpus(node="n1", gpu_indices=idx),),
            gpus_total=gpus, time_limit_s=limit, submit_time=T0 + timedelta(seconds=submit),
            start_time=T0 + timedelta(seconds=start),
        )  # fmt: skip
        end = T0 + timedelta(seconds=start + ran)
        out.append(
            SlurmJobEvent(
                event_id=f"{job_id}/start", kind="start", time=common["start_time"],
                state="RUNNING", **common,
            )
        )  # fmt: skip
        out.append(
            SlurmJobEvent(
                event_id=f"{job_id}/end", kind="end", time=end, end_time=end,
                state="COMPLETED", exit_code=0, **common,
            )
        )  # fmt: skip
    return out


@pytest.fixture
def recorded(clickhouse: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch) -> ClickHouseSettings:
    for key in [k for k in os.environ if k.startswith("GPUGAP_CLICKHOUSE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", clickhouse.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", clickhouse.user)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", clickhouse.database)
    if clickhouse.password is not None:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", clickhouse.password.get_secret_value())

    async def store() -> None:
        sink = ClickHouseSink(clickhouse)
        await sink.start()
        await sink.write(events())
        await sink.close()

    asyncio.run(store())
    return clickhouse


def test_wait_measured_and_the_padding_replayed(recorded: ClickHouseSettings) -> None:
    client = connect(recorded)
    try:
        q = build_queue(client, T0 - timedelta(hours=1), T0 + timedelta(hours=6), repeats=1)
    finally:
        client.close()
    (row,) = q.by_queue
    assert (row.key, row.scheduler, row.jobs, row.gpus) == ("c/gpu", "slurm", 6, 13)
    assert row.gpu_h_waited == pytest.approx(ASKED_H, abs=1e-3)
    # waits 0, 1800, 3599, 7196, 7197, 7198: quantileExact takes the element at floor(q x n)
    assert (row.p50_wait_s, row.p95_wait_s) == (7196, 7198)
    assert {r.key: r.jobs for r in q.by_team} == {
        "alice-lab": 3, "bob-lab": 1, "carol-lab": 1, "dave-lab": 1,
    }  # fmt: skip
    assert [(r.key, r.jobs) for r in q.by_gpus] == [("1", 3), ("2", 1), ("4", 2)]
    (p,) = q.partitions
    assert (p.cluster, p.partition, p.nodes, p.gpus_per_node, p.jobs) == ("c", "gpu", 1, 4, 6)
    assert p.measured_gpu_h_waited == pytest.approx(ASKED_H, abs=1e-3)
    assert p.asked.gpu_h_waited == pytest.approx(ASKED_H, abs=1e-3)  # the model agrees
    assert p.right_sized.gpu_h_waited == pytest.approx(SIZED_H, abs=1e-3)
    assert p.jobs_right_sized == 3
    assert p.gpu_h_freed.mean == pytest.approx(ASKED_H - SIZED_H, abs=1e-3)
    (alice,) = p.padded_users  # bob, carol and dave have too few jobs for the rule
    assert alice.user == "alice"
    assert alice.over_rule_gpu_h == pytest.approx(3 * (10 * H - 2700) / H, abs=1e-3)


def test_report_queue_cli(recorded: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    window = ["--since", "2026-11-02T09:00Z", "--until", "2026-11-02T16:00Z"]
    assert main(["report", "--queue", *window]) == 0
    out = capsys.readouterr().out
    section = out[out.index("\nQUEUE") :]
    assert "c/gpu" in section and "model, as asked" in section and "alice" in section
    assert all(len(line) <= 100 for line in out.splitlines()), out

    assert main(["report", "--queue", "--format", "json", *window]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, extend_schema(report_schema()), cls=jsonschema.Draft202012Validator)
    assert doc["queue"]["partitions"][0]["jobs_right_sized"] == 3

    assert main(["report", "--queue", "--format", "csv", *window]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "queue_partitions,c/gpu,jobs,6" in lines
    assert any(line.startswith("queue_padded_users,c/gpu:alice,over_rule_gpu_h,") for line in lines)
    assert main(["report", "--queue", "--schema"]) == 0
    assert "QueueReport" in json.loads(capsys.readouterr().out)["$defs"]


def test_the_time_recommendation_says_what_it_frees_for_others(
    recorded: ClickHouseSettings,
) -> None:
    from gpugap.recommend.engine import compute

    client = connect(recorded)
    try:
        _, recs = compute(client, days=1, until=T0 + timedelta(hours=6), now=T0)
    finally:
        client.close()
    (alice,) = [r for r in recs if r.kind == "slurm_time_limit"]
    assert alice.target.user == "alice" and alice.change.to_value == "2700"
    f = alice.evidence.figures
    # the recorded replay: carol waits 2 s longer (4 GPUs), dave 1798 s less (4 GPUs)
    first = (4 * 3599 + 4 * 1800 - 4 * 3601 - 4 * 2) / H
    assert f["queue_gpu_h_freed_for_others_low"] <= first + 1e-3
    assert f["queue_gpu_h_freed_for_others_high"] >= first - 1e-3
    low, mean, high = (f[f"queue_gpu_h_freed_for_others{s}"] for s in ("_low", "", "_high"))
    assert low <= mean <= high
    assert "Queue: replaying gpu's 6 jobs" in alice.rationale


@pytest.mark.parametrize(
    ("low", "mean", "high", "shown"),
    [
        # nothing right-sized: every replay frees nothing; not "noise"
        (0.0, 0.0, 0.0, "0.0"),
        # replays agree on the sign: a spread, not noise (one of them no change)
        (0.0, 0.4, 0.9, "0.4 (0.0..0.9)"),
        (1.2, 1.5, 1.9, "1.5 (1.2..1.9)"),
        # one frees, another costs: noise
        (-0.3, 0.1, 0.5, "0.1 (-0.3..0.5, noise)"),
        # at the precision that shows the spread, not 0.1 (0.0..0.1)
        (0.04, 0.05, 0.06, "0.05 (0.04..0.06)"),
        (0.001, 0.002, 0.004, "0.002 (0.001..0.004)"),
    ],
)
def test_freed_ranges_say_noise_only_where_replays_disagree_on_the_sign(
    low: float, mean: float, high: float, shown: str
) -> None:
    from gpugap.queue.report import Range, _freed

    clear = low > 0 or high < 0
    assert _freed(Range(mean=mean, low=low, high=high, clear=clear)) == shown
