"""``gpugap recommend`` end to end on the scenario week: compute, list, show, decide and the
audit trail (append-only, who/when/why), and the change printed for a person to apply."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpugap.cli import main
from groundfloor.settings import ClickHouseSettings, KafkaSettings
from schemas.topics import RECOMMENDATIONS
from sinks.clickhouse.warehouse import connect
from tests.conftest import read_topic


@pytest.fixture
def env(week: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch) -> ClickHouseSettings:
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", week.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", week.database)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", week.user)
    if week.password:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", week.password.get_secret_value())
    return week


def listed(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    assert main(["recommend", "list", "--format", "json", *extra]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def test_compute_list_show_decide_and_the_audit_trail(
    env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recommend", "compute"]) == 0
    out = capsys.readouterr().out
    assert "7 recommendation(s) stored from 7.0 days" in out
    assert "--time 8:00:00 -> 2:30:00" in out

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

    # recomputing keeps the ids and the decisions (the audit table is never rewritten)
    assert main(["recommend", "compute"]) == 0
    capsys.readouterr()
    c = connect(env)
    try:
        assert c.query("SELECT count() FROM recommendation_decisions").result_rows == [(3,)]
        assert c.query("SELECT count() FROM recommendations FINAL").result_rows == [(7,)]
    finally:
        c.close()


def _show_json(rid: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["recommend", "show", rid, "--format", "json"]) == 0
    return capsys.readouterr().out


def test_bad_input_is_one_line(env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", "show", "nope:0"]) == 2
    assert "no recommendation 'nope:0'" in capsys.readouterr().err
    assert main(["recommend", "decide", "nope:0", "accept", "--by", "x", "--why", "y"]) == 2
    assert main(["recommend", "list", "--format", "xml"]) == 2
    assert main(["recommend", "decide", "nope:0", "accept", "--by", " ", "--why", "y"]) == 2


def test_compute_publishes_on_recommendations_v1(
    env: ClickHouseSettings,
    kafka: KafkaSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--publish: every record on the real broker, keyed by id, equal to what was stored."""
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", kafka.bootstrap)
    monkeypatch.setenv("GPUGAP_KAFKA_TOPIC_PREFIX", kafka.topic_prefix)
    assert main(["recommend", "compute", "--publish"]) == 0
    assert "7 published on recommendations.v1" in capsys.readouterr().out
    got = asyncio.run(read_topic(kafka, RECOMMENDATIONS, 7, settle_s=1.0))
    stored = {r["id"] for r in listed(capsys, "--all")}
    assert len(got) == 7 and {r.id for r in got} == stored
    assert {r.kind for r in got} >= {"service_schedule", "gpu_share", "placement"}


def test_publish_to_json_lines(
    env: ClickHouseSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recs.jsonl"
    assert main(["recommend", "compute", "--dry-run", "--publish", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 7 and {line["topic"] for line in lines} == {"recommendations.v1"}
