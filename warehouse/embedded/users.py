"""The endpoint's users: who may ask, with which password, read-only or not."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpugap.groundfloor.settings import ClickHouseSettings


@dataclass(frozen=True)
class User:
    name: str
    password: str  # '' = no password
    readonly: bool = False


def users_from(settings: ClickHouseSettings) -> Mapping[str, User]:
    """The endpoint's users: the configured one (its password generated where none is set,
    password.py) and, when its password is set, a read-only user for BI tools."""
    pw = settings.password.get_secret_value() if settings.password else ""
    users = {settings.user: User(settings.user, pw)}
    if settings.readonly_password is not None:
        name = settings.readonly_user
        users[name] = User(name, settings.readonly_password.get_secret_value(), readonly=True)
    return users


def role(user: User) -> str:
    """What a user is to the engine: its row policies and workloads are per role."""
    return "reader" if user.readonly else "admin"
