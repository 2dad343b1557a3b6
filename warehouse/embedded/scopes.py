"""Who a reader is to the engine: a scope narrows a reader to one team's rows (a team's lead,
a team's BI user) or to one person's own jobs and their team's totals (a user).

The engine enforces it. Each request's connection carries the scope in its ``log_comment``
marker (``gpugap:<role>:<request id>:<kind>:<team hex>:<owner hex>``, set before ``readonly``,
so a reader cannot change it), and the row policies of engine_config.py read it on every table
of the warehouse's database: ``POLICIES`` names each table and what a scope sees of it. A table
not named there is not protected, so tests/warehouse/test_scopes.py checks that every table the
migrations create is named. A scoped request may read the warehouse's database and the system
tables only (``check_tables``): the row policies are written for that database.

A scope comes from the user (a BI user's fixed scope, GPUGAP_CLICKHOUSE_SCOPED_USERS_FILE) or
from the ``X-Gpugap-Scope`` header (``gpugap web`` sends it for each signed-in person): a header
can only narrow what its user sees, never widen it, so any reader may send it; a scoped user may
send only its own scope.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from gpugap.schemas.types import normal_text
from gpugap.warehouse.embedded.errors import EngineError

HEADER = "X-Gpugap-Scope"
MAX_HEADER = 1024
MAX_NAME = 256

# the marker's fields, as the engine reads them (out of range: '', so an unscoped marker,
# ``gpugap:<role>:<id>``, or none at all, is kind '')
_MARKER = "splitByChar(':', getSetting('log_comment'))"
_KIND = f"{_MARKER}[4]"
_TEAM = f"unhex({_MARKER}[5])"
_OWNER = f"unhex({_MARKER}[6])"

UNSCOPED = f"{_KIND} = ''"
# per-allocation rows with owner and team columns: a team's lead sees the team's, a user their own
OWNED = (
    f"{UNSCOPED} OR ({_KIND} = 'team' AND team = {_TEAM}) "
    f"OR ({_KIND} = 'user' AND team = {_TEAM} AND owner = {_OWNER})"
)
TEAM_TOTALS = f"{UNSCOPED} OR team = {_TEAM}"
# a recommendation names its user (Slurm) or namespace (Kubernetes), not a team: the team's are
# those about its people or its namespaces (a pod's team is its namespace unless labelled)
RECOMMENDATIONS = (  # (the engine's own expressions: nothing from a request)
    f"{UNSCOPED} OR ({_KIND} = 'user' AND user = {_OWNER}) OR ({_KIND} = 'team' AND "  # noqa: S608
    f"(account = {_TEAM} OR namespace = {_TEAM} OR user IN "
    f"(SELECT owner FROM allocations WHERE team = {_TEAM})))"
)
DECISIONS = f"{UNSCOPED} OR id IN (SELECT id FROM recommendations)"  # noqa: S608
EVERYONE = "1"

#: every table of the warehouse's database and what a scoped reader sees of it
POLICIES: dict[str, str] = {
    "gpu_minutes": OWNED,
    "gpu_hours": OWNED,
    "gpu_days": OWNED,
    "allocations": OWNED,
    "alerts": OWNED,
    "alert_deliveries": OWNED,
    "transfers": OWNED,
    "team_days": TEAM_TOTALS,
    "recommendations": RECOMMENDATIONS,
    "recommendation_decisions": DECISIONS,
    # the estate's configuration: the same for everyone
    "idle_policy": EVERYONE,
    "rate_card": EVERYONE,
    "transfer_rate": EVERYONE,
    "schema_migrations": EVERYONE,
    # other teams' allocations by node, raw records, the scheduler's own counts, quotas of
    # every queue, who was sent which report: the operators'
    "node_capacity": UNSCOPED,
    "queue_quotas": UNSCOPED,
    "dead_letters": UNSCOPED,
    "scheduler_gpu_counts": UNSCOPED,
    "report_sends": UNSCOPED,
}


@dataclass(frozen=True)
class Scope:
    team: str
    owner: str = ""  # '' = the whole team (a lead); else that person's jobs and the team's totals

    @property
    def kind(self) -> str:
        return "user" if self.owner else "team"

    def marker(self) -> str:
        """The marker's scope fields (after ``gpugap:<role>:<id>:``)."""
        return f"{self.kind}:{self.team.encode().hex()}:{self.owner.encode().hex()}"

    def header(self) -> str:
        """As ``X-Gpugap-Scope`` says it."""
        fields = {"team": self.team, **({"user": self.owner} if self.owner else {})}
        return urllib.parse.urlencode(fields)


def scope(team: str, owner: str = "") -> Scope:
    """A scope with its names in the one normal form the records' names are stored in."""
    team, owner = normal_text(team), normal_text(owner)
    if not team:
        raise ValueError("a scope names a team")
    if len(team) > MAX_NAME or len(owner) > MAX_NAME:
        raise ValueError(f"a scope's names are at most {MAX_NAME} characters")
    return Scope(team, owner)


def parse_header(value: str) -> Scope:
    """``team=<name>[&user=<name>]`` (URL-encoded), or a clear refusal."""
    if len(value) > MAX_HEADER:
        raise _bad(f"{HEADER} is longer than {MAX_HEADER} characters")
    try:
        fields = urllib.parse.parse_qs(value, strict_parsing=True, max_num_fields=2)
    except ValueError:
        raise _bad(f"{HEADER} is team=<name>[&user=<name>], URL-encoded") from None
    if set(fields) - {"team", "user"} or any(len(v) != 1 for v in fields.values()):
        raise _bad(f"{HEADER} names one team and at most one user, nothing else")
    try:
        return scope(fields.get("team", [""])[0], fields.get("user", [""])[0])
    except ValueError as exc:
        raise _bad(f"{HEADER}: {exc}") from None


def narrowed(fixed: Scope | None, asked: Scope | None) -> Scope | None:
    """The request's scope: the user's own, or what the header asks of an unscoped user."""
    if fixed is None:
        return asked
    if asked is not None and asked != fixed:
        raise EngineError(
            f"Not enough privileges: this user is scoped to team {fixed.team!r}"
            + (f" and user {fixed.owner!r}" if fixed.owner else "")
            + f", and {HEADER} may not name another",
            497,
            "ACCESS_DENIED",
        )
    return fixed


# what a scoped request may name: the warehouse's tables (unqualified or in its database) and
# the system tables; table functions that read other tables by name (merge, loop) are refused
_TABLE = re.compile(r"^\s*TableIdentifier\s+(\S+)", re.MULTILINE)
_BY_NAME = re.compile(r"^\s*Function\s+(merge|loop|viewIfPermitted)\b", re.MULTILINE | re.I)


def check_tables(ast: str, database: str) -> None:
    """Refuse a scoped request that names a table outside ``database`` (and system): the
    row policies are written for that database alone."""
    for name in _TABLE.findall(ast):
        db = name.rpartition(".")[0]
        if db and db.strip("`") not in (database, "system"):
            raise EngineError(
                f"Not enough privileges: a scoped reader reads the database {database!r} "
                f"only, not {name}",
                497,
                "ACCESS_DENIED",
            )
    found = _BY_NAME.search(ast)
    if found:
        raise EngineError(
            f"Not enough privileges: {found.group(1)}() for a scoped reader (it reads tables "
            "by name, past the row policies' database)",
            497,
            "ACCESS_DENIED",
        )


def _bad(message: str) -> EngineError:
    return EngineError(message, 36, "BAD_ARGUMENTS")
