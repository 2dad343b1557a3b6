"""``gpugap notify email``: declared here, built from ``sinks.REGISTRY``."""

from gpugap.groundfloor.plugin import Plugin

from .settings import EmailSettings

PLUGIN = Plugin(
    name="email",
    help="a mail per alert opened and resolved (SMTP with STARTTLS and AUTH), to a list "
    "and to the owner",
    extra="all",  # the standard library's smtplib
    target="gpugap.sinks.email.target:EmailTarget",
    settings=EmailSettings,
    kind="notify",
)
