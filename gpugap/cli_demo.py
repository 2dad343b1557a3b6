"""``gpugap demo``'s command line, registered into ``gpugap``'s parser (the run itself is
gpugap/demo.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpugap.demo import DemoOptions, run_demo
from gpugap.schemas.errors import ConfigError


def register(sub: Any, cmd: Any) -> None:
    d = cmd(
        "demo",
        _demo_cmd,
        "the whole pipeline on the embedded defaults: Kafka, ClickHouse, worker, sink and a "
        "replayed scenario, then the capacity-gap report",
    )
    d.add_argument("--scenario", default="demo", help="small, demo (default), scale or a file")
    d.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="stop S seconds after the start (never before the report); default: Ctrl-C",
    )
    d.add_argument(
        "--speed",
        type=float,
        metavar="X",
        help="replay live at X event-time seconds per wall second, the worker running "
        "alongside (default: publish the whole scenario first, then process it)",
    )
    d.add_argument("--kafka", metavar="HOST:PORT", help="use this Kafka instead of starting one")
    d.add_argument("--clickhouse", metavar="URL", help="use this ClickHouse instead")
    d.add_argument("--clickhouse-port", type=int, metavar="PORT", help="port for the endpoint")
    d.add_argument("--truth", metavar="FILE", help="write the scenario's ground truth here")
    d.add_argument("--save-report", metavar="FILE", help="also write the report as JSON")
    d.add_argument("--data-dir", metavar="DIR", help="keep Kafka/ClickHouse data here")
    d.add_argument(
        "--notify",
        action="append",
        metavar="TARGET",
        default=[],
        help="also deliver the alerts: console (print them here), or alertmanager, slack, "
        "webhook, email configured by their GPUGAP_<TARGET>_* settings (repeat)",
    )
    from gpugap.web.cli import register as register_web  # `gpugap web`: the page it opens

    register_web(sub, cmd)


def _demo_cmd(args: Any) -> int:
    from gpugap.groundfloor.plugin import require

    require("gpugap demo", "all", ("faust", "chdb", "aiohttp", "clickhouse_connect"))
    if args.duration is not None and args.duration <= 0:
        raise ConfigError("--duration must be positive seconds")
    if args.speed is not None and args.speed < 0:
        raise ConfigError("--speed must be >= 0 (0: as fast as possible)")
    return run_demo(
        DemoOptions(
            scenario=args.scenario,
            duration_s=args.duration,
            speed=args.speed,
            kafka=args.kafka,
            clickhouse=args.clickhouse,
            clickhouse_port=args.clickhouse_port,
            truth=Path(args.truth) if args.truth else None,
            save_report=Path(args.save_report) if args.save_report else None,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            notify=tuple(args.notify),
        )
    )
