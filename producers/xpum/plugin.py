"""``gpugap produce xpum``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import XpumSettings

PLUGIN = Plugin(
    name="xpum",
    help="scrape Intel XPU Manager exporters (1.x xpum_*, 2.x hw_*): cards or tiles",
    extra="xpum",
    target="gpugap.producers.xpum.producer:XpumProducer",
    settings=XpumSettings,
    requires=("aiohttp", "prometheus_client"),
    options=(
        Option(
            "--endpoint",
            "endpoints",
            "an XPU Manager exporter URL, e.g. http://node-1:29999/metrics (repeat)",
            {"action": "append", "metavar": "URL"},
        ),
        Option(
            "--tiles-as-devices",
            "tiles_as_devices",
            "each tile is a device (FLAT hierarchy); default: a card is one device",
            {"action": "store_true"},
        ),
    ),
)
