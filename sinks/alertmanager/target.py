"""``gpugap notify alertmanager``: alerts to Prometheus Alertmanager's API v2, as Prometheus
sends them.

- **Every state, every URL.** Open, update and resolve are each POSTed to ``/api/v2/alerts``
  of every configured URL (an HA set gossips, but Prometheus sends to each member, and so
  do we). One that accepts is enough; the others are named in a warning. None accepting:
  ``RetriableError`` when any was down, timed out, or answered 5xx/429 (the base retries),
  ``Refused`` when all refused the alert (another 4xx; it is dead-lettered and logged).
- **Dedup is Alertmanager's.** Alertmanager identifies an alert by its labels (they carry
  ``alert_id``), so sending a state twice is harmless: the target is not ``direct``.
- **Re-sent while active.** An open alert's ``endsAt`` is 4 re-send intervals ahead, and every
  alert still active (from the delivery ledger and this run) is re-sent every interval, so
  an alert that nobody re-sends any more (gpugap stopped for good) expires by itself, and a
  restarted target re-sends what it had delivered without waiting for a new record.
- **A resolve outlives a hung Alertmanager.** A POST of an active state that got no answer
  (timed out, connection dropped) may still be handled later, after the resolve, and
  Alertmanager's merge keeps its later endsAt: the alert would fire again and end at the
  wrong time. So an accepted resolve of an alert with such a POST behind it is re-posted,
  the same object (the same endsAt), every few seconds until that POST's endsAt has passed
  (4 intervals and the timeout after it); the active state is never re-sent after a resolve.
- **Untrusted text stays data.** Owners, teams and node names come from Kubernetes and
  Slurm: they go into JSON values only (cut at 1,000 characters per label), never into a
  URL or a header. The bearer token is sent in ``Authorization`` and never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, urlsplit

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert, AlertDelivery, Record, utc_now
from gpugap.schemas.clock import parse_utc
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.schemas.models import episode_start
from gpugap.schemas.types import AlertKind, AlertState, format_utc
from gpugap.sinks.alerting import AlertTarget, Refused
from gpugap.sinks.alertmanager.settings import AlertmanagerSettings
from gpugap.sinks.alertmanager.stale import StalePosts

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

ALERTNAMES = {AlertKind.IDLE_GPU: "GpuIdle", AlertKind.PARTIAL_GANG: "GpuPartialGang"}
SEVERITY = "warning"
#: the longest label value sent (Alertmanager has no limit; receivers and people do)
MAX_LABEL = 1000
#: the longest annotation value sent
MAX_ANNOTATION = 4000
#: the characters of the alert's message that lead the summary
MAX_MESSAGE = 500
#: the characters of a name (owner, team, allocation) in the summary
MAX_NAME = 200
#: node names listed in the ``nodes`` annotation before "+N more"
MAX_NODES = 20
#: alerts per POST when re-sending
RESEND_CHUNK = 200
#: statuses worth retrying: Alertmanager (or a proxy before it) is overloaded or timed out
RETRIABLE_STATUS = frozenset({408, 425, 429})
#: the warehouse view the evidence query names (warehouse/migrations/*_views.sql)
ALERTS_VIEW = "v_alerts"


def _clean(text: str, limit: int) -> str:
    """One line, at most ``limit`` characters."""
    return " ".join(text.split())[:limit]


def _sql_string(value: str) -> str:
    """A ClickHouse string literal: backslashes and quotes escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shown(url: str) -> str:
    """A URL fit for a log line: no user info (a password), no query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _gpu_hours(h: float) -> str:
    return f"{h:.2f}" if h < 10 else f"{h:.1f}"


@dataclass(frozen=True)
class _Answer:
    """One Alertmanager's answer to one POST."""

    status: int | None  # None: no answer (down, timed out)
    accepted: bool
    problem: str = ""
    retriable: bool = False
    #: no answer, but the request may have reached Alertmanager (and be handled later)
    pending: bool = False


class AlertmanagerTarget(AlertTarget):
    name = "alertmanager"
    direct = False  # Alertmanager dedupes by labels; every state is sent
    states: ClassVar[frozenset[AlertState]] = frozenset(
        {AlertState.OPEN, AlertState.UPDATE, AlertState.RESOLVED}
    )
    config: AlertmanagerSettings

    def __init__(self, config: AlertmanagerSettings, kafka: KafkaSettings, **batching: Any) -> None:
        if not config.urls:
            raise ConfigError(
                "GPUGAP_ALERTMANAGER_URLS is not set: name the Alertmanager base URLs, e.g. "
                "GPUGAP_ALERTMANAGER_URLS=http://am-0:9093,http://am-1:9093"
            )
        super().__init__(config, kafka, **batching)
        self.config = config
        self.endpoints = [self._endpoint(u) for u in config.urls]
        self._headers = {"Content-Type": "application/json"}
        if config.bearer_token is not None:
            token = config.bearer_token.get_secret_value().strip()
            if not token or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token):
                # never echoed: it is a secret
                raise ConfigError(
                    "the Alertmanager bearer token is empty or holds whitespace or control "
                    "characters (GPUGAP_ALERTMANAGER_BEARER_TOKEN / _FILE)"
                )
            self._headers["Authorization"] = f"Bearer {token}"
        if config.evidence_url is not None:
            try:
                config.evidence_url.format(alert_id="a", allocation_id="b", cluster="c")
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    "GPUGAP_ALERTMANAGER_EVIDENCE_URL: only {alert_id}, {allocation_id} and "
                    f"{{cluster}} may be substituted ({type(exc).__name__}: {exc})"
                ) from exc
        self._session: aiohttp.ClientSession | None = None
        #: alert id -> loop time it was last accepted (delivered or re-sent)
        self._sent_at: dict[str, float] = {}
        #: resolves kept to outlive a POST of the active state left unanswered (stale.py)
        self.stale = StalePosts(config.resend_interval_s, config.timeout_s)
        self._next_check = 0.0
        self.resent = 0

    @staticmethod
    def _endpoint(url: str) -> str:
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ConfigError(f"GPUGAP_ALERTMANAGER_URLS: {_shown(url)!r}: a bad port") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"GPUGAP_ALERTMANAGER_URLS: {_shown(url)!r} is not an http(s) URL with a host"
            )
        if parts.query or parts.fragment:
            raise ConfigError(
                f"GPUGAP_ALERTMANAGER_URLS: {_shown(url)!r}: a base URL has no query or fragment"
            )
        return url.rstrip("/") + "/api/v2/alerts"

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        import aiohttp

        await super().start()  # the ledger: what is active
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
            headers=self._headers,
        )
        # re-send what the ledger says is active at the first chance: Alertmanager may
        # have forgotten it (or let it expire) while gpugap was down
        self._next_check = 0.0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _remember(self, d: AlertDelivery) -> None:
        super()._remember(d)
        if d.state is AlertState.RESOLVED:
            self._sent_at.pop(d.alert_id, None)
            self.stale.resolved(d.alert_id)

    # --- sending --------------------------------------------------------------------------

    async def send(self, alert: Alert) -> int | None:
        aid = alert.alert_id
        payload = [self.alert_object(alert)]
        resolve = alert.state is AlertState.RESOLVED
        prev = self.active.get(aid)
        if prev is not None and self.labels(prev) != payload[0]["labels"]:
            # labels changed (a new owner, say): Alertmanager sees another alert; end the old
            payload.append(self.alert_object(prev, ended=True))
        code = await self._post(
            payload, f"alert {aid} ({alert.state.value})", () if resolve else (aid,)
        )
        now = asyncio.get_running_loop().time()
        self._sent_at[aid] = now
        self.stale.accepted(aid, payload, resolve, now)
        return code

    async def write(self, batch: Sequence[Record]) -> None:
        await super().write(batch)
        await self._resend_due()  # a busy stream must not starve the re-send

    async def idle(self) -> None:
        await self._resend_due()

    async def _resend_due(self) -> None:
        """Re-send every active alert not sent for a re-send interval (never raises: a
        failed re-send is tried again at the next check, the alert's endsAt is 4
        intervals ahead)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        interval = self.config.resend_interval_s
        if now < self._next_check or self._session is None:
            return
        self._next_check = now + min(1.0, interval / 4)
        if not await self._repost_ended(now):
            return
        due = [
            a
            for aid, a in self.active.items()
            if now - self._sent_at.get(aid, float("-inf")) >= interval and self.config.routes(a)
        ]
        for i in range(0, len(due), RESEND_CHUNK):
            chunk = due[i : i + RESEND_CHUNK]
            try:
                await self._post(
                    [self.alert_object(a) for a in chunk],
                    f"re-send of {len(chunk)} alert(s)",
                    [a.alert_id for a in chunk],
                )
            except (RetriableError, Refused) as exc:
                log.warning(
                    "alertmanager: re-send of %d active alert(s) failed: %s", len(chunk), exc
                )
                # try again in a while, not at every poll
                self._next_check = loop.time() + min(interval, 5.0)
                return
            sent = loop.time()
            for a in chunk:
                self._sent_at[a.alert_id] = sent
            self.resent += len(chunk)
            log.debug("alertmanager: re-sent %d active alert(s)", len(chunk))

    async def _repost_ended(self, now: float) -> bool:
        """Re-post the ends that are due (never raises); False when that failed."""
        loop = asyncio.get_running_loop()
        due = self.stale.due(now)
        for i in range(0, len(due), RESEND_CHUNK):
            chunk = due[i : i + RESEND_CHUNK]
            try:
                await self._post([e.obj for e in chunk], f"re-post of {len(chunk)} resolve(s)")
            except (RetriableError, Refused) as exc:
                log.warning(
                    "alertmanager: re-post of %d resolved alert(s) failed: %s", len(chunk), exc
                )
                self._next_check = loop.time() + self.stale.repost_s
                return False
            self.stale.reposted(chunk, loop.time())
            log.debug("alertmanager: re-posted %d resolve(s)", len(chunk))
        return True

    async def _post(
        self, payload: list[dict[str, Any]], what: str, active: Sequence[str] = ()
    ) -> int | None:
        """POST to every URL; the status of one that accepted. Raises RetriableError or
        Refused when none did. ``active``: the ids of the alerts the payload holds active
        (noted when a URL left the POST unanswered: it may handle it later)."""
        assert self._session is not None, "start() first"
        # ASCII: a lone surrogate in a name cannot break the encoding (Go reads it as U+FFFD)
        body = json.dumps(payload).encode()
        results = await asyncio.gather(*(self._post_one(e, body) for e in self.endpoints))
        if active and any(r.pending for r in results):
            self.stale.note_unanswered(active, asyncio.get_running_loop().time())
        ok = [(e, r.status) for e, r in zip(self.endpoints, results, strict=True) if r.accepted]
        failed = [(e, r) for e, r in zip(self.endpoints, results, strict=True) if not r.accepted]
        if ok:
            if failed:
                log.warning(
                    "alertmanager: %s accepted by %s but not by %s",
                    what,
                    ", ".join(_shown(e) for e, _ in ok),
                    "; ".join(f"{_shown(e)} ({r.problem})" for e, r in failed),
                )
            return ok[0][1]
        reasons = "; ".join(f"{_shown(e)}: {r.problem}" for e, r in failed)
        if any(r.retriable for _, r in failed):
            raise RetriableError(f"no Alertmanager accepted the {what}: {reasons}")
        raise Refused(f"every Alertmanager refused the {what}: {reasons}", failed[0][1].status)

    async def _post_one(self, endpoint: str, body: bytes) -> _Answer:
        import aiohttp

        assert self._session is not None
        try:
            async with self._session.post(endpoint, data=body, allow_redirects=False) as r:
                if 200 <= r.status < 300:
                    await r.content.read(65536)  # Alertmanager answers nothing; bounded
                    return _Answer(r.status, True)
                text = _clean((await r.content.read(2000)).decode(errors="replace"), 500)
                problem = f"HTTP {r.status}" + (f": {text}" if text else "")
                retriable = r.status >= 500 or r.status in RETRIABLE_STATUS
                return _Answer(r.status, False, problem, retriable)
        except TimeoutError:
            problem = f"no answer within {self.config.timeout_s:g}s"
            return _Answer(None, False, problem, True, pending=True)
        except aiohttp.ClientError as exc:
            problem = f"{type(exc).__name__}: {_clean(str(exc), 300)}"
            # not connected: nothing was sent; anything else may have reached it
            sent = not isinstance(exc, aiohttp.ClientConnectorError)
            return _Answer(None, False, problem, True, pending=sent)

    # --- the alert object -----------------------------------------------------------------

    def labels(self, alert: Alert) -> dict[str, str]:
        """The labels identifying the alert in Alertmanager; empty ones left out."""
        values = {
            "alertname": ALERTNAMES.get(alert.kind, "Gpugap"),
            "cluster": alert.cluster,
            "scheduler": alert.scheduler.value,
            "allocation": alert.allocation_id or alert.gang_id or "",
            "owner": alert.owner or "",
            "team": alert.team or "",
            "workload_class": alert.workload_class.value if alert.workload_class else "",
            "severity": SEVERITY,
            "alert_id": alert.alert_id,
        }
        return {k: v[:MAX_LABEL] for k, v in values.items() if v}

    def starts_at(self, alert: Alert) -> datetime:
        """When the episode began: the start in an idle alert's id, else when it opened."""
        if alert.kind is AlertKind.IDLE_GPU:
            try:
                start = parse_utc(episode_start(alert))
            except (ValueError, IndexError):
                return alert.opened_at
            if start.tzinfo is not None and start <= alert.opened_at:
                return start.astimezone(UTC)
        return alert.opened_at

    def alert_object(self, alert: Alert, *, ended: bool = False) -> dict[str, Any]:
        """The API v2 ``postableAlert`` for one alert state."""
        now = utc_now()
        starts = min(self.starts_at(alert), now)
        if ended or alert.state is AlertState.RESOLVED:
            ends = now if ended else (alert.resolved_at or alert.time)
            # resolved is over by now, and Alertmanager refuses an end before the start
            ends = max(min(ends, now), starts)
        else:
            ends = now + timedelta(seconds=4 * self.config.resend_interval_s)
        return {
            "labels": self.labels(alert),
            "annotations": self.annotations(alert),
            "startsAt": format_utc(starts),
            "endsAt": format_utc(ends),
        }

    def annotations(self, alert: Alert) -> dict[str, str]:
        nodes = list(alert.nodes[:MAX_NODES])
        if len(alert.nodes) > MAX_NODES:
            nodes.append(f"+{len(alert.nodes) - MAX_NODES} more")
        out = {
            "summary": self.summary(alert),
            "idle_minutes": str(alert.idle_minutes),
            "idle_gpu_hours": f"{alert.idle_gpu_hours:.3f}",
            "gpus": str(len(alert.gpus)),
            "nodes": ", ".join(nodes),
            "evidence": self.evidence(alert),
        }
        if alert.pending_pods is not None:
            out["pending_pods"] = str(alert.pending_pods)
        if alert.running_pods is not None:
            out["running_pods"] = str(alert.running_pods)
        return {k: v[:MAX_ANNOTATION] for k, v in out.items() if v}

    def summary(self, alert: Alert) -> str:
        """One line: who, how many GPUs, how long, the GPU-hours wasted."""
        what = _clean(alert.allocation_id or alert.gang_id or alert.alert_id, MAX_NAME)
        owner = _clean(alert.owner or "", MAX_NAME)
        team = _clean(alert.team or "", MAX_NAME)
        who = ", ".join(x for x in (owner, f"team {team}" if team else "") if x)
        subject = f"{what} ({who})" if who else what
        gpus = len(alert.gpus)
        if alert.kind is AlertKind.PARTIAL_GANG:
            pods = ""
            if alert.running_pods is not None and alert.pending_pods is not None:
                pods = f"{alert.running_pods} pod(s) running, {alert.pending_pods} pending, "
            facts = f"partial gang: {pods}{gpus} GPU(s) held for {alert.idle_minutes} min"
        else:
            facts = f"{gpus} GPU(s) idle for {alert.idle_minutes} min"
        wasted = _gpu_hours(alert.idle_gpu_hours) + " GPU-hours wasted"
        if alert.state is not AlertState.RESOLVED:
            wasted += " so far"
        else:
            facts += " (resolved)"
        line = f"{subject}: {facts}, {wasted}"
        if alert.message.strip():  # the stream's own words first, cut: the facts follow
            line = f"{_clean(alert.message, MAX_MESSAGE)} — {line}"
        return _clean(line, MAX_ANNOTATION)

    def evidence(self, alert: Alert) -> str:
        template = self.config.evidence_url
        if template:
            return template.format(
                alert_id=quote(alert.alert_id, safe=""),
                allocation_id=quote(alert.allocation_id or alert.gang_id or "", safe=""),
                cluster=quote(alert.cluster, safe=""),
            )
        # a query for a person to paste into `gpugap sql`: the id is an escaped literal
        return f"SELECT * FROM {ALERTS_VIEW} WHERE alert_id = {_sql_string(alert.alert_id)}"  # noqa: S608
