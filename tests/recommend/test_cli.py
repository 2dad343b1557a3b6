"""``gpugap recommend`` end to end on the scenario week: compute (published on a real broker,
stored by the ClickHouse sink: the one way into the warehouse), list, show, decide and the
audit trail (append-only, who/when/why), and the change printed for a person to apply."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings, KafkaSettings
from gpugap.schemas import decode
from gpugap.schemas.models import Recommendation
from gpugap.schemas.topics import RECOMMENDATIONS
from gpugap.warehouse.client import connect
from tests.recommend.conftest import run_sink


@pytest.fixture
def env(week: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch) -> ClickHouseSettings:
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", week.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", week.database)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", week.user)
    if week.password:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", week.password.get_secret_value())
    return week


@pytest.fixture
def broker(
    env: ClickHouseSettings, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> KafkaSettings:
    """``gpugap recommend compute`` publishes to the test's own topics (GPUGAP_KAFKA_*)."""
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", kafka.topic_prefix)
    return kafka


def stored(settings: ClickHouseSettings) -> dict[str, Recommendation]:
    """The warehouse's recommendations (the latest row of each id), as records."""
    c = connect(settings)
    try:
        rows = c.query("SELECT id, record FROM recommendations FINAL").result_rows
    finally:
        c.close()
    return {i: Recommendation.model_validate_json(r) for i, r in rows}


async def keyed(
    kafka: KafkaSettings, expected: int, settle_s: float = 1.0
) -> list[tuple[str, Recommendation]]:
    """(key, record) of every message on the test's recommendations.v1, from the start."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        RECOMMENDATIONS.qualified(kafka.topic_prefix),
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=2000,
    )
    await consumer.start()
    out: list[tuple[str, Recommendation]] = []
    try:
        async with asyncio.timeout(60 + settle_s):
            while len(out) < expected:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out += [(m.key.decode(), decode(RECOMMENDATIONS, m.value)) for m in msgs]
            await asyncio.sleep(settle_s)  # and nothing more
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                out += [(m.key.decode(), decode(RECOMMENDATIONS, m.value)) for m in msgs]
    finally:
        await consumer.stop()
    return out


def listed(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    assert main(["recommend", "list", "--format", "json", *extra]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def test_compute_list_show_decide_and_the_audit_trail(
    env: ClickHouseSettings, broker: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recommend", "compute"]) == 0
    out = capsys.readouterr().out
    topic = RECOMMENDATIONS.qualified(broker.topic_prefix)
    assert f"7 recommendation(s) published on {topic} at {broker.bootstrap} from 7.0 days" in out
    assert "the ClickHouse sink (gpugap sink clickhouse) stores them" in out
    assert "--time 8:00:00 -> 2:30:00" in out
    assert run_sink(broker, env) == 7  # the sink stores what compute published

    rows = listed(capsys)
    saved = [float(r["saved_gpu_h_per_week"]) for r in rows]  # type: ignore[arg-type]
    assert saved == sorted(saved, reverse=True) and len(rows) == 7
    by_kind = {r["kind"]: str(r["id"]) for r in rows}
    assert set(by_kind) == {"slurm_time_limit", "gpu_count", "idle_culling", "placement",
                            "service_schedule", "gpu_share"}  # fmt: skip

    assert main(["recommend", "list"]) == 0
    assert "hpc: alice/vision train-r" in capsys.readouterr().out

    rid = by_kind["slurm_time_limit"]
    assert main(["recommend", "show", rid]) == 0
    shown = capsys.readouterr().out
    assert "FROM v_slurm_padding" in shown and "14 samples" in shown
    # the evidence query runs as printed
    assert main(["sql", json.loads(_show_json(rid, capsys))["evidence"]["query"],
                 "--format", "json"]) == 0  # fmt: skip
    assert len(json.loads(capsys.readouterr().out)) == 14

    assert main(["recommend", "decide", rid, "defer", "--by", "ops-lead",
                 "--why", "ask alice first"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["recommend", "decide", rid, "accept", "--by", "alice",
                 "--why", "2:30 is plenty"]) == 0  # fmt: skip
    accepted = capsys.readouterr().out
    assert "#SBATCH --time=2:30:00" in accepted and "gpugap never changes" in accepted
    cull = by_kind["idle_culling"]
    assert main(["recommend", "decide", cull, "reject", "--by", "erin",
                 "--why", "long runs overnight"]) == 0  # fmt: skip
    capsys.readouterr()

    assert main(["recommend", "decisions", "--format", "json"]) == 0
    trail = json.loads(capsys.readouterr().out)
    assert [(d["id"], d["decision"], d["decided_by"], d["reason"]) for d in trail] == [
        (cull, "reject", "erin", "long runs overnight"),
        (rid, "accept", "alice", "2:30 is plenty"),
        (rid, "defer", "ops-lead", "ask alice first"),
    ]
    assert all(d["decided_at"] for d in trail)

    # rejected ones leave the list; --all shows them, with the latest decision
    assert cull not in [r["id"] for r in listed(capsys)]
    every = {r["id"]: r for r in listed(capsys, "--all")}
    assert every[cull]["decision"] == "reject" and every[rid]["decided_by"] == "alice"

    assert main(["recommend", "show", rid]) == 0
    shown = capsys.readouterr().out
    assert "accept by alice: 2:30 is plenty" in shown and "defer by ops-lead" in shown
    assert "TimeLimit=2:30:00" in shown and "follow-up" in shown

    # the decision row carries the target as the sink stored it
    c = connect(env)
    try:
        targets = c.query(
            "SELECT DISTINCT d.target = r.target FROM recommendation_decisions AS d "
            "JOIN (SELECT id, target FROM recommendations FINAL) AS r ON d.id = r.id"
        ).result_rows
    finally:
        c.close()
    assert targets == [(True,)]

    # recomputing keeps the ids and the decisions (the audit table is never rewritten): the
    # sink's rows of the same ids are replaced, never duplicated
    first = stored(env)
    assert main(["recommend", "compute"]) == 0
    capsys.readouterr()
    assert run_sink(broker, env) == 7
    again = stored(env)
    assert set(again) == set(first) == set(every)
    assert all(again[i].computed_at > first[i].computed_at for i in first)
    c = connect(env)
    try:
        assert c.query("SELECT count() FROM recommendation_decisions").result_rows == [(3,)]
        assert c.query("SELECT count() FROM recommendations FINAL").result_rows == [(7,)]
    finally:
        c.close()
    assert cull not in [r["id"] for r in listed(capsys)]  # the decision outlives the recompute


def _show_json(rid: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["recommend", "show", rid, "--format", "json"]) == 0
    return capsys.readouterr().out


def test_bad_input_is_one_line(env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", "show", "nope:0"]) == 2
    assert "no recommendation 'nope:0'" in capsys.readouterr().err
    assert main(["recommend", "decide", "nope:0", "accept", "--by", "x", "--why", "y"]) == 2
    assert main(["recommend", "list", "--format", "xml"]) == 2
    assert main(["recommend", "decide", "nope:0", "accept", "--by", " ", "--why", "y"]) == 2


def test_compute_publishes_on_recommendations_v1_and_the_sink_stores_them(
    env: ClickHouseSettings, broker: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every record on the real broker, keyed by id; the sink stores exactly those records
    under the same ids."""
    assert main(["recommend", "compute"]) == 0
    assert "7 recommendation(s) published on" in capsys.readouterr().out
    got = asyncio.run(keyed(broker, 7))
    assert len(got) == 7 and all(k == r.id for k, r in got)
    assert {r.kind for _, r in got} >= {"service_schedule", "gpu_share", "placement"}
    assert run_sink(broker, env) == 7
    assert stored(env) == {r.id: r for _, r in got}
    assert {r["id"] for r in listed(capsys, "--all")} == {r.id for _, r in got}


def test_dry_run_publishes_nothing(
    env: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run computes and prints; it never reaches for Kafka (none listens here)."""
    from gpugap.services.kafka import free_port

    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    before = stored(env)
    assert main(["recommend", "compute", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "7 recommendation(s) found (not published: --dry-run) from 7.0 days" in out
    assert "--time 8:00:00 -> 2:30:00" in out
    assert stored(env) == before
    assert main(["recommend", "compute", "--dry-run", "--out", "-"]) == 2
    assert "--dry-run publishes nothing" in capsys.readouterr().err
    # without --dry-run the same broker is one line of error, and nothing stored
    assert main(["recommend", "compute"]) == 2
    err = capsys.readouterr().err
    assert "retry may help" in err and "cannot reach Kafka" in err
    assert stored(env) == before


def test_publish_to_json_lines(
    env: ClickHouseSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recs.jsonl"
    assert main(["recommend", "compute", "--out", str(out)]) == 0
    assert f"7 recommendation(s) written to {out} as recommendations.v1 JSON lines" in (
        capsys.readouterr().out
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 7 and {line["topic"] for line in lines} == {"recommendations.v1"}
    assert all(line["key"] == line["value"]["id"] for line in lines)
    # '-': the JSON lines alone on stdout, the summary on stderr
    assert main(["recommend", "compute", "--out", "-"]) == 0
    std = capsys.readouterr()
    assert sorted(json.loads(line)["key"] for line in std.out.splitlines()) == sorted(
        line["key"] for line in lines
    )
    assert "7 recommendation(s) written to stdout" in std.err
