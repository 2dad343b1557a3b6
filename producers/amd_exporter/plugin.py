"""``gpugap produce amd-exporter``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import AmdExporterSettings

PLUGIN = Plugin(
    name="amd-exporter",
    help="scrape AMD Device Metrics Exporter endpoints (Instinct GPUs, compute partitions)",
    extra="amd-exporter",
    target="gpugap.producers.amd_exporter.producer:AmdExporterProducer",
    settings=AmdExporterSettings,
    requires=("aiohttp", "prometheus_client"),
    options=(
        Option(
            "--endpoint",
            "endpoints",
            "an AMD exporter URL, e.g. http://node-1:5000/metrics (repeat)",
            {"action": "append", "metavar": "URL"},
        ),
        Option(
            "--prefix",
            "prefix",
            "the exporters' MetricsFieldPrefix, e.g. amd_ (default: found in each scrape)",
            {"metavar": "PREFIX"},
        ),
    ),
)
