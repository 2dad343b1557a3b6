"""``gpugap notify alertmanager``: declared here, built from ``sinks.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .settings import AlertmanagerSettings

PLUGIN = Plugin(
    name="alertmanager",
    help="idle-GPU and partial-gang alerts to Prometheus Alertmanager (API v2), resolved "
    "when they end",
    extra="notify",
    target="gpugap.sinks.alertmanager.target:AlertmanagerTarget",
    settings=AlertmanagerSettings,
    requires=("aiohttp",),
    kind="notify",
)
