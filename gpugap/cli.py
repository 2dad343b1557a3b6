"""``gpugap``: a thin command line over the packages. Each command parses its arguments and
calls one function; errors print one clear line (what to do) and exit non-zero."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugap import __version__
from gpugap.groundfloor import logs
from gpugap.groundfloor.plugin import LOCAL_MODULES, missing_extra, require
from gpugap.schemas.errors import ConfigError, FatalError, GpugapError

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import Settings


def _settings() -> Settings:
    from gpugap.groundfloor.settings import load

    settings = load()
    logging.getLogger().setLevel(settings.log_level)
    return settings


def _config_show(args: argparse.Namespace) -> int:
    from gpugap.groundfloor.settings import read_part
    from gpugap.producers import REGISTRY, plugin
    from gpugap.streams.settings import WorkerSettings

    data = _settings().masked()
    data["worker"] = json.loads(read_part(WorkerSettings).model_dump_json())  # GPUGAP_WORKER_*
    data["producers"] = {}
    for name in REGISTRY:  # each producer's own settings (GPUGAP_NVML_*, GPUGAP_K8S_*...)
        cfg = plugin(name).config()
        if cfg is not None:
            data["producers"][name] = json.loads(cfg.model_dump_json())
    from gpugap.sinks import REGISTRY as SINKS
    from gpugap.sinks import plugin as sink_plugin

    data["sinks"] = {}
    for name in SINKS:  # the alert targets' (GPUGAP_SLACK_*...): secrets masked
        cfg = sink_plugin(name).config()
        if cfg is not None:
            data["sinks"][name] = json.loads(cfg.model_dump_json())
    print(json.dumps(data, indent=2, default=str))
    return 0


def _schemas_export(args: argparse.Namespace) -> int:
    from gpugap.schemas.export import export

    for path in export(Path(args.dir)):
        print(path)
    return 0


def _services(args: argparse.Namespace) -> int:
    from gpugap.services.kafka import LocalKafka, fetch

    settings = _settings().services
    kafka = LocalKafka(settings)
    if args.action == "fetch":
        libs, downloaded = fetch(settings)
        print(f"kafka jars: {libs} ({'downloaded' if downloaded else 'already there'})")
        return 0
    if args.action == "up":
        status, downloaded = kafka.up()
        print(
            f"kafka: running pid={status.pid} bootstrap={status.bootstrap} "
            f"({'jars downloaded' if downloaded else 'no download'})"
        )
        print(f"export GPUGAP_KAFKA_BOOTSTRAP={status.bootstrap}")
        return 0
    if args.action == "down":
        print("kafka: stopped" if kafka.down() else "kafka: was not running")
        return 0
    status = kafka.status()
    if status.running:
        print(
            f"kafka: running pid={status.pid} bootstrap={status.bootstrap} state={status.state_dir}"
        )
        return 0
    print(f"kafka: stopped (state={status.state_dir})")
    return 3


def _clickhouse_serve(args: argparse.Namespace) -> int:
    require("gpugap clickhouse serve", "local", LOCAL_MODULES)
    from gpugap.warehouse.embedded import users_from
    from gpugap.warehouse.embedded.serve import serve

    settings = _settings()
    svc = settings.services
    path = Path(args.path) if args.path else svc.clickhouse_path or svc.state_dir / "clickhouse"
    serve(
        path,
        args.host or svc.clickhouse_host,
        args.port or svc.clickhouse_port,
        users_from(settings.clickhouse),
        insecure_no_password=args.insecure_no_password,
        warehouse=settings.clickhouse.database,
    )
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    if args.cluster:  # print, for a person to review and apply: nothing is connected to
        from gpugap.warehouse.cluster import cluster_statements
        from gpugap.warehouse.migrate import migrations

        for statement in cluster_statements(migrations(), args.cluster):
            print(statement if statement.startswith("--") else statement + ";\n")
        return 0
    require("gpugap db migrate", "clickhouse", ("clickhouse_connect",))
    from gpugap.warehouse.migrate import migrate

    settings = _settings().clickhouse
    applied = migrate(settings)
    for mig in applied:
        print(f"applied {mig.version:03d}_{mig.name}")
    print(
        f"{settings.url} database {settings.database}: "
        f"{len(applied) or 'no'} new migration(s); schema is current"
    )
    return 0


def _sink(args: argparse.Namespace) -> int:
    from gpugap.sinks import plugin

    spec = plugin(args.name)
    cfg = spec.config(args)
    sink_cls = spec.load()  # before the settings: a missing extra is the one thing said
    settings = _settings()
    sink = sink_cls.from_settings(
        settings, cfg, max_records=args.max_records, max_age_s=args.max_age
    )
    _run_sinks(settings, [sink], "sink")
    return 0


def _run_sinks(settings: Settings, sinks: Sequence[Any], kind: str) -> None:
    """Run sinks until SIGTERM/SIGINT, one consumer group each (``gpugap-<kind>-<name>``: a
    slow or broken one never holds back another), sharing one dead-letter publisher."""
    from gpugap.groundfloor.kafka.consume import DeadLetters
    from gpugap.groundfloor.kafka.publish import KafkaPublisher
    from gpugap.groundfloor.kafka.trust import ClusterTrust

    trust = ClusterTrust.from_settings(settings.kafka)  # docs/kafka-trust.md

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: [s.stop.set() for s in sinks])
        prefix = settings.kafka.topic_prefix
        async with KafkaPublisher(settings.kafka) as pub:
            await asyncio.gather(
                *(
                    s.run(
                        settings.kafka,
                        DeadLetters(pub, f"{kind}-{s.name}", prefix, trust),
                        group=f"gpugap-{kind}-{s.name}",
                    )
                    for s in sinks
                )
            )

    asyncio.run(run())


def _notify(args: argparse.Namespace) -> int:
    import os

    from gpugap.sinks import plugin

    names = args.names or [
        n.strip() for n in os.environ.get("GPUGAP_NOTIFY_TARGETS", "").split(",") if n.strip()
    ]
    if not names:
        raise ConfigError(
            "name the alert targets: gpugap notify alertmanager slack ... "
            "(or GPUGAP_NOTIFY_TARGETS=alertmanager,slack)"
        )
    specs = [plugin(n) for n in dict.fromkeys(names)]
    if bad := [s.name for s in specs if s.kind != "notify"]:
        raise ConfigError(f"not alert targets: {', '.join(bad)} (gpugap sink NAME runs a sink)")
    built = [(spec, spec.config(), spec.load()) for spec in specs]
    settings = _settings()
    targets = [cls.from_settings(settings, cfg) for _, cfg, cls in built]
    _run_sinks(settings, targets, "notify")
    return 0


def _produce(args: argparse.Namespace) -> int:
    from gpugap.producers import plugin

    spec = plugin(args.name)
    cfg = spec.config(args)
    producer_cls = spec.load()
    settings = _settings()
    from gpugap.groundfloor.kafka.publish import open_publisher
    from gpugap.producers import run_producer

    producer = producer_cls(settings) if cfg is None else producer_cls(settings, cfg)
    if args.interval is not None:
        producer.interval_s = args.interval
    sent = asyncio.run(
        run_producer(producer, open_publisher(args.out, settings.kafka), once=args.once)
    )
    logging.getLogger("gpugap").info("%s: %d records", args.name, sent)
    return 0


def _plugin_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    registry: dict[str, str],
    common: Callable[[argparse.ArgumentParser], None],
    fn: Callable[[argparse.Namespace], int],
    kind: str,
) -> None:
    """One subcommand per registered plugin of ``kind``, with the common flags and its own."""
    from gpugap.groundfloor.plugin import lookup

    for name in registry:
        spec = lookup(registry, name, "part")
        if spec.kind != kind:
            continue
        sp = sub.add_parser(name, help=spec.help, description=f"{spec.help} (extra: {spec.extra})")
        sp.set_defaults(func=fn, name=name)
        common(sp)
        spec.add_options(sp)


def _produce_options(prod: argparse.ArgumentParser) -> None:
    prod.add_argument("--out", metavar="FILE", help="write JSON lines to FILE ('-' = stdout)")
    prod.add_argument("--once", action="store_true", help="one tick, then exit")
    prod.add_argument("--interval", type=float, help="seconds between ticks")


def _sink_options(sink: argparse.ArgumentParser) -> None:
    sink.add_argument("--max-records", type=int, default=50_000, help="batch size (rows)")
    sink.add_argument("--max-age", type=float, default=1.0, help="batch age limit (seconds)")


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 (one block per command)
    p = argparse.ArgumentParser(
        prog="gpugap", description="Allocated vs consumed GPU-hours across Slurm and Kubernetes."
    )
    p.add_argument("--version", action="version", version=f"gpugap {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(
        name: str,
        fn: Callable[[argparse.Namespace], int],
        help: str,
        parent: argparse._SubParsersAction[argparse.ArgumentParser] = sub,
    ) -> argparse.ArgumentParser:
        sp = parent.add_parser(name, help=help, description=help)
        sp.set_defaults(func=fn)
        return sp

    config = sub.add_parser("config", help="show the effective configuration")
    config_sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    cmd("show", _config_show, "print the effective configuration, secrets masked", config_sub)

    schemas = sub.add_parser("schemas", help="record schemas")
    schemas_sub = schemas.add_subparsers(dest="action", required=True, metavar="ACTION")
    exp = cmd("export", _schemas_export, "write one JSON Schema per topic into DIR", schemas_sub)
    exp.add_argument("dir")

    svc = cmd("services", _services, "start, stop or inspect the local Kafka broker")
    svc.add_argument("action", choices=["up", "down", "status", "fetch"])

    ch = sub.add_parser("clickhouse", help="the embedded ClickHouse endpoint")
    ch_sub = ch.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = cmd(
        "serve",
        _clickhouse_serve,
        "serve ClickHouse's HTTP interface over the in-process engine (chDB)",
        ch_sub,
    )
    serve.add_argument("--path", help="data directory (persistent)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8123)")
    serve.add_argument(
        "--insecure-no-password",
        action="store_true",
        help="serve a user who has no password without one (none is generated): anyone who "
        "reaches the address can then read and change the warehouse",
    )

    db = sub.add_parser("db", help="the warehouse schema")
    db_sub = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    mig = cmd(
        "migrate", _db_migrate, "apply the SQL migrations not applied yet (idempotent)", db_sub
    )
    mig.add_argument(
        "--cluster",
        metavar="NAME",
        help="print every migration for a ClickHouse cluster instead (Replicated tables on each "
        "shard behind Distributed ones, ON CLUSTER), for a person to apply",
    )

    from gpugap.groundfloor.plugin import lookup
    from gpugap.producers import REGISTRY as PRODUCERS
    from gpugap.sinks import REGISTRY as SINKS

    sink = sub.add_parser("sink", help="run a sink: Kafka topics into a store")
    _plugin_commands(
        sink.add_subparsers(dest="name", required=True, metavar="NAME"),
        SINKS,
        _sink_options,
        _sink,
        "sink",
    )
    notify = cmd(
        "notify",
        _notify,
        "deliver idle-GPU and partial-gang alerts to people: Alertmanager, Slack, webhooks, "
        "email (each target configured by its GPUGAP_<TARGET>_* settings)",
    )
    targets = [n for n in SINKS if lookup(SINKS, n, "sink").kind == "notify"]
    notify.add_argument(
        "names",
        nargs="*",
        metavar="TARGET",
        help=f"one or more of: {', '.join(targets)} (default: GPUGAP_NOTIFY_TARGETS)",
    )
    prod = sub.add_parser("produce", help="run a producer (publish to Kafka, or --out JSONL)")
    _plugin_commands(
        prod.add_subparsers(dest="name", required=True, metavar="NAME"),
        PRODUCERS,
        _produce_options,
        _produce,
        "produce",
    )

    from gpugap.cli_sim import register as register_sim  # simulate, record, replay

    register_sim(sub, cmd)
    from gpugap.cli_demo import register as register_demo  # demo, web

    register_demo(sub, cmd)
    from gpugap.streams.cli import register as register_streams  # worker

    register_streams(sub, cmd)
    from gpugap.cli_report import register as register_report  # report, sql

    register_report(sub, cmd)
    from gpugap.cli_job import register as register_job  # job ID

    register_job(sub, cmd)
    from gpugap.cli_monthly import register as register_monthly  # monthly-report

    register_monthly(sub, cmd)
    from gpugap.cost.cli import register as register_cost  # cost show, cost load

    register_cost(sub, cmd)
    from gpugap.recommend.cli import register as register_recommend  # recommend ...

    register_recommend(sub, cmd)
    from gpugap.producers.slurm.cli import register as register_slurm  # slurm-hook, produce --since

    register_slurm(sub, cmd)
    from gpugap.producers.backfill.cli import register as register_backfill  # backfill SOURCE

    register_backfill(sub, cmd)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["slurm-hook"]:  # slurmctld runs it per job: no parser, no heavy imports
        from gpugap.producers.slurm.hook_command import main as slurm_hook

        return slurm_hook(argv[1:])
    args = build_parser().parse_args(argv)
    logs.configure(logging.WARNING)
    try:
        code: int = args.func(args)
    except GpugapError as exc:
        kind = "error" if isinstance(exc, FatalError) else "error (retry may help)"
        print(f"gpugap: {kind}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a command without its own check: still one line
        missing = missing_extra(exc)
        if missing is None:
            raise
        extra, dist = missing
        print(
            f"gpugap: error: gpugap {args.command} needs {dist}, which is not installed: "
            f"pip install 'gpugap[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
