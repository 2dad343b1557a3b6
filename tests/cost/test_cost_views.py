"""The cost views against the rate card applied by hand to a simulated estate with known
watts and transfers (records written through the sink, as tests/warehouse/test_views.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from gpugap.warehouse.client import connect
from tests.cost.estate import (
    A100_HPC,
    CLOUD_CO2,
    H100_CLOUD,
    H100_HPC,
    HPC_CO2,
    HPC_KWH,
    L40S,
    MIG_RATE,
    card,
    minutes,
    transfers,
)

approx = pytest.approx


def store(settings: ClickHouseSettings, with_card: bool = True) -> None:
    async def run() -> None:
        sink = ClickHouseSink(settings, rate_card=(card(), "test") if with_card else None)
        await sink.start()
        await sink.write(minutes() + transfers())
        await sink.write(transfers() + minutes()[:40])  # re-delivered: changes nothing
        await sink.close()

    asyncio.run(run())


def query(settings: ClickHouseSettings, sql: str) -> list[dict[str, Any]]:
    c = connect(settings)
    try:
        return list(c.query(sql).named_results())
    finally:
        c.close()


def by_allocation(settings: ClickHouseSettings) -> dict[str, dict[str, Any]]:
    rows = query(settings, "SELECT * FROM v_cost_daily ORDER BY cluster, allocation_id")
    return {f"{r['cluster']}:{r['allocation_id']}": r for r in rows}


def test_every_figure_is_the_rate_card_applied_by_hand(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse)
    got = by_allocation(clickhouse)
    expected = {
        # key: (allocated, consumed, gap GPU-h; kWh allocated, consumed; cost alloc,
        #       consumed, gap; CO2 alloc kg)
        "hpc:slurm/hpc/1": (1.0, 0.5, 0.5, 0.4, 0.2, H100_HPC + 0.4 * HPC_KWH,
                            0.5 * H100_HPC + 0.2 * HPC_KWH, 0.5 * H100_HPC + 0.2 * HPC_KWH,
                            0.4 * HPC_CO2),
        # 50 measured minutes at 100 W, 6 s of 60 consumed each; 10 minutes unmeasured
        "hpc:slurm/hpc/2": (1.0, 1 / 12, 0.75, 100 * 3000 / 3.6e6, 100 * 300 / 3.6e6,
                            A100_HPC + 100 * 3000 / 3.6e6 * HPC_KWH,
                            A100_HPC / 12 + 100 * 300 / 3.6e6 * HPC_KWH,
                            0.75 * A100_HPC + 100 * 2700 / 3.6e6 * HPC_KWH,
                            100 * 3000 / 3.6e6 * HPC_CO2),
        # cloud: the GPU-hour price includes power; CO2 from the measured watts
        "cloud:k8s/cloud/a": (1.0, 0.75, 0.25, 0.3, 0.225, L40S, 0.75 * L40S, 0.25 * L40S,
                              0.3 * CLOUD_CO2),
        # MIG 3g.40gb: 3/7 of its parent's price; no power per slice (0 kWh, unmetered)
        "cloud:k8s/cloud/b": (1.0, 0.2, 0.8, 0.0, 0.0, MIG_RATE, 0.2 * MIG_RATE,
                              0.8 * MIG_RATE, 0.0),
        "cloud:k8s/cloud/c": (0.5, 0.5, 0.0, 0.35, 0.35, 0.5 * H100_CLOUD, 0.5 * H100_CLOUD,
                              0.0, 0.35 * CLOUD_CO2),
    }  # fmt: skip
    for key, (alloc, used, gap, kwh, used_kwh, cost, used_cost, gap_cost, co2) in expected.items():
        r = got[key]
        assert r["rate_status"] == "rated", key
        assert r["currency"] == "EUR"
        assert (r["allocated_gpu_h"], r["consumed_gpu_h"], r["gap_gpu_h"]) == approx(
            (alloc, used, gap)
        ), key
        assert (r["allocated_kwh"], r["consumed_kwh"]) == approx((kwh, used_kwh)), key
        assert r["gap_kwh"] == approx(kwh - used_kwh), key
        assert (r["allocated_cost"], r["consumed_cost"], r["gap_cost"]) == approx(
            (cost, used_cost, gap_cost)
        ), key
        assert r["allocated_co2_kg"] == approx(co2, abs=1e-12), key
        assert r["gap_co2_kg"] == approx(co2 - r["consumed_co2_kg"], abs=1e-12), key
    assert got["cloud:k8s/cloud/b"]["unmetered_gpu_h"] == approx(1.0)
    assert got["hpc:slurm/hpc/2"]["unmetered_gpu_h"] == approx(10 / 60)
    assert got["hpc:slurm/hpc/2"]["unmeasured_gpu_h"] == approx(10 / 60)
    # capacity nobody held is costed too: a GPU-hour at 70 W
    free = got["hpc:"]
    assert free["unallocated_gpu_h"] == approx(1.0)
    assert free["unallocated_kwh"] == approx(0.07)
    assert free["unallocated_cost"] == approx(H100_HPC + 0.07 * HPC_KWH)
    assert free["unallocated_co2_kg"] == approx(0.07 * HPC_CO2)


def test_a_cluster_without_a_rate_says_no_rate(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse)
    got = by_allocation(clickhouse)
    lab = got["lab:slurm/lab/1"]
    assert lab["rate_status"] == "no rate"
    assert lab["unrated_gpu_h"] == approx(1.0)
    for col in ("allocated_cost", "consumed_cost", "gap_cost", "allocated_co2_kg"):
        assert lab[col] is None, col  # never 0
    assert lab["allocated_kwh"] == approx(0.25)  # energy is measured, whatever the card
    edge = got["edge:k8s/edge/x"]  # a MIG slice the card gives no share of its parent
    assert edge["rate_status"] == "no MIG share"
    assert edge["allocated_cost"] is None and edge["allocated_kwh"] is None
    # a sum over rated and unrated rows is NULL, not the rated part
    batch = query(
        clickhouse,
        "SELECT if(countIf(allocated_cost IS NULL) > 0, NULL, sum(allocated_cost)) AS c, "
        "sumIf(unrated_gpu_h, 1) AS unrated FROM v_cost_daily WHERE workload_class = 'batch'",
    )[0]
    assert batch["c"] is None and batch["unrated"] == approx(1.0)
    clusters = {r["cluster"]: r for r in query(clickhouse, "SELECT * FROM v_cost_cluster_daily")}
    assert clusters["lab"]["rate_status"] == "no rate"
    assert clusters["lab"]["allocated_cost"] is None and clusters["lab"]["co2_kg"] is None
    assert clusters["hpc"]["environment"] == "onprem"
    assert clusters["hpc"]["energy_kwh"] == approx(0.4 + 0.07 + 100 * 3000 / 3.6e6)
    cloud = clusters["cloud"]
    assert cloud["allocated_cost"] == approx(L40S + MIG_RATE + 0.5 * H100_CLOUD)
    assert cloud["co2_kg"] == approx((0.3 + 0.35) * CLOUD_CO2)


def test_no_card_at_all_is_no_rate_everywhere(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse, with_card=False)
    rows = query(clickhouse, "SELECT DISTINCT rate_status, allocated_cost FROM v_cost_daily")
    assert {(r["rate_status"], r["allocated_cost"]) for r in rows} == {("no rate", None)}
    assert query(clickhouse, "SELECT card_id FROM v_rate_card_info")[0]["card_id"] == ""


def test_transfers_bytes_and_cost_per_direction(clickhouse: ClickHouseSettings) -> None:
    store(clickhouse)
    rows = query(
        clickhouse,
        "SELECT cluster, from_env, to_env, team, transfers, bytes, gib, cost, rate_status "
        "FROM v_transfers_daily ORDER BY cluster, to_env",
    )
    got = {(r["cluster"], r["from_env"], r["to_env"]): r for r in rows}
    assert len(rows) == 3  # re-delivered records counted once
    out = got[("cloud", "cloud", "internet")]
    assert (out["transfers"], out["gib"], out["cost"], out["team"]) == (
        1,
        2.0,
        approx(0.24),
        "search",
    )
    dc = got[("cloud", "cloud", "onprem")]
    assert (dc["bytes"], dc["cost"]) == (10 << 30, approx(0.9))
    lab = got[("lab", "onprem", "cloud")]
    assert (lab["rate_status"], lab["cost"]) == ("no rate", None)


def test_a_new_card_replaces_the_old_one(clickhouse: ClickHouseSettings) -> None:
    from gpugap.groundfloor.ratecard import RateCard, write_rate_card

    store(clickhouse)
    c = connect(clickhouse)
    try:
        write_rate_card(c, RateCard(name="empty"), "test")
    finally:
        c.close()
    info = query(clickhouse, "SELECT * FROM v_rate_card_info")[0]
    assert info["card_name"] == "empty" and info["rules"] == 0
    rows = query(clickhouse, "SELECT DISTINCT rate_status FROM v_cost_daily")
    assert {r["rate_status"] for r in rows} == {"no rate"}
    assert query(clickhouse, "SELECT count() AS n FROM v_transfers WHERE rated")[0]["n"] == 0
