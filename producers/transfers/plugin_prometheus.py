"""``gpugap produce transfers-prometheus``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .prometheus_settings import TransfersPrometheusSettings

PLUGIN = Plugin(
    name="transfers-prometheus",
    help="node_exporter interface counters in Prometheus as boundary transfers (transfers.v1)",
    extra="dcgm",  # aiohttp, as the dcgm-exporter scraper
    target="gpugap.producers.transfers.node_exporter:TransfersPrometheus",
    settings=TransfersPrometheusSettings,
    requires=("aiohttp",),
    options=(
        Option("--url", "url", "Prometheus, e.g. http://prometheus:9090", {"metavar": "URL"}),
        Option(
            "--since",
            "since",
            "first interval's start: ISO-8601 or relative (-24h)",
            {"metavar": "TIME"},
        ),
        Option("--until", "until", "end of the range (default now)", {"metavar": "TIME"}),
        Option(
            "--step",
            "step_s",
            "seconds per transfer record (default 60)",
            {"metavar": "S", "type": int},
        ),
    ),
)
