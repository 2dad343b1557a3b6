"""The embedded warehouse: ClickHouse's engine in-process (chDB) behind its HTTP interface."""

from __future__ import annotations

from collections.abc import Mapping

from gpugap.services.clickhouse.server import User
from groundfloor.settings import ClickHouseSettings


def users_from(settings: ClickHouseSettings) -> Mapping[str, User]:
    """The endpoint's users: the configured one (anonymous only while it has no password) and,
    when its password is set, a read-only user for BI tools."""
    pw = settings.password.get_secret_value() if settings.password else ""
    users = {settings.user: User(settings.user, pw)}
    if settings.readonly_password is not None:
        name = settings.readonly_user
        users[name] = User(name, settings.readonly_password.get_secret_value(), readonly=True)
    return users
