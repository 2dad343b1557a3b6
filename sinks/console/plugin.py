"""``gpugap notify console``: declared here, built from ``sinks.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin
from gpugap.groundfloor.settings import env_config
from gpugap.sinks.routing import TargetSettings


class ConsoleSettings(TargetSettings):
    model_config = env_config("GPUGAP_CONSOLE_")


PLUGIN = Plugin(
    name="console",
    help="a line per alert opened and resolved, on standard output (a first look)",
    extra="all",  # nothing beyond the core
    target="gpugap.sinks.console.target:ConsoleTarget",
    settings=ConsoleSettings,
    kind="notify",
)
