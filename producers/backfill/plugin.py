"""``gpugap backfill SOURCE``: one declaration per history source, found by name.

Like ``producers.REGISTRY``: only these declarations are imported to build the command line;
a source's code and its libraries are imported when it runs.
"""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import BackfillSettings, SlurmBackfillSettings

_PROMETHEUS = (
    Option(
        "--prometheus",
        "prometheus_url",
        "Prometheus, e.g. http://prometheus:9090",
        {"metavar": "URL"},
    ),
    Option(
        "--match",
        "matchers",
        'PromQL label matchers for every selector, e.g. job="dcgm",cluster="hpc"',
        {"metavar": "MATCHERS"},
    ),
)
_RUN = (
    Option(
        "--cluster",
        "cluster",
        "cluster name on the records (default GPUGAP_CLUSTER)",
        {"metavar": "NAME"},
    ),
    Option(
        "--chunk",
        "chunk_s",
        "seconds of history per query (default 3600)",
        {"metavar": "S", "type": int},
    ),
    Option(
        "--concurrency",
        "concurrency",
        "chunks fetched at once (default 4)",
        {"metavar": "N", "type": int},
    ),
    Option(
        "--checkpoint-dir", "checkpoint_dir", "where the checkpoints are kept", {"metavar": "DIR"}
    ),
)

SOURCES: dict[str, Plugin] = {
    "slurm": Plugin(
        name="slurm",
        help="Slurm's accounting (sacct) -> job start/end events on slurm.jobs.v1",
        extra="backfill",
        target="gpugap.producers.backfill.slurm:SlurmHistory",
        settings=SlurmBackfillSettings,
        requires=("aiohttp",),
        kind="backfill",
        options=(
            *_RUN,
            Option("--sacct", "sacct", "the sacct command (default sacct)", {"metavar": "CMD"}),
            Option(
                "--timezone",
                "timezone",
                "the zone of a dump's times that carry no offset (sacct prints local "
                "time): UTC, Europe/Berlin...",
                {"metavar": "TZ"},
            ),
            Option(
                "--requeue-lookback",
                "requeue_lookback_s",
                "seconds before --since sacct is asked for requeued runs (default 30 days)",
                {"metavar": "S", "type": int},
            ),
            *_PROMETHEUS[:1],
            *_PROMETHEUS[1:],
        ),
    ),
    "prometheus": Plugin(
        name="prometheus",
        help="dcgm-exporter history in Prometheus -> node samples on gpu.samples.v1",
        extra="backfill",
        target="gpugap.producers.backfill.telemetry:PrometheusTelemetry",
        settings=BackfillSettings,
        requires=("aiohttp", "prometheus_client"),
        kind="backfill",
        options=(
            *_RUN,
            *_PROMETHEUS,
            Option(
                "--scrape-interval",
                "scrape_interval_s",
                "the exporters' scrape interval in seconds (default 30)",
                {"metavar": "S", "type": float},
            ),
        ),
    ),
    "kubernetes": Plugin(
        name="kubernetes",
        help="kube-state-metrics history in Prometheus -> pod events on k8s.pods.v1",
        extra="backfill",
        target="gpugap.producers.backfill.kube:KubeStateHistory",
        settings=BackfillSettings,
        requires=("aiohttp",),
        kind="backfill",
        options=(*_RUN, *_PROMETHEUS),
    ),
}
