"""A signed-in person's role, from their name and groups, each named in the settings: admin
(everything), a team's lead (the team's jobs, people and recommendations), or a user (their own
jobs and their team's totals). Names are compared in the one normal form records are stored in,
so the person ``alice`` is the owner ``alice`` of her jobs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gpugap.schemas.types import normal_text
from gpugap.web.signon.settings import SignOnSettings

MAX_GROUPS = 1000
MAX_NAME = 256


class NoRole(Exception):
    """Signed in, but no role: the message says what an admin can do about it."""


@dataclass(frozen=True)
class Person:
    user: str  # in normal form: the owner of their jobs
    email: str
    groups: tuple[str, ...]
    role: Literal["admin", "lead", "user"]
    team: str = ""  # the lead's or the user's team

    @property
    def scope(self) -> str | None:
        """What the endpoint narrows this person's queries to (X-Gpugap-Scope): none for an
        admin. Built by the endpoint's own code, so both sides agree on its form."""
        if self.role == "admin":
            return None
        from gpugap.warehouse.embedded.scopes import Scope

        return Scope(self.team, self.user if self.role == "user" else "").header()

    def public(self) -> dict[str, object]:
        return {"user": self.user, "email": self.email, "role": self.role, "team": self.team}


def person(settings: SignOnSettings, user: str, email: str, groups: Iterable[str]) -> Person:
    """The role of ``user`` with ``groups``: admin before lead before user; a person in the
    groups of two teams is refused (one scope each: say which team in the IdP)."""
    user = normal_text(user)[:MAX_NAME]
    if not user:
        raise NoRole("the identity provider sent no user name (check the user claim setting)")
    named = tuple(sorted({normal_text(g)[:MAX_NAME] for g in list(groups)[:MAX_GROUPS]} - {""}))
    email = normal_text(email)[:MAX_NAME]
    if user in {normal_text(u) for u in settings.admin_users} or set(named) & {
        normal_text(g) for g in settings.admin_groups
    }:
        return Person(user, email, named, "admin")
    for mapping, role in ((settings.lead_groups, "lead"), (settings.team_groups, "user")):
        teams = sorted({normal_text(t) for g, t in mapping.items() if normal_text(g) in named})
        if len(teams) > 1:
            raise NoRole(
                f"{user} is in the groups of several teams ({', '.join(teams)}) as a "
                f"{role}: gpugap shows one team per person; an admin keeps one of the groups"
            )
        if teams:
            return Person(user, email, named, role, teams[0])  # type: ignore[arg-type]
    raise NoRole(
        f"{user} is signed in but has no role here: an admin adds one of their groups "
        "to GPUGAP_WEB_SIGNON_TEAM_GROUPS, _LEAD_GROUPS or _ADMIN_GROUPS"
    )
