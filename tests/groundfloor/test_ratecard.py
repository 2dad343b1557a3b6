"""The rate card: validation, what the views get (rate_rows), the demo's example card, and the
configuration paths (GPUGAP_COST_RATE_CARD, _FILE as YAML or JSON)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.groundfloor.ratecard import (
    RATE_COLUMNS,
    CostSettings,
    RateCard,
    configured_card,
    glob_regex,
    mig_share_of,
    rate_rows,
    validate_card,
)
from gpugap.schemas.errors import ConfigError
from gpugap.simulator import estate as sim_estate
from gpugap.simulator.scenario import load
from tests.cost.estate import CARD, H100_HPC

EXAMPLE = Path(__file__).parents[2] / "docs" / "cost-rate-card.example.yaml"
NOW = datetime(2026, 11, 2, tzinfo=UTC)


def rows(card: RateCard) -> list[dict[str, object]]:
    return [dict(zip(RATE_COLUMNS, r, strict=True)) for r in rate_rows(card, "test", NOW)]


def test_rows_are_the_rules_in_order_then_the_default() -> None:
    got = [r for r in rows(RateCard.model_validate(CARD)) if r["cluster"] == "hpc"]
    assert [(r["node_pattern"], r["gpu_model"], r["priority"]) for r in got] == [
        ("hpc-a100-*", "A100", 0),
        ("*", "H100", 1),
    ]
    assert got[1]["gpu_hour_rate"] == pytest.approx(H100_HPC)
    assert got[1]["capital_per_gpu_h"] == pytest.approx(27000 / (4 * 8760))
    assert (got[1]["kwh_price"], got[1]["pue"], got[1]["emission_g_per_kwh"]) == (0.12, 1.25, 200)
    cloud = {
        r["node_pattern"]: r for r in rows(RateCard.model_validate(CARD)) if r["cluster"] == "cloud"
    }
    assert cloud["cloud-l40s-*"]["pricing"] == "reserved"
    assert cloud["cloud-l40s-*"]["gpu_hour_rate"] == 1.2
    assert cloud["cloud-mig-*"]["mig_share"] == pytest.approx(3 / 7)
    assert cloud["*"]["kwh_price"] == 0.0  # a cloud price includes its power


def test_glob_patterns_are_anchored_re2() -> None:
    rx = glob_regex("gpu-a100-?.x*")
    assert rx == r"^gpu\-a100\-.\.x.*$"
    assert re.match(rx, "gpu-a100-1.x-rack2") and not re.match(rx, "xgpu-a100-1.x")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"environment": "onprem", "gpu_model": "H100", "kwh_price": 0.1}, "capital"),
        (
            {
                "environment": "onprem",
                "gpu_model": "H100",
                "capital": {"H100": {"price": 1, "years": 1}},
            },
            "kwh_price",
        ),
        (
            {"environment": "cloud", "gpu_model": "H100", "cloud": {"H100": {"reserved": 1.0}}},
            "on_demand",
        ),
        ({"environment": "cloud", "nodes": [{"pattern": "*"}]}, "no gpu_model"),
        ({"environment": "cloud", "mig_profile": "big"}, "MIG profile"),
        ({"environment": "cloud", "egress_per_gib": {"cloud": 1.0}}, "from->to"),
        ({"environment": "cloud", "pue": 0.5}, "pue"),
    ],
)
def test_bad_cards_say_what_is_wrong(change: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        validate_card({"clusters": {"c": change}}, "test")


def test_mig_share_by_compute_slices() -> None:
    assert mig_share_of("1g.10gb") == pytest.approx(1 / 7)
    assert mig_share_of("7g.80gb") == 1.0


def test_the_example_card_prices_every_gpu_of_the_demo() -> None:
    card = CostSettings(rate_card_file=EXAMPLE).card()
    assert card is not None
    by_cluster: dict[str, list[dict[str, object]]] = {}
    for r in rows(card):
        by_cluster.setdefault(str(r["cluster"]), []).append(r)
    estate = sim_estate.build(load("demo"))
    assert estate.devices()
    for d in estate.devices():
        rule = next(r for r in by_cluster[d.cluster] if re.match(str(r["node_regex"]), d.node))
        assert str(rule["gpu_model"]).split("-")[0] in d.model, (d.node, d.model)
        if d.is_mig:
            assert d.mig_profile is not None
            assert rule["mig_share"] == pytest.approx(mig_share_of(d.mig_profile))


def test_configuration_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert configured_card() == (None, "")
    monkeypatch.setenv("GPUGAP_COST_RATE_CARD", json.dumps(CARD))
    card, source = configured_card()
    assert card == RateCard.model_validate(CARD) and source == "GPUGAP_COST_RATE_CARD"
    monkeypatch.setenv("GPUGAP_COST_RATE_CARD_FILE", str(tmp_path / "x.json"))
    with pytest.raises(ConfigError, match="not both"):
        configured_card()
    monkeypatch.delenv("GPUGAP_COST_RATE_CARD")
    with pytest.raises(ConfigError, match="cannot read"):
        configured_card()
    (tmp_path / "x.json").write_text(json.dumps(CARD))
    card, source = configured_card()
    assert card is not None and card.card_id() == RateCard.model_validate(CARD).card_id()
    assert source == f"file {tmp_path / 'x.json'}"
    monkeypatch.setenv("GPUGAP_COST_RATE_CARD", "{not json")
    monkeypatch.delenv("GPUGAP_COST_RATE_CARD_FILE")
    with pytest.raises(ConfigError, match="not valid JSON"):
        configured_card()
