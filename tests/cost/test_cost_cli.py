"""``gpugap produce transfers-csv`` (idempotent billing import), ``gpugap cost load`` and
``gpugap report --cost`` (table, JSON against its schema, CSV) on the estate of estate.py."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import jsonschema
import pytest

from gpugap.cli import main
from gpugap.cost.report import extend_schema
from gpugap.groundfloor.ratecard import RateCard
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.producers.replay.producer import parse_line
from gpugap.producers.transfers.csv_import import BadRow, rows
from gpugap.producers.transfers.settings import TransfersCsvSettings
from gpugap.report import report_schema
from gpugap.schemas.models import Record, Transfer
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from tests.cost.estate import CARD, H100_HPC, HPC_KWH, minutes, transfers

BILL = """\
identity/LineItemId,lineItem/UsageStartDate,lineItem/UsageType,lineItem/UsageAmount,lineItem/UnblendedCost,resourceTags/user:team
l-1,2026-11-02T10:00:00Z,USE1-DataTransfer-Out-Bytes,10,0.90,vision
l-2,2026-11-02T11:00:00Z,USE1-DataTransfer-Out-Bytes,2.5,0.23,search
l-3,not a time,USE1-DataTransfer-Out-Bytes,1,0.09,search
l-4,2026-11-02T12:00:00Z,USE1-DataTransfer-Out-Bytes,-1,0.0,search
"""
AWS = {
    "event_id": "identity/LineItemId",
    "time": "lineItem/UsageStartDate",
    "amount": "lineItem/UsageAmount",
    "description": "lineItem/UsageType",
    "billed_cost": "lineItem/UnblendedCost",
    "team": "resourceTags/user:team",
}


def cfg(**kw: object) -> TransfersCsvSettings:
    base: dict[str, object] = {"from_env": "cloud", "to_env": "onprem", "unit": "GiB"}
    return TransfersCsvSettings.model_validate({**base, **kw})


def test_billing_lines_become_transfers() -> None:
    got = list(rows(BILL.splitlines(keepends=True), cfg(columns=AWS), "cloud"))
    good = [r for r in got if isinstance(r, Transfer)]
    bad = [r for r in got if isinstance(r, BadRow)]
    assert [(t.event_id, t.bytes, t.team, t.billed_cost) for t in good] == [
        ("l-1", 10 << 30, "vision", 0.90),
        ("l-2", int(2.5 * (1 << 30)), "search", 0.23),
    ]
    assert (good[0].from_env, good[0].to_env, good[0].cluster) == ("cloud", "onprem", "cloud")
    assert good[0].description == "USE1-DataTransfer-Out-Bytes"
    assert [b.line for b in bad] == [4, 5]
    assert "non-negative" in bad[1].reason


def test_a_bills_unit_column_reads_gb_as_the_bill_means_it() -> None:
    # AWS's Cost and Usage Report says "GB" in pricing/unit for data transfer billed in GiB
    bill = "id,time,amount,pricing/unit\nu-1,2026-11-02T10:00Z,2,GB\nu-2,2026-11-02T10:00Z,1,TB\n"
    columns = {"event_id": "id", "amount": "amount", "unit": "pricing/unit"}
    decimal = list(rows(bill.splitlines(True), cfg(columns=columns), "cloud"))
    assert [t.bytes for t in decimal] == [2 * 10**9, 10**12]  # type: ignore[union-attr]
    binary = list(rows(bill.splitlines(True), cfg(columns=columns, binary_units=True), "cloud"))
    assert [t.bytes for t in binary] == [2 << 30, 1 << 40]  # type: ignore[union-attr]


def test_rows_that_would_land_in_the_default_cluster_are_named_before_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUGAP_CLUSTER", raising=False)
    monkeypatch.delenv("GPUGAP_TRANSFERS_CLUSTER", raising=False)
    bill = tmp_path / "bill.csv"
    bill.write_text("time,bytes\n2026-11-02T10:00Z,100\n")
    out = tmp_path / "out.jsonl"
    base = ["produce", "transfers-csv", "--file", str(bill), "--from-env", "cloud",
            "--to-env", "onprem", "--out", str(out)]  # fmt: skip
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "go to cluster 'default'" in err and "--cluster" in err
    assert parse_line(out.read_bytes().splitlines()[0])[2].cluster == "default"
    out.unlink()
    assert main([*base, "--cluster", "k8s"]) == 0
    assert "go to cluster" not in capsys.readouterr().err
    assert parse_line(out.read_bytes().splitlines()[0])[2].cluster == "k8s"


def test_rows_without_ids_get_the_same_ids_on_every_import() -> None:
    text = "time,bytes,from,to,team\n2026-11-02T10:00Z,100,cloud,onprem,a\n"
    text += "2026-11-02T10:00Z,100,cloud,onprem,a\n2026-11-02T10:00Z,7,cloud,internet,b\n"

    def ids() -> list[str]:
        return [r.event_id for r in rows(text.splitlines(True), cfg(unit="bytes"), "c")]  # type: ignore[union-attr]

    first = ids()
    assert first == ids() and len(set(first)) == 3  # identical rows: -2 on the second
    assert first[1] == first[0] + "-2"


def _import(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> list[Record]:
    bill = tmp_path / "bill.csv"
    bill.write_text(BILL)
    out = tmp_path / name
    code = main(
        ["produce", "transfers-csv", "--file", str(bill), "--to-env", "onprem", "--unit", "GiB",
         "--out", str(out)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    assert "line 4" in err and "line 5" in err  # reported, skipped
    return [parse_line(line)[2] for line in out.read_bytes().splitlines()]


def test_csv_import_is_idempotent(
    clickhouse: ClickHouseSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUGAP_CLUSTER", "cloud")
    monkeypatch.setenv("GPUGAP_TRANSFERS_FROM_ENV", "cloud")
    monkeypatch.setenv("GPUGAP_TRANSFERS_COLUMNS", json.dumps(AWS))
    first, again = _import(tmp_path, capsys, "a.jsonl"), _import(tmp_path, capsys, "b.jsonl")
    assert first == again and len(first) == 2

    async def store(records: list[Record]) -> None:
        sink = ClickHouseSink(clickhouse, rate_card=(RateCard.model_validate(CARD), "test"))
        await sink.start()
        await sink.write(records)
        await sink.close()

    asyncio.run(store(first))
    asyncio.run(store(again))  # the same file imported twice
    c = connect(clickhouse)
    try:
        got = c.query("SELECT count(), sum(bytes), sum(cost), sum(billed_cost) FROM v_transfers")
        n, total, cost, billed = got.result_rows[0]
    finally:
        c.close()
    assert (n, total) == (2, (10 << 30) + int(2.5 * (1 << 30)))
    assert cost == pytest.approx(12.5 * 0.09) and billed == pytest.approx(0.90 + 0.23)


@pytest.fixture
def estate_env(
    clickhouse: ClickHouseSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ClickHouseSettings:
    for key in [k for k in os.environ if k.startswith(("GPUGAP_CLICKHOUSE_", "GPUGAP_COST_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_URL", clickhouse.url)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_USER", clickhouse.user)
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", clickhouse.database)
    if clickhouse.password is not None:
        monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", clickhouse.password.get_secret_value())

    async def store() -> None:
        sink = ClickHouseSink(clickhouse)  # no card: `gpugap cost load` writes it
        await sink.start()
        await sink.write(minutes() + transfers())
        await sink.close()

    asyncio.run(store())
    card = tmp_path / "card.json"
    card.write_text(json.dumps(CARD))
    monkeypatch.setenv("GPUGAP_COST_RATE_CARD_FILE", str(card))
    return clickhouse


def test_report_cost(estate_env: ClickHouseSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--cost"]) == 0
    out = capsys.readouterr().out
    assert "rate card: none in the warehouse" in out  # before `gpugap cost load`
    assert main(["cost", "load"]) == 0
    card_id = RateCard.model_validate(CARD).card_id()
    assert card_id in capsys.readouterr().out

    assert main(["report", "--cost"]) == 0
    out = capsys.readouterr().out
    assert f'rate card "test card" {card_id}, EUR, loaded ' in out and "  from file " in out
    assert all(len(line) <= 100 for line in out.splitlines()), out
    section = out[out.index("\nCOST") :]
    assert "no rate" in section  # lab has no card, and the batch class spans it
    assert "cloud -> onprem" in section
    assert "egress EUR" in section and "total EUR" in section
    assert "Egress rates (EUR/GiB across the boundary)" in section

    assert main(["report", "--cost", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, extend_schema(report_schema()), cls=jsonschema.Draft202012Validator)
    cost = doc["cost"]
    assert cost["currency"] == "EUR" and cost["rate_card"]["card_id"] == card_id
    clusters = {r["key"]: r for r in cost["by_cluster"]}
    assert clusters["lab"]["allocated_cost"] is None and clusters["lab"]["rate_status"] == "no rate"
    hpc = clusters["hpc"]
    assert hpc["environment"] == "onprem"
    assert hpc["unallocated_cost"] == pytest.approx(H100_HPC + 0.07 * HPC_KWH, abs=1e-4)
    classes = {r["key"]: r for r in cost["by_class"]}
    assert classes["batch"]["allocated_cost"] is None  # lab's batch job has no rate
    assert classes["batch"]["unrated_gpu_h"] == pytest.approx(1.0)
    assert classes["service"]["rate_status"] == "partly rated"  # edge's MIG: no share
    assert classes["interactive"]["allocated_cost"] is not None
    assert cost["totals"]["allocated_cost"] is None
    assert cost["totals"]["energy_kwh"] is None  # edge's MIG slice: its share is unknown
    assert {(t["to_env"], t["cost"]) for t in cost["transfers"]} >= {("onprem", 0.9)}
    # egress beside compute per cluster and in the total: cloud sent 10 GiB to onprem at
    # 0.09 and 2 GiB to the internet at 0.12; lab 1 GiB with no rate
    cloud = clusters["cloud"]
    assert cloud["egress_gib"] == pytest.approx(12.0)
    assert cloud["egress_cost"] == pytest.approx(10 * 0.09 + 2 * 0.12)
    assert cloud["total_cost"] == pytest.approx(
        cloud["allocated_cost"] + cloud["unallocated_cost"] + cloud["egress_cost"]
    )
    assert hpc["egress_gib"] == 0.0 and hpc["egress_cost"] == 0.0
    assert clusters["lab"]["egress_cost"] is None and clusters["lab"]["total_cost"] is None
    assert cost["totals"]["egress_gib"] == pytest.approx(13.0)
    assert cost["totals"]["egress_cost"] is None  # lab's gigabyte has no rate
    egress = {(e["cluster"], e["from_env"], e["to_env"]): e["per_gib"]
              for e in cost["rate_card"]["egress"]}  # fmt: skip
    assert egress == {("hpc", "onprem", "cloud"): 0.0, ("cloud", "cloud", "onprem"): 0.09,
                      ("cloud", "cloud", "internet"): 0.12}  # fmt: skip

    assert main(["report", "--cost", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "cost_by_cluster,lab,allocated_cost,no rate" in lines
    assert main(["report", "--cost", "--schema"]) == 0
    assert "CostReport" in json.loads(capsys.readouterr().out)["$defs"]


def test_cost_show_and_a_bad_card(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUGAP_COST_RATE_CARD", raising=False)
    monkeypatch.delenv("GPUGAP_COST_RATE_CARD_FILE", raising=False)
    assert main(["cost", "show"]) == 2
    assert "no rate card" in capsys.readouterr().err
    bad = tmp_path / "card.yaml"
    bad.write_text("clusters:\n  c:\n    environment: moon\n")
    assert main(["cost", "show", "--file", str(bad)]) == 2
    assert "clusters.c.environment" in capsys.readouterr().err
    bad.write_text("clusters: {c: {environment: cloud, egress_per_gib: {'cloud->onprem': 0.09}}}")
    assert main(["cost", "show", "--file", str(bad)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["egress"][0]["per_gib"] == 0.09 and shown["rules"][0]["cluster"] == ""


def test_a_link_recorded_by_a_bill_and_by_counters_is_flagged(
    clickhouse: ClickHouseSettings,
) -> None:
    # the same cloud->onprem link from the bill and from node_exporter: both are summed, so
    # the report says so and which two, rather than showing a doubled figure as measured
    from gpugap.cost.render import render_table
    from gpugap.cost.report import build_cost
    from tests.cost.estate import transfer

    counted = transfer("n1", "cloud", "cloud", "onprem", 10, "vision").model_copy(
        update={"source": "node_exporter"}
    )

    async def store() -> None:
        sink = ClickHouseSink(clickhouse, rate_card=(RateCard.model_validate(CARD), "test"))
        await sink.start()
        await sink.write([*transfers(), counted])
        await sink.close()

    asyncio.run(store())
    client = connect(clickhouse)
    try:
        cost = build_cost(client)
    finally:
        client.close()
    links = {(t.cluster, t.from_env, t.to_env): t for t in cost.transfers}
    assert links["cloud", "cloud", "onprem"].sources == ["billing_csv", "node_exporter"]
    assert links["cloud", "cloud", "internet"].sources == ["billing_csv"]
    text = render_table(cost)
    assert "cloud cloud -> onprem: recorded by billing_csv and node_exporter" in text
    assert "cloud cloud -> internet: recorded" not in text
