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
from typing import TYPE_CHECKING

from gpugap import __version__
from schemas.errors import FatalError, GpugapError

if TYPE_CHECKING:
    from gpugap.settings import Settings


def _settings() -> Settings:
    from gpugap.settings import load

    settings = load()
    logging.getLogger().setLevel(settings.log_level)
    return settings


def _config_show(args: argparse.Namespace) -> int:
    print(json.dumps(_settings().masked(), indent=2, default=str))
    return 0


def _schemas_export(args: argparse.Namespace) -> int:
    from schemas.export import export

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
    from gpugap.services.clickhouse import users_from
    from gpugap.services.clickhouse.server import serve

    settings = _settings()
    svc = settings.services
    path = Path(args.path) if args.path else svc.clickhouse_path or svc.state_dir / "clickhouse"
    serve(
        path,
        args.host or svc.clickhouse_host,
        args.port or svc.clickhouse_port,
        users_from(settings.clickhouse),
        insecure_no_password=args.insecure_no_password,
    )
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    from sinks.clickhouse.warehouse import migrate

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
    from gpugap.kafka.consume import DeadLetters
    from gpugap.kafka.publish import KafkaPublisher
    from sinks.clickhouse.sink import ClickHouseSink

    settings = _settings()
    sink = ClickHouseSink(
        settings.clickhouse,
        max_records=args.max_records,
        max_age_s=args.max_age,
        idle_policy=settings.idle.policy(),
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sink.stop.set)
        async with KafkaPublisher(settings.kafka) as dlq:
            await sink.run(
                settings.kafka, DeadLetters(dlq, f"sink-{sink.name}", settings.kafka.topic_prefix)
            )

    asyncio.run(run())
    return 0


def _produce(args: argparse.Namespace) -> int:
    from gpugap.kafka.publish import open_publisher
    from producers import by_name, run_producer

    settings = _settings()
    k8s = {"namespaces": args.namespace, "kubeconfig": args.kubeconfig and Path(args.kubeconfig)}
    if any(k8s.values()):  # --namespace/--kubeconfig override GPUGAP_K8S_*
        given = {k: v for k, v in k8s.items() if v}
        settings = settings.model_copy(update={"k8s": settings.k8s.model_copy(update=given)})
    settings = _gpu_overrides(args, settings)
    producer = by_name(args.name)(settings)
    if args.interval is not None:
        producer.interval_s = args.interval
    sent = asyncio.run(
        run_producer(producer, open_publisher(args.out, settings.kafka), once=args.once)
    )
    logging.getLogger("gpugap").info("%s: %d records", args.name, sent)
    return 0


def _gpu_overrides(args: argparse.Namespace, settings: Settings) -> Settings:
    """--endpoint, --allow-no-gpu, --job-mapping-dir, --pod-resources-socket override
    GPUGAP_DCGM_* / GPUGAP_NVML_*."""
    nvml = {
        "allow_no_gpu": args.allow_no_gpu or None,
        "job_mapping_dir": args.job_mapping_dir and Path(args.job_mapping_dir),
        "pod_resources_socket": args.pod_resources_socket and Path(args.pod_resources_socket),
    }
    given = {k: v for k, v in nvml.items() if v}
    if given:
        settings = settings.model_copy(update={"nvml": settings.nvml.model_copy(update=given)})
    if args.endpoint:
        dcgm = settings.dcgm.model_copy(update={"endpoints": args.endpoint})
        settings = settings.model_copy(update={"dcgm": dcgm})
    return settings


def _gpu_options(prod: argparse.ArgumentParser) -> None:
    prod.add_argument(
        "--endpoint",
        action="append",
        metavar="URL",
        help="dcgm: a dcgm-exporter URL, e.g. http://node-1:9400/metrics (repeat)",
    )
    prod.add_argument(
        "--allow-no-gpu", action="store_true", help="nvml: no driver: wait for one, don't fail"
    )
    prod.add_argument(
        "--job-mapping-dir",
        metavar="DIR",
        help="nvml: Slurm job per GPU index (dcgm-exporter's hpc-job-mapping format)",
    )
    prod.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="nvml: kubelet PodResources socket "
        "(default /var/lib/kubelet/pod-resources/kubelet.sock, used when present)",
    )


def build_parser() -> argparse.ArgumentParser:
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
        help="listen beyond loopback although a user has no password: anyone who reaches the "
        "address can then read and change the warehouse",
    )

    db = sub.add_parser("db", help="the warehouse schema")
    db_sub = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    cmd("migrate", _db_migrate, "apply the SQL migrations not applied yet (idempotent)", db_sub)

    sink = cmd(
        "sink",
        _sink,
        "store gpu.minutes, job/pod events, alerts and dead letters "
        "in ClickHouse (commits offsets only after ClickHouse acknowledged)",
    )
    sink.add_argument("name", choices=["clickhouse"])
    sink.add_argument("--max-records", type=int, default=50_000, help="batch size (rows)")
    sink.add_argument("--max-age", type=float, default=1.0, help="batch age limit (seconds)")

    prod = cmd("produce", _produce, "run a producer (publish to Kafka, or --out JSONL)")
    prod.add_argument("name", help="producer name")
    prod.add_argument("--out", metavar="FILE", help="write JSON lines to FILE ('-' = stdout)")
    prod.add_argument("--once", action="store_true", help="one tick, then exit")
    prod.add_argument("--interval", type=float, help="seconds between ticks")
    prod.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="kubernetes: watch this namespace (repeat; default all)",
    )
    prod.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubernetes: kubeconfig (default in-cluster, $KUBECONFIG)",
    )
    _gpu_options(prod)

    from gpugap.cli_sim import register as register_sim  # simulate, record, replay

    register_sim(sub, cmd)
    from gpugap.cli_demo import register as register_demo  # demo

    register_demo(sub, cmd)
    from streams.cli import register as register_streams  # worker

    register_streams(sub, cmd)
    from gpugap.cli_report import register as register_report  # report, sql

    register_report(sub, cmd)
    from producers.slurm.cli import register as register_slurm  # slurm-hook, produce --since

    register_slurm(sub, cmd)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["slurm-hook"]:  # slurmctld runs it per job: no parser, no heavy imports
        from producers.slurm.hook_command import main as slurm_hook

        return slurm_hook(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except GpugapError as exc:
        kind = "error" if isinstance(exc, FatalError) else "error (retry may help)"
        print(f"gpugap: {kind}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
