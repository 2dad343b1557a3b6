"""The endpoint's users: who may ask, with which password, read-only or not, and for the BI
users of one team or one person, their scope (scopes.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator

from gpugap.groundfloor.settings import ClickHouseSettings, read_secret
from gpugap.schemas.errors import ConfigError
from gpugap.warehouse.embedded.scopes import Scope, scope

MAX_SCOPED_USERS = 10_000


@dataclass(frozen=True)
class User:
    name: str
    password: str  # '' = no password
    readonly: bool = False
    scope: Scope | None = None  # a reader of one team's rows, or one person's and their team's


class ScopedUser(BaseModel):
    """One entry of the scoped users' file: a read-only user for a team's (or a person's)
    BI tools. The password inline or, better, in a file of its own."""

    model_config = ConfigDict(extra="forbid")

    name: str
    password: SecretStr | None = None
    password_file: Path | None = None
    team: str
    user: str = ""  # a person: their own jobs and their team's totals; '' = the whole team

    @model_validator(mode="after")
    def _secret(self) -> ScopedUser:
        pw = read_secret(self.password, self.password_file, f"user {self.name}'s password")
        if pw is None or not pw.get_secret_value():
            raise ValueError(f"user {self.name} needs a password (password or password_file)")
        object.__setattr__(self, "password", pw)
        return self


def scoped_users(path: Path) -> list[User]:
    """The users of GPUGAP_CLICKHOUSE_SCOPED_USERS_FILE: ``{"users": [{"name": ..., "team":
    ..., "user": ..., "password_file": ...}]}``; a clear error naming the entry otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the scoped users' file {path}: {exc}") from None
    entries = data.get("users") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_SCOPED_USERS:
        raise ConfigError(
            f'{path}: expected {{"users": [...]}} with at most {MAX_SCOPED_USERS} entries'
        )
    out = []
    for i, entry in enumerate(entries):
        try:
            parsed = ScopedUser.model_validate(entry)
            fixed = scope(parsed.team, parsed.user)
        except (ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[-1].strip() if isinstance(exc, ValidationError) else exc
            raise ConfigError(f"{path}: users[{i}]: {first}") from None
        assert parsed.password is not None
        out.append(User(parsed.name, parsed.password.get_secret_value(), True, fixed))
    return out


def users_from(settings: ClickHouseSettings) -> Mapping[str, User]:
    """The endpoint's users: the configured one (its password generated where none is set,
    password.py), when its password is set a read-only user for BI tools, and the scoped
    readers of GPUGAP_CLICKHOUSE_SCOPED_USERS_FILE."""
    pw = settings.password.get_secret_value() if settings.password else ""
    users = {settings.user: User(settings.user, pw)}
    if settings.readonly_password is not None:
        name = settings.readonly_user
        users[name] = User(name, settings.readonly_password.get_secret_value(), readonly=True)
    if settings.scoped_users_file is not None:
        for user in scoped_users(settings.scoped_users_file):
            if user.name in users:
                raise ConfigError(
                    f"{settings.scoped_users_file}: user {user.name} is defined twice (the "
                    "admin, the read-only user and each scoped user have names of their own)"
                )
            users[user.name] = user
    return users


def role(user: User) -> str:
    """What a user is to the engine: its row policies and workloads are per role."""
    return "reader" if user.readonly else "admin"
