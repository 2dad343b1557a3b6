"""Sending the monthly report (``gpugap monthly-report``): through the email target's SMTP
settings and sending path (``GPUGAP_EMAIL_*``, as the daily digest), or, dry, into files.

- **Recipients.** A team at the address ``GPUGAP_MONTHLY_TEAM_ADDRESSES`` names for it (each
  team by its exact name, never a pattern: a team not named is not mailed); a user at
  ``<owner>@<GPUGAP_EMAIL_OWNER_DOMAIN>`` only when the name is a plain user name (the email
  target's rule). Nothing else is mailed.
- **Audit.** Each mail sent adds a row to ``report_sends`` (migration 023) once the SMTP
  server took it: when, who sent it (``--sent-by``, else the OS user), team or user, which,
  the month, the recipient and the Message-ID. A rerun skips what that table says was sent to
  the same recipient for the same month (``--resend`` sends again), so a retried CronJob
  never mails twice.
- **Dry run and other channels.** ``--dry-run DIR`` writes every report as ``.eml`` (the
  mail), ``.html`` with its chart beside it as ``.png`` (for a page or a chat tool), and
  ``.txt``, sends nothing and records nothing; a report without a recipient is written too.
"""

from __future__ import annotations

import getpass
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

from gpugap.groundfloor.settings import env_config, read_part
from gpugap.groundfloor.text import clean
from gpugap.report import monthly_mail
from gpugap.report.monthly import Month, Subject, build
from gpugap.schemas.errors import ConfigError, GpugapError
from gpugap.warehouse.client import connect, run_query

SENT_BY_MAX = 200
TEAMS_MAX = 10_000


class MonthlySettings(BaseSettings):
    """``GPUGAP_MONTHLY_*``."""

    model_config = env_config("GPUGAP_MONTHLY_")

    team_addresses: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        max_length=TEAMS_MAX,
        description="where each team's report goes: team=address,team=address or a JSON "
        'object {"vision": "Vision leads <vision-leads@example.org>"}; exact team names',
    )

    @field_validator("team_addresses", mode="before")
    @classmethod
    def _pairs(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("{"):
            return json.loads(text)
        out: dict[str, str] = {}
        for item in filter(None, (i.strip() for i in text.split(","))):
            team, sep, address = item.partition("=")
            if not sep or not team.strip() or not address.strip():
                raise ValueError(f"{item!r}: expected team=address")
            out[team.strip()] = address.strip()
        return out


def who_sends(given: str | None) -> str:
    """The person (or job) a send is recorded under: ``--sent-by``, else the OS user name; a
    ConfigError when neither is known, so nothing is ever sent by no one."""
    name = given
    if name is None:
        try:
            name = getpass.getuser()
        except (KeyError, OSError, ImportError):  # a uid with no passwd entry, no LOGNAME
            name = ""
    name = clean(name, SENT_BY_MAX)
    if not name:
        raise ConfigError("who sends the reports is not known: pass --sent-by NAME")
    return name


@dataclass
class Outcome:
    sent: list[tuple[str, str, str]] = field(default_factory=list)  # kind, name, recipient
    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def file_stem(s: Subject) -> str:
    """``team-vision-2026-11``; a name that is not safe as a file name gets a hash too."""
    import hashlib

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", s.name)[:48].strip("._-") or "_"
    if slug != s.name:
        slug += "-" + hashlib.sha256(s.name.encode()).hexdigest()[:8]
    return f"{s.kind}-{slug}-{s.month.label}"


def write_files(s: Subject, to: str | None, sender: str, domain: str, folder: Path) -> list[Path]:
    stem = folder / file_stem(s)
    png = stem.with_name(stem.name + ".png")
    paths = [stem.with_name(stem.name + ext) for ext in (".eml", ".html", ".txt")]
    paths[0].write_bytes(monthly_mail.compose(s, sender, to, domain).as_bytes())
    paths[1].write_text(monthly_mail.html(s, png.name))
    paths[2].write_text(monthly_mail.text(s))
    png.write_bytes(monthly_mail.chart(s))
    return [*paths, png]


def already_sent(client: Any, month: Month) -> set[tuple[str, str, str]]:
    rows = run_query(
        client,
        "SELECT DISTINCT kind, subject_of, recipient FROM report_sends WHERE period = {p:String}",
        {"p": month.label},
    ).result_rows
    return {(k, n, r.lower()) for k, n, r in rows}


def record(client: Any, s: Subject, sent_by: str, recipient: str, message_id: str) -> None:
    client.insert(
        "report_sends",
        [[datetime.now(UTC), sent_by, s.kind, s.name, s.month.label, recipient, message_id]],
        column_names=[
            "sent_at", "sent_by", "kind", "subject_of", "period", "recipient", "message_id"
        ],
    )  # fmt: skip


def send_monthly(
    settings: Any,
    month: Month,
    *,
    teams: list[str] | None = None,
    users: bool = False,
    top: int = 5,
    sent_by: str,
    dry_run: Path | None = None,
    resend: bool = False,
) -> Outcome:
    """Build the month's reports and mail (or, dry, write) each; see the module's text."""
    from gpugap.sinks import plugin

    email = plugin("email")  # through the registry, as the digest: never a sink's import
    cfg: Any = email.config()
    email_target = email.load()
    addresses = {
        team: email_target.parse_address(value, f"GPUGAP_MONTHLY_TEAM_ADDRESSES[{team!r}]")
        for team, value in read_part(MonthlySettings).team_addresses.items()
    }
    if (users or dry_run is None) and not cfg.owner_domain:
        raise ConfigError(
            "GPUGAP_EMAIL_OWNER_DOMAIN is not set: users are mailed at <owner>@<domain> "
            "(and the email target needs it to send, as the digest does)"
        )
    sender, envelope = email_target.parse_address(cfg.sender, "GPUGAP_EMAIL_SENDER")
    domain = envelope.rpartition("@")[2]
    target: Any = None if dry_run else email_target(cfg, settings.kafka)
    if dry_run is not None:
        try:
            dry_run.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--dry-run {dry_run}: {exc.strerror or exc}") from None
    out = Outcome()
    client = connect(settings.clickhouse)
    try:
        subjects = build(client, month, teams, users, top)
        done = set() if resend or dry_run else already_sent(client, month)
        for s in subjects:
            name = f"{s.kind} {clean(s.name)}"
            to: tuple[str, str] | None = None
            if s.kind == "team" and s.name in addresses:
                to = addresses[s.name]
            elif s.kind == "user" and email_target.mails_owner(s.name):
                to = (f"{s.name}@{cfg.owner_domain}",) * 2
            if to is None:
                why = (
                    "no address in GPUGAP_MONTHLY_TEAM_ADDRESSES"
                    if s.kind == "team"
                    else "not a plain user name to mail at GPUGAP_EMAIL_OWNER_DOMAIN"
                )
                out.skipped.append(f"{name}: {why}")
            if dry_run is not None:
                out.written += write_files(s, to and to[0], sender, domain, dry_run)
                continue
            if to is None:
                continue
            if (s.kind, s.name, to[1].lower()) in done:
                out.skipped.append(f"{name}: already sent to {to[1]} (--resend sends again)")
                continue
            msg = monthly_mail.compose(s, sender, to[0], domain)
            try:
                target.deliver(msg, [to[1]])
            except GpugapError as exc:  # the others still go out; the run then fails
                out.failed.append(f"{name} to {to[1]}: {exc}")
                continue
            record(client, s, sent_by, to[1], str(msg["Message-ID"]))
            out.sent.append((s.kind, s.name, to[1]))
    finally:
        client.close()
    return out
