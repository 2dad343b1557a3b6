"""``gpugap report`` and ``gpugap sql`` from the command line: output formats against the real
endpoint, and every bad input as one line on stderr with a non-zero exit, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import report_schema
from gpugap.services.kafka import free_port


@pytest.fixture
def env(estate: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch) -> ClickHouseSettings:
    """GPUGAP_CLICKHOUSE_* pointing at the estate, as a user's shell would."""
    for key in [k for k in os.environ if k.startswith("GPUGAP_CLICKHOUSE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", estate.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", estate.user)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", estate.database)
    if estate.password is not None:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", estate.password.get_secret_value())
    return estate


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, err: str, *words: str) -> None:
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpugap: error"), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0]


def test_report_json_and_schema(
    env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "report", "--format", "json", "--since", "2026-11-03", "--top", "1")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, report_schema(), cls=jsonschema.Draft202012Validator)
    assert doc["window"]["hour_from"] == "2026-11-03T00:00:00Z"
    assert doc["totals"]["allocated_gpu_h"] == 5.0
    code, out, _ = run(capsys, "report", "--schema")
    assert code == 0 and json.loads(out) == report_schema()


def test_relative_times(env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    before = datetime.now(UTC)
    code, out, _ = run(capsys, "report", "--since", "-24h", "--until", "now", "--format", "json")
    assert code == 0
    since = datetime.fromisoformat(json.loads(out)["window"]["since"])
    assert (
        before - timedelta(hours=24, seconds=5) <= since <= datetime.now(UTC) - timedelta(hours=24)
    )
    code, out, _ = run(capsys, "report", "--since=-7d", "--by", "allocation", "--format", "csv")
    assert code == 0 and out.startswith("section,key,field,value")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--by", "gpu"], ["unknown --by 'gpu'", "class, scheduler, team, cluster, allocation"]),
        (["--format", "xml"], ["unknown --format 'xml'"]),
        (["--since", "yesterday"], ["--since", "'yesterday'", "ISO-8601"]),
        (["--until", "2026-13-01"], ["--until", "'2026-13-01'"]),
        (["--since", "2026-11-03", "--until", "2026-11-03T00:00Z"], ["empty time range"]),
        (["--since", "2026-11-04", "--until", "2026-11-03"], ["reversed time range"]),
        (["--since", "-24h", "--until", "-48h"], ["reversed time range"]),
        (["--top", "0"], ["--top must be at least 1"]),
        (["--clickhouse", "ftp://somewhere"], ["must be http(s)://host:port"]),
    ],
)
def test_bad_report_input(
    env: ClickHouseSettings, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code, out, err = run(capsys, "report", *argv)
    assert out == ""
    one_error_line(code, err, *words)


def test_missing_database_says_migrate(
    env: ClickHouseSettings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", "no_such_database")
    code, _, err = run(capsys, "report")
    one_error_line(code, err, "no_such_database", "gpugap db migrate")


def test_unreachable_clickhouse_in_a_real_process(env: ClickHouseSettings) -> None:
    """A subprocess: what a user sees, logging included (urllib3 retries log warnings)."""
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (["report", "--clickhouse", url], ["sql", "SELECT 1", "--clickhouse", url]):
        proc = subprocess.run(
            [sys.executable, "-m", "gpugap", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.stdout == ""
        one_error_line(proc.returncode, proc.stderr, url, "unavailable", "Connection refused")


def test_sql_formats(env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    query = (
        "SELECT allocation_id, round(gap_gpu_h, 2) AS gap FROM v_top_waste "
        "WHERE scheduler = {s:String} ORDER BY gap DESC"
    )
    code, out, _ = run(capsys, "sql", query, "--param", "s=slurm")
    assert code == 0
    assert out.splitlines() == [
        "  allocation_id   gap",
        "  -------------  ----",
        "  slurm/c/101     2.5",
        "  slurm/c/102    1.98",
        "  slurm/c/103     0.5",
        "(3 rows)",
    ]
    code, out, _ = run(capsys, "sql", query, "--param", "s=kubernetes", "--format", "json")
    assert json.loads(out) == [
        {"allocation_id": "k8s/k/u-carol", "gap": 1.96},
        {"allocation_id": "k8s/k/u-dave", "gap": 1.2},
    ]
    code, out, err = run(
        capsys, "sql", "SELECT number FROM numbers(10)", "--format", "csv", "--max-rows", "3"
    )
    assert out.splitlines() == ["number", "0", "1", "2"]
    assert "first 3 rows" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["INSERT INTO alerts (alert_id) VALUES ('x')"], ["refused", "readonly"]),
        (["DROP TABLE gpu_minutes"], ["refused", "readonly"]),
        (["SELECT * FROM no_such_view"], ["refused", "no_such_view", "gpugap db migrate"]),
        (["SELECT 1", "--format", "yaml"], ["unknown --format 'yaml'"]),
        (["SELECT {n:UInt8}", "--param", "n"], ["--param wants NAME=VALUE"]),
    ],
)
def test_bad_sql(
    env: ClickHouseSettings, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code, out, err = run(capsys, "sql", *argv)
    assert out == ""
    one_error_line(code, err, *words)
