"""``gpugap produce dcgm``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import DcgmSettings

PLUGIN = Plugin(
    name="dcgm",
    help="scrape dcgm-exporter endpoints (profiling activity, MIG instances)",
    extra="dcgm",
    target="gpugap.producers.dcgm.producer:DcgmProducer",
    settings=DcgmSettings,
    requires=("aiohttp", "prometheus_client"),
    options=(
        Option(
            "--endpoint",
            "endpoints",
            "a dcgm-exporter URL, e.g. http://node-1:9400/metrics (repeat)",
            {"action": "append", "metavar": "URL"},
        ),
    ),
)
