"""A trusted authenticating proxy's word on who asks (oauth2-proxy ``--pass-user-headers``):
taken only from the configured proxy addresses, each named; the same headers from anyone else
are a forgery and refused."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from gpugap.web.signon.roles import Person, person
from gpugap.web.signon.settings import SignOnSettings

MAX_HEADER = 8192


class Forged(Exception):
    """Identity headers from an address that is not a trusted proxy."""


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        return value


def identity(
    settings: SignOnSettings, remote: str | None, headers: Mapping[str, str]
) -> Person | None:
    """The proxy's person; None when the request carries no identity (not signed in)."""
    names = (settings.user_header, settings.fallback_user_header, settings.email_header,
             settings.groups_header)  # fmt: skip
    given = {n: headers.get(n, "") for n in names}
    trusted = {_address(p) for p in settings.trusted_proxies}
    if _address(remote or "") not in trusted:
        if any(given.values()):
            raise Forged(f"identity headers from {remote}, which is not a trusted proxy")
        return None
    user = given[settings.user_header] or given[settings.fallback_user_header]
    if not user:
        return None
    if any(len(v) > MAX_HEADER for v in given.values()):
        raise Forged("an identity header longer than any proxy sends")
    groups = [g.strip() for g in given[settings.groups_header].split(",") if g.strip()]
    return person(settings, user, given[settings.email_header], groups)
