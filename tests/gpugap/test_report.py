"""``gpugap report`` against the real endpoint: a small estate with a known answer (the
``estate`` fixture, report_data.py), the golden table layout, the JSON Schema, CSV and the
time windows."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.report import build_report, render, report_for, report_schema
from gpugap.report.queries import window_parameters
from gpugap.warehouse.client import connect
from tests.gpugap.report_data import T0

GOLDEN = Path(__file__).parents[1] / "fixtures" / "report"
UPDATE = os.environ.get("GPUGAP_UPDATE_GOLDEN") == "1"  # rewrite the golden files, then review


@pytest.fixture
def client(estate: ClickHouseSettings) -> Iterator[Any]:
    c = connect(estate)
    yield c
    c.close()


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), f"differs from {path} (GPUGAP_UPDATE_GOLDEN=1)"


def test_figures_match_the_estate(client: Any) -> None:
    r = build_report(client)
    assert (r.totals.allocated_gpu_h, r.totals.consumed_gpu_h) == (11.0, 2.86)
    assert r.totals.gap_gpu_h == pytest.approx(8.14)
    assert r.totals.gap_pct == pytest.approx(74.0, abs=0.01)
    assert [(g.key, g.gap_gpu_h) for g in r.breakdown] == [
        ("interactive", pytest.approx(3.94)),
        ("batch", pytest.approx(3.0)),
        ("service", pytest.approx(1.2)),
    ]
    # ranked by absolute gap: the 2-GPU job at 37.5% busy wastes more than the 1% salloc
    assert [a.allocation_id for a in r.top_allocations] == [
        "slurm/c/101", "slurm/c/102", "k8s/k/u-carol", "k8s/k/u-dave", "slurm/c/103",
    ]  # fmt: skip
    first = r.top_allocations[0]
    assert (first.name, first.gpus_requested, first.final_state) == ("train-resnet", 2, "COMPLETED")
    assert r.top_allocations[2].name == "notebooks/jupyter-carol"
    owner = r.top_owners[0]
    assert (owner.owner, owner.teams, owner.allocations) == ("alice", ["vision"], 2)
    assert (r.capacity.capacity_gpu_h, r.capacity.unallocated_gpu_h) == (14.0, 3.0)
    assert r.capacity.unattributed_gpu_h == pytest.approx(0.25)
    assert [(n.node, n.unattributed_gpu_h) for n in r.unattributed_nodes] == [("n1", 0.25)]
    pad = r.slurm_padding
    assert (pad.jobs, pad.median_limit_ratio, pad.padding_gpu_h) == (2, 3.0, 13.0)
    assert [(p.user, p.account, p.jobs) for p in pad.rows] == [("alice", "vision", 2)]
    assert (r.idle_now.allocations, r.idle_now.gpus) == (2, 2)
    assert {i.allocation_id for i in r.idle_now.rows} == {"slurm/c/102", "k8s/k/u-carol"}
    assert r.window.latest_minute == T0 + timedelta(minutes=119)
    gang = r.partial_gangs_now.rows[0]
    assert (gang.gang_id, gang.running_pods, gang.pending_pods, gang.held_gpu_h) == (
        "llm-pretrain", 3, 1, 3.5,
    )  # fmt: skip


def test_table_layout_is_pinned(client: Any) -> None:
    text = render(build_report(client), "table")
    assert max(len(line) for line in text.splitlines()) <= 100
    golden("report_by_class.txt", text)
    by_team = render(build_report(client, by="team", top=2), "table")
    assert max(len(line) for line in by_team.splitlines()) <= 100
    golden("report_by_team_top2.txt", by_team)


def test_long_names_still_fit_100_columns(client: Any) -> None:
    report = build_report(client, by="allocation")
    long = report.model_copy(
        update={
            "top_allocations": [
                a.model_copy(update={"name": "x" * 120, "owner": "o" * 60})
                for a in report.top_allocations
            ]
        }
    )
    assert max(len(line) for line in render(long, "table").splitlines()) <= 100


def test_json_follows_the_published_schema(client: Any) -> None:
    doc = json.loads(render(build_report(client, by="cluster", top=1), "json"))
    jsonschema.Draft202012Validator.check_schema(report_schema())
    jsonschema.validate(doc, report_schema(), cls=jsonschema.Draft202012Validator)
    assert doc["window"]["latest_minute"] == "2026-11-03T00:59:00Z"
    assert [g["key"] for g in doc["breakdown"]] == ["c", "other (1)"]
    assert sum(g["gap_gpu_h"] for g in doc["breakdown"]) == pytest.approx(8.14)


def test_csv_is_one_value_per_line(client: Any) -> None:
    rows = list(csv.reader(io.StringIO(render(build_report(client), "csv"))))
    assert rows[0] == ["section", "key", "field", "value"]
    assert all(len(r) == 4 for r in rows)
    values = {(s, k, f): v for s, k, f, v in rows[1:]}
    assert float(values[("totals", "all", "gap_gpu_h")]) == pytest.approx(8.14)
    assert values[("top_allocations", "slurm/c/101", "name")] == "train-resnet"
    assert values[("slurm_padding", "alice", "jobs")] == "2"


@pytest.mark.parametrize(
    ("since", "until"),
    [
        (T0 + timedelta(minutes=30), T0 + timedelta(minutes=90)),  # edge hours only
        (T0 - timedelta(days=1), T0 + timedelta(days=2)),  # whole days only
        (T0, T0 + timedelta(days=1, hours=5)),  # an edge hour, then a whole day
        (T0 + timedelta(hours=1), None),  # from midnight on
        (None, T0 + timedelta(minutes=59)),  # the first hour
    ],
)
def test_windows_agree_with_the_hourly_view(
    client: Any, since: datetime | None, until: datetime | None
) -> None:
    r = build_report(client, since, until, by="scheduler")
    p = window_parameters(since, until)
    expected = client.query(
        "SELECT sum(allocated_gpu_h), sum(consumed_gpu_h) FROM v_capacity_gap "
        "WHERE hour >= {a:DateTime('UTC')} AND hour < {b:DateTime('UTC')}",
        parameters={"a": p["since"], "b": p["until"]},
    ).result_rows[0]
    assert (r.totals.allocated_gpu_h, r.totals.consumed_gpu_h) == pytest.approx(expected)
    assert r.window.hour_from == (p["since"] if since else None)


def test_report_for_settings(estate: ClickHouseSettings) -> None:
    r = report_for(estate, since=datetime(2026, 11, 3), by="team", top=1)  # naive: UTC
    assert r.totals.allocated_gpu_h == pytest.approx(5.0)  # the hour after midnight, 5 held
    assert r.breakdown[-1].key == "other (2)"


def test_empty_warehouse_and_empty_window(clickhouse: ClickHouseSettings, client: Any) -> None:
    fresh = report_for(clickhouse)
    assert fresh.window.data_from is None and fresh.window.latest_minute is None
    assert fresh.totals.allocated_gpu_h == 0.0 and fresh.breakdown == []
    assert "all data (none yet)" in render(fresh, "table")
    before = build_report(
        client, datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 2, tzinfo=UTC)
    )
    assert before.totals.gap_pct is None and before.top_allocations == []
    assert before.window.latest_minute == T0 + timedelta(minutes=119)  # "now" is not windowed
    assert before.idle_now.allocations == 2
