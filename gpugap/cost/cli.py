"""``gpugap cost show|load``: the rate card from GPUGAP_COST_* (or --file), checked and
printed, or written into the warehouse (the sink also writes it when it starts)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpugap.schemas.errors import ConfigError

Cmd = Callable[..., argparse.ArgumentParser]


def register(sub: Any, cmd: Cmd) -> None:
    cost = sub.add_parser("cost", help="the rate card: currency and CO2 on top of GPU-hours")
    cost_sub = cost.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cmd(
        "show",
        _show,
        "check the configured rate card and print it as the views will apply it",
        cost_sub,
    )
    load = cmd(
        "load",
        _load,
        "write the configured rate card into the warehouse: the views apply it from now on",
        cost_sub,
    )
    for p in (show, load):
        p.add_argument("--file", metavar="FILE", help="a YAML or JSON rate card (default: env)")
    load.add_argument("--clickhouse", metavar="URL", help="ClickHouse HTTP URL")


def _card(args: argparse.Namespace) -> tuple[Any, str]:
    from gpugap.groundfloor.ratecard import CostSettings, configured_card

    if args.file:
        settings = CostSettings(rate_card_file=Path(args.file))
        card, source = settings.card(), settings.source() or ""
    else:
        card, source = configured_card()
    if card is None:
        raise ConfigError(
            "no rate card: set GPUGAP_COST_RATE_CARD_FILE (YAML or JSON) or "
            "GPUGAP_COST_RATE_CARD (JSON), or pass --file (docs/cost.md)"
        )
    return card, source


def _show(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.ratecard import RATE_COLUMNS, rate_rows, transfer_rate_rows

    card, source = _card(args)
    now = datetime.now(UTC)
    rules = [
        {k: v for k, v in zip(RATE_COLUMNS, row, strict=True) if k not in ("updated_at",)}
        for row in rate_rows(card, source, now)
    ]
    egress = [
        {"cluster": c, "from_env": f, "to_env": t, "per_gib": p, "currency": cur}
        for c, f, t, p, cur, _ in transfer_rate_rows(card, now)
    ]
    print(json.dumps({"card_id": card.card_id(), "rules": rules, "egress": egress}, indent=2))
    return 0


def _load(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.plugin import require
    from gpugap.groundfloor.ratecard import write_rate_card

    require("gpugap cost load", "clickhouse", ("clickhouse_connect",))
    from gpugap.groundfloor.settings import load
    from gpugap.warehouse.client import as_gpugap_error, connect

    card, source = _card(args)
    settings = load().clickhouse
    if args.clickhouse:
        settings = settings.model_copy(update={"url": args.clickhouse})
    client = connect(settings)  # its errors are already gpugap's, in one line
    try:
        card_id = write_rate_card(client, card, source)
    except Exception as exc:
        raise as_gpugap_error(exc, settings.url) from None
    finally:
        client.close()
    print(f"rate card {card_id} ({len(card.clusters)} clusters) written to {settings.url}")
    return 0
