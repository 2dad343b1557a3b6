"""``gpugap digest``: one mail per owner with the day's top idle allocations by absolute waste
(GPU-hours allocated but not used), like the peers' daily emails. Read from the warehouse
(``v_capacity_gap_daily``), sent through the email target's SMTP settings
(``GPUGAP_EMAIL_*``: host, security, login, sender, ``OWNER_DOMAIN``).

Each owner is mailed at ``<owner>@<GPUGAP_EMAIL_OWNER_DOMAIN>`` only when the name is a plain
user name (the email target's rule: never an address built from arbitrary text). A digest's
``Message-ID`` is fixed per owner and day, so a re-run is recognisable as the same mail; run it
once a day (cron, a Kubernetes CronJob) for the day before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas.errors import ConfigError

#: the day's allocations with the most gap, per owner
QUERY = """
SELECT owner, allocation_id, any(cluster) AS cluster, any(workload_class) AS class,
    any(team) AS team, sum(allocated_gpu_h) AS allocated, sum(consumed_gpu_h) AS consumed,
    sum(gap_gpu_h) AS gap
FROM v_capacity_gap_daily
WHERE day = {day:Date} AND owner != '' AND allocation_id != ''
GROUP BY owner, allocation_id
HAVING gap >= {min_gap:Float64}
ORDER BY owner, gap DESC
LIMIT {top:UInt32} BY owner
"""


@dataclass(frozen=True)
class Row:
    owner: str
    allocation_id: str
    cluster: str
    workload_class: str
    team: str
    allocated_gpu_h: float
    consumed_gpu_h: float
    gap_gpu_h: float


def fetch(ch: ClickHouseSettings, day: date, top: int, min_gap_gpu_h: float) -> list[Row]:
    from gpugap.warehouse.client import connect

    client = connect(ch)
    try:
        result = client.query(
            QUERY, parameters={"day": day, "top": top, "min_gap": min_gap_gpu_h}
        ).result_rows
    finally:
        client.close()
    return [Row(*r) for r in result]


def compose(owner: str, rows: list[Row], day: date, sender: str, to: str) -> EmailMessage:
    from gpugap.groundfloor.text import NAME_MAX, clean, sql_string

    total = sum(r.gap_gpu_h for r in rows)
    msg = EmailMessage()
    msg["Subject"] = f"GPU-hours idle on {day.isoformat()}: {total:.1f} in your top allocations"
    msg["From"] = sender
    msg["To"] = to
    msg["Date"] = formatdate(usegmt=True)
    digest = hashlib.sha256(f"{owner}/{day.isoformat()}".encode()).hexdigest()[:32]
    msg["Message-ID"] = f"<gpugap.digest.{digest}@{sender.rpartition('@')[2].strip('>')}>"
    msg["Auto-Submitted"] = "auto-generated"
    lines = [
        f"Allocations of {clean(owner, NAME_MAX)} on {day.isoformat()} (UTC), by GPU-hours "
        "allocated but not used:",
        "",
        f"  {'GPU-h idle':>10}  {'allocated':>9}  {'used':>6}  allocation (class, cluster)",
    ]
    for r in rows:
        used = r.consumed_gpu_h / r.allocated_gpu_h if r.allocated_gpu_h else 0.0
        lines.append(
            f"  {r.gap_gpu_h:>10.2f}  {r.allocated_gpu_h:>9.2f}  {used:>6.0%}  "
            f"{clean(r.allocation_id, 200)} ({clean(r.workload_class, 20) or '-'}, "
            f"{clean(r.cluster, NAME_MAX)})"
        )
    lines += [
        "",
        "Ask for fewer GPUs, release idle sessions, or shorten time limits: the GPUs you hold",
        "idle are GPUs someone else waits for. Per day and node, in the warehouse:",
        # text for a person to paste, never run here; the owner is an escaped literal
        f"  SELECT * FROM v_capacity_gap_daily WHERE day = '{day.isoformat()}'"  # noqa: S608
        f" AND owner = {sql_string(owner)}",
    ]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def send_digests(
    settings: Any, day: date, *, top: int = 5, min_gap_gpu_h: float = 0.5, dry_run: bool = False
) -> list[tuple[str, str]]:
    """Mail each owner their digest; (owner, address) of every mail sent (or, dry, composed).
    Owners whose name is not a plain user name are skipped (never mailed)."""
    from gpugap.sinks import plugin

    email = plugin("email")  # through the registry: the application never imports a sink
    cfg: Any = email.config()
    email_target = email.load()
    if not cfg.owner_domain:
        raise ConfigError("GPUGAP_EMAIL_OWNER_DOMAIN is not set: the digest mails <owner>@<domain>")
    target = email_target(cfg, settings.kafka) if not dry_run else None
    by_owner: dict[str, list[Row]] = {}
    for row in fetch(settings.clickhouse, day, top, min_gap_gpu_h):
        if email_target.mails_owner(row.owner):
            by_owner.setdefault(row.owner, []).append(row)
    sent: list[tuple[str, str]] = []
    for owner, rows in sorted(by_owner.items()):
        address = f"{owner}@{cfg.owner_domain}"
        msg = compose(owner, rows, day, cfg.sender, address)
        if target is None:
            print(msg.as_string())
        else:
            target.deliver(msg, [address])
        sent.append((owner, address))
    return sent
