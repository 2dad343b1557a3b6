"""What a person reads about an alert, on a phone: one wording for Slack, email and any other
target that writes for people (the webhook sends the record itself).

``describe(alert, evidence_url)`` gives a ``Message``: a title ("GPUs idle: alice on prod"),
a few labelled facts (who, what, how long, GPU-hours wasted, class and scheduler, cluster,
allocation, the worker's detail) and a link (the configured evidence URL with the alert's
fields URL-quoted, else a SQL one-liner for the warehouse). Everything in it is plain text,
already made safe to show:

- **Bounded.** Owner, team, node and gang names come from Kubernetes and Slurm users:
  each is cut to a bound (with "…"), node lists to 10 names and "+N more".
- **Clean.** Control and format characters (newlines, bidi overrides, zero-width marks) are
  replaced by spaces, so a name cannot fake a line of its own or reorder the text, and
  ``://`` in a name becomes ``[:]//`` so no client turns it into a link.
- **Escaped by the format.** A format with markup escapes what it shows: ``mrkdwn()`` for
  Slack (``&``, ``<``, ``>``, and ``@`` so no bare mention is parsed). Email is plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote

from gpugap.groundfloor.text import NAME_MAX, clean, cut, sql_string
from gpugap.schemas import Alert
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.types import AlertKind, AlertState

#: bounds of untrusted values (characters, before any escaping)
TITLE_NAME_MAX = 60
ID_MAX = 200
DETAIL_MAX = 300
#: node names listed in full; the rest are counted
NODES_SHOWN = 10
#: the warehouse view with the latest state of each alert (migrations/004)
ALERTS_VIEW = "v_alerts"


@dataclass(frozen=True, slots=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True, slots=True)
class Link:
    """Where to look: a URL (``is_url``) or a SQL query to paste into ``gpugap sql``."""

    text: str
    is_url: bool


@dataclass(frozen=True, slots=True)
class Message:
    title: str
    #: one line: what happened, for notifications and previews
    summary: str
    facts: tuple[Fact, ...]
    link: Link


# --- making untrusted text safe -------------------------------------------------------------


def mrkdwn(text: str, limit: int = 2000, *, code: bool = False) -> str:
    """Plain text as Slack mrkdwn that shows exactly that text: ``&``, ``<`` and ``>`` as
    entities (no ``<!channel>``, no ``<http://...|link>``), a word joiner after ``@`` (no bare
    ``@here`` on servers that parse those; not in ``code``, where nothing is parsed), at most
    ``limit`` characters after escaping."""
    escapes = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
    if not code:
        escapes["@"] = "@\u2060"
    out: list[str] = []
    size = 0
    for i, ch in enumerate(text):
        piece = escapes.get(ch, ch)
        last = i == len(text) - 1
        if size + len(piece) > limit - (0 if last else 1):
            out.append("…")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


# --- the evidence link ------------------------------------------------------------------------

_FIELDS = ("alert_id", "allocation_id", "cluster")


def check_template(template: str | None, setting: str) -> None:
    """ConfigError unless ``template`` formats with the three fields (and is an http(s) URL)."""
    if template is None:
        return
    try:
        sample = template.format(**dict.fromkeys(_FIELDS, "x"))
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{setting}={template!r} is not a link template: use only "
            f"{{alert_id}}, {{allocation_id}} and {{cluster}} ({type(exc).__name__}: {exc})"
        ) from None
    if not re.match(r"^https?://[^\s/]+", sample):
        raise ConfigError(f"{setting}={template!r} is not an http(s) URL")


def link(alert: Alert, evidence_url: str | None) -> Link:
    """The evidence URL with the alert's fields URL-quoted, else the warehouse query."""
    if evidence_url:
        values = {
            "alert_id": alert.alert_id,
            "allocation_id": alert.allocation_id or "",
            "cluster": alert.cluster,
        }
        return Link(evidence_url.format(**{k: quote(v, safe="") for k, v in values.items()}), True)
    # the value is a literal sql_string() escapes: nothing in it can leave the string
    query = f"SELECT * FROM {ALERTS_VIEW} WHERE alert_id = {sql_string(alert.alert_id)}"  # noqa: S608
    return Link(query, False)


# --- the wording ------------------------------------------------------------------------------


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def duration(delta: timedelta) -> str:
    """``45 min``, ``2 h 05 min``, ``3 d 4 h``."""
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {mins:02d} min"
    return f"{mins} min"


def when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def nodes(names: tuple[str, ...]) -> str:
    """At most ``NODES_SHOWN`` node names, then "+N more"."""
    shown = ", ".join(clean(n) for n in names[:NODES_SHOWN])
    more = len(names) - NODES_SHOWN
    return f"{shown} +{more} more" if more > 0 else shown


def subject(alert: Alert) -> str:
    """Who or what the alert is about: the owner, else the allocation or gang."""
    return clean(
        alert.owner or alert.allocation_id or alert.gang_id or alert.alert_id, TITLE_NAME_MAX
    )


def title(alert: Alert) -> str:
    """``GPUs idle: alice on prod``, ``Partial gang: ...``, ``Resolved: GPUs idle: ...``."""
    what = "GPUs idle" if alert.kind is AlertKind.IDLE_GPU else "Partial gang"
    text = f"{what}: {subject(alert)} on {clean(alert.cluster, TITLE_NAME_MAX)}"
    if alert.state is AlertState.RESOLVED:
        text = f"Resolved: {text}"
    elif alert.state is AlertState.UPDATE:  # a reminder (GPUGAP_IDLE_REMIND_MINUTES)
        text = f"Still, after {alert.idle_minutes} min: {text}"
    return cut(text, 150)


def what(alert: Alert) -> str:
    where = nodes(alert.nodes)
    if alert.kind is AlertKind.IDLE_GPU:
        n = len(alert.gpus)
        text = f"{_plural(n, 'GPU')} idle" if n else "GPUs idle"
        return f"{text} on {_plural(len(alert.nodes), 'node')}: {where}" if where else text
    pending, running = alert.pending_pods or 0, alert.running_pods or 0
    text = (
        f"{pending} of {pending + running} pods pending, {running} running"
        if alert.pending_pods is not None or alert.running_pods is not None
        else "pods of the gang pending"
    )
    if alert.gang_id:
        text += f" (gang {clean(alert.gang_id, NAME_MAX)})"
    if where:
        text += f"; holding GPUs on {where}"
    return text


def how_long(alert: Alert) -> str:
    if alert.state is AlertState.RESOLVED:
        end = alert.resolved_at or alert.time
        same_day = end.date() == alert.opened_at.date()
        until = end.strftime("%H:%M UTC") if same_day else when(end)
        start = alert.opened_at.strftime("%Y-%m-%d %H:%M")
        span = f"opened {start} → resolved {until}"
        if alert.kind is AlertKind.IDLE_GPU and alert.idle_minutes:
            # the alert opens after the idle minutes: its own span understates the waste
            return f"idle for {duration(timedelta(minutes=alert.idle_minutes))}; alert {span}"
        return f"{duration(end - alert.opened_at)}, {span}"
    if alert.kind is AlertKind.IDLE_GPU and alert.idle_minutes:
        return f"idle for {duration(timedelta(minutes=alert.idle_minutes))}, since " + when(
            alert.time - timedelta(minutes=alert.idle_minutes)
        )
    return f"{duration(alert.time - alert.opened_at)}, since {when(alert.opened_at)}"


def facts(alert: Alert) -> tuple[Fact, ...]:
    owner = clean(alert.owner) or "unknown"
    who = f"{owner} (team {clean(alert.team)})" if alert.team else owner
    hours = f"{alert.idle_gpu_hours:.2f} GPU-h"
    wasted = f"{hours} in total" if alert.state is AlertState.RESOLVED else f"{hours} so far"
    klass = alert.workload_class.value if alert.workload_class else "unclassified"
    out = [
        Fact("Who", who),
        Fact("What", what(alert)),
        Fact("How long", how_long(alert)),
        Fact("GPU-hours wasted", wasted),
        Fact("Class / scheduler", f"{klass} / {alert.scheduler.value}"),
        Fact("Cluster", clean(alert.cluster)),
    ]
    if alert.allocation_id:
        out.append(Fact("Allocation", clean(alert.allocation_id, ID_MAX)))
    if alert.message:
        out.append(Fact("Detail", clean(alert.message, DETAIL_MAX)))
    return tuple(out)


def describe(alert: Alert, evidence_url: str | None = None) -> Message:
    """Everything a person reads about ``alert``, as safe plain text."""
    head = title(alert)
    return Message(
        title=head,
        summary=cut(f"{head}: {what(alert)}", 500),
        facts=facts(alert),
        link=link(alert, evidence_url),
    )


def plain_text(message: Message) -> str:
    """The message as a plain-text body (email): the facts one a line, then the link."""
    width = max(len(f.label) for f in message.facts)
    lines = [message.title, ""]
    lines += [f"{f.label + ':':<{width + 1}} {f.value}" for f in message.facts]
    where = "Evidence" if message.link.is_url else "In the warehouse (gpugap sql)"
    lines += ["", f"{where}:", f"  {message.link.text}", ""]
    return "\n".join(lines)
