"""``gpugap notify webhook``: declared here, built from ``sinks.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .settings import WebhookSettings

PLUGIN = Plugin(
    name="webhook",
    help="the alert record as versioned JSON, HMAC-signed, POSTed to a URL",
    extra="notify",
    target="gpugap.sinks.webhook.target:WebhookTarget",
    settings=WebhookSettings,
    requires=("aiohttp",),
    kind="notify",
)
