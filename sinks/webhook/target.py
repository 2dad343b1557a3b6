"""``gpugap notify webhook``: each alert opened and resolved, POSTed as signed JSON to a URL.

The request (version 1)
-----------------------
``POST <GPUGAP_WEBHOOK_URL>`` with the body::

    {"version": 1, "alert": {...}}

``alert`` holds exactly the fields of the ``alerts.v1`` record (``schemas.encode``: fields
that are null are left out; times are ISO 8601 UTC with milliseconds). ``version`` changes
only when this envelope or the meaning of a field changes incompatibly; fields may be added
to ``alert`` within a version, so a receiver ignores fields it does not know.

Headers:

- ``Content-Type: application/json``
- ``X-Gpugap-Event: alert.open`` or ``alert.resolved`` (updates are not sent)
- ``X-Gpugap-Delivery: <alert_id>/<state>``: the idempotency key, the same on every retry
  and re-delivery of this alert state (URL-quoted: characters outside printable ASCII and
  ``/:@!$&'()*+,;=`` appear as ``%XX``). gpugap sends each alert state once (the ledger on
  ``alerts.deliveries.v1``), but a crash between the receiver's answer and the ledger write
  sends it again: a receiver that must not act twice remembers the keys it has seen.
- ``X-Gpugap-Timestamp: <unix seconds>``: when this attempt was made.
- ``X-Gpugap-Signature: sha256=<hex>`` when ``GPUGAP_WEBHOOK_SECRET`` is set: the
  HMAC-SHA256, keyed with the secret, of ``<timestamp>.`` followed by the raw body bytes.

Verifying a request (the receiver's side)::

    import hashlib, hmac, time

    def verify(secret: bytes, headers, body: bytes, tolerance_s: int = 300) -> bool:
        ts = headers.get("X-Gpugap-Timestamp", "")
        if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance_s:
            return False  # too old (or from the future): a replay
        mac = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest("sha256=" + mac, headers.get("X-Gpugap-Signature", ""))

Sign the raw bytes as received (not re-serialised JSON). The timestamp is inside the MAC, so
a captured body replayed with a fresh timestamp fails, and one replayed as it was is refused
once it is older than the tolerance (dedupe on ``X-Gpugap-Delivery`` within it).

Answers: 2xx is delivered; 408, 425, 429 and 5xx, a refused connection or a timeout are
retried with backoff (``Retry-After`` is honoured up to a minute); any other status (3xx
included: redirects are not followed) refuses the alert for good: it is dead-lettered with the
status and the first 300 characters of the answer, and the next alert goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from gpugap import __version__
from gpugap.settings import KafkaSettings
from schemas import Alert, encode
from schemas.errors import ConfigError, RetriableError
from sinks.alerting import AlertTarget, Refused
from sinks.message import clean

from .settings import WebhookSettings

#: the envelope's version (see the module's documentation)
VERSION = 1
#: how much of an answer's body is read and quoted in a refusal
ANSWER_MAX = 300
#: the longest Retry-After honoured before the base's backoff takes over
RETRY_AFTER_MAX_S = 60.0
RETRIABLE = frozenset({408, 425, 429})


def http_url(value: str, setting: str, *, show: bool = True) -> URL:
    """``value`` as an absolute http(s) URL, or a ConfigError naming ``setting`` (and the
    value, unless ``show`` is False: a URL that is a secret)."""
    try:
        url = URL(value)
    except (ValueError, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        shown = f"={value!r}" if show else ""
        raise ConfigError(f"{setting}{shown} is not an http:// or https:// URL")
    return url


def open_session(timeout_s: float) -> aiohttp.ClientSession:
    """The HTTP client of a webhook-like target: one per target, bounded by ``timeout_s`` a
    request, proxies from HTTPS_PROXY/NO_PROXY."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"User-Agent": f"gpugap/{__version__}"},
        trust_env=True,
    )


def _failure(exc: BaseException, timeout_s: float) -> str:
    """What went wrong, never with the URL (aiohttp puts it into some messages)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.strerror or type(exc).__name__}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return type(exc).__name__


async def _head(resp: aiohttp.ClientResponse, size: int) -> bytes:
    """The first ``size`` bytes of the answer's body (an answer is never read whole)."""
    data = b""
    while len(data) < size:
        chunk = await resp.content.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def post(
    session: aiohttp.ClientSession,
    url: URL,
    body: bytes,
    headers: Mapping[str, str],
    *,
    what: str,
    timeout_s: float,
    stop: asyncio.Event,
) -> int:
    """POST ``body``; the status when it is 2xx. RetriableError when the receiver is down,
    slow or overloaded; Refused (with the status and the answer's first characters) when it
    refuses. ``what`` names the receiver in errors and logs, in place of its URL."""
    try:
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            status = resp.status
            answer = clean((await _head(resp, ANSWER_MAX)).decode("utf-8", "replace"), ANSWER_MAX)
            retry_after = resp.headers.get("Retry-After", "")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        # `from None`: the cause's message may hold the URL (a secret for Slack)
        raise RetriableError(f"{what}: {_failure(exc, timeout_s)}") from None
    if 200 <= status < 300:
        return status
    said = f"{what} answered {status}" + (f": {answer}" if answer else "")
    if status in RETRIABLE or status >= 500:
        if retry_after.isdigit():
            # wait as asked (bounded), but never past a stop: the base re-raises then
            wait = min(float(retry_after), RETRY_AFTER_MAX_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            said += f" (Retry-After: {retry_after}s)"
        raise RetriableError(said)
    if 300 <= status < 400:
        said += " (a redirect: not followed, point the setting at the final URL)"
    raise Refused(said, status)


class WebhookTarget(AlertTarget):
    """Each alert's open and resolve as signed, versioned JSON (the module's documentation)."""

    name = "webhook"

    def __init__(self, config: WebhookSettings, kafka: KafkaSettings, **batching: Any) -> None:
        if not config.url:
            raise ConfigError(
                "GPUGAP_WEBHOOK_URL is not set: the URL the webhook target POSTs alerts to"
            )
        # not shown in the error: a webhook URL often carries a token
        self.url = http_url(config.url, "GPUGAP_WEBHOOK_URL", show=False)
        super().__init__(config, kafka, **batching)
        self.settings = config
        self._secret = (
            config.secret.get_secret_value().encode() if config.secret is not None else None
        )
        # named by origin only: a path or query may carry a token
        self._what = f"the webhook at {self.url.origin()}"
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await super().start()  # the ledger first
        await self.open()

    async def open(self) -> None:
        """Open the HTTP session ``send`` uses (``start`` does, after reading the ledger)."""
        if self._http is None:
            self._http = open_session(self.settings.timeout_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def request(self, alert: Alert, timestamp: int) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one attempt at ``alert``."""
        body = b'{"version":%d,"alert":%s}' % (VERSION, encode(alert))
        headers = {
            "Content-Type": "application/json",
            "X-Gpugap-Event": f"alert.{alert.state.value}",
            "X-Gpugap-Delivery": delivery_key(alert),
            "X-Gpugap-Timestamp": str(timestamp),
        }
        if self._secret is not None:
            headers["X-Gpugap-Signature"] = signature(self._secret, timestamp, body)
        return body, headers

    async def send(self, alert: Alert) -> int | None:
        assert self._http is not None, "start() opens the HTTP session"
        body, headers = self.request(alert, int(time.time()))
        return await post(
            self._http,
            self.url,
            body,
            headers,
            what=self._what,
            timeout_s=self.settings.timeout_s,
            stop=self.stop,
        )


def delivery_key(alert: Alert) -> str:
    """``X-Gpugap-Delivery``: ``<alert_id>/<state>``, URL-quoted into a valid header value."""
    return quote(f"{alert.alert_id}/{alert.state.value}", safe="/:@!$&'()*+,;=")


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``X-Gpugap-Signature``: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body>``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()
