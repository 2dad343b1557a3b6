"""``gpugap notify slack``: declared here, built from ``sinks.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .settings import SlackSettings

PLUGIN = Plugin(
    name="slack",
    help="a message per alert opened and resolved, to a Slack-compatible incoming webhook",
    extra="notify",
    target="gpugap.sinks.slack.target:SlackTarget",
    settings=SlackSettings,
    requires=("aiohttp",),
    kind="notify",
)
