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
- ``X-Gpugap-Event: alert.open``, ``alert.resolved``, or ``alert.update`` for a reminder
  (``GPUGAP_IDLE_REMIND_MINUTES``; other updates are not sent)
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

import hashlib
import hmac
import time
from typing import Any
from urllib.parse import quote

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert, encode
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.types import AlertState
from gpugap.sinks.http import HttpTarget, http_url, post

from .settings import WebhookSettings

#: the envelope's version (see the module's documentation)
VERSION = 1


class WebhookTarget(HttpTarget):
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
        self.timeout_s = config.timeout_s

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
    """``X-Gpugap-Delivery``: ``<alert_id>/<state>`` (a reminder: ``.../update/<idle
    minutes>``), URL-quoted into a valid header value."""
    key = f"{alert.alert_id}/{alert.state.value}"
    if alert.state is AlertState.UPDATE:
        key += f"/{alert.idle_minutes}"
    return quote(key, safe="/:@!$&'()*+,;=")


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``X-Gpugap-Signature``: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body>``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()
