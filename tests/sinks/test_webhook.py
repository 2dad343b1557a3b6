"""The webhook target against a real HTTP receiver: the versioned body is the record, the
signature verifies the way its documentation says (and fails with another secret or a
replayed timestamp), the idempotency key, the answers, and once per alert state through
Kafka."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import SecretStr

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import encode
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.services.kafka import free_port
from gpugap.sinks.alerting import Refused
from gpugap.sinks.webhook.settings import WebhookSettings
from gpugap.sinks.webhook.target import WebhookTarget
from tests.sinks.receivers import (
    A,
    B,
    C,
    HttpReceiver,
    check_scenario,
    idle_alert,
    ledger_scenario,
)

SECRET = "whsec-test-3f1b"


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """The receiver's check, as sinks/webhook/target.py documents it."""
    ts = headers.get("X-Gpugap-Timestamp", "")
    if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance_s:
        return False
    mac = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest("sha256=" + mac, headers.get("X-Gpugap-Signature", ""))


def target(url: str, **fields: Any) -> WebhookTarget:
    return WebhookTarget(WebhookSettings(url=url, **fields), KafkaSettings())


def test_needs_an_http_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUGAP_WEBHOOK_URL", raising=False)
    with pytest.raises(ConfigError, match="GPUGAP_WEBHOOK_URL is not set"):
        WebhookTarget(WebhookSettings(), KafkaSettings())
    for bad in ("receiver.example/hook", "ftp://receiver.example/hook", "http:///nohost"):
        with pytest.raises(ConfigError, match="not an http:// or https:// URL"):
            target(bad)


def test_signed_versioned_body_and_idempotency_key() -> None:
    async def scenario() -> None:
        async with HttpReceiver() as r:
            t = target(r.url, secret=SecretStr(SECRET), timeout_s=0.3)
            await t.open()
            try:
                opened, resolved = idle_alert(A), idle_alert(A, "resolved")
                assert await t.send(opened) == 200
                assert await t.send(resolved) == 200
                r.answer(503)
                with pytest.raises(RetriableError):
                    await t.send(resolved)
                assert await t.send(resolved) == 200  # the retry: the same key
            finally:
                await t.close()
        first, second, failed, retried = r.requests
        assert first.method == "POST" and first.path == "/hook"
        assert first.json() == {"version": 1, "alert": json.loads(encode(opened))}
        assert second.json()["alert"]["state"] == "resolved"
        assert first.headers["Content-Type"] == "application/json"
        assert first.headers["X-Gpugap-Event"] == "alert.open"
        assert second.headers["X-Gpugap-Event"] == "alert.resolved"
        assert first.headers["X-Gpugap-Delivery"] == f"{A}/open"
        assert second.headers["X-Gpugap-Delivery"] == f"{A}/resolved"
        assert failed.headers["X-Gpugap-Delivery"] == retried.headers["X-Gpugap-Delivery"]
        assert abs(int(first.headers["X-Gpugap-Timestamp"]) - time.time()) < 60
        for q in r.requests:
            assert q.headers["X-Gpugap-Signature"].startswith("sha256=")
            assert verify(SECRET.encode(), q.headers, q.body)
            assert not verify(b"another-secret", q.headers, q.body)
            assert not verify(SECRET.encode(), q.headers, q.body.replace(b"alice", b"mallory"))
        # a captured request replayed with a fresh timestamp does not verify
        replay = {**first.headers, "X-Gpugap-Timestamp": str(int(time.time()) + 1)}
        assert not verify(SECRET.encode(), replay, first.body)
        # ... nor one replayed as it was once it is older than the tolerance
        assert not verify(SECRET.encode(), first.headers, first.body, tolerance_s=-1)

    asyncio.run(scenario())


def test_unsigned_without_a_secret_and_odd_ids_make_valid_headers() -> None:
    async def scenario() -> None:
        async with HttpReceiver() as r:
            t = target(r.url)
            await t.open()
            try:
                odd = "partial_gang/prod/my gang\r\nX-Evil: 1/é"
                assert await t.send(idle_alert(odd)) == 200
            finally:
                await t.close()
        (q,) = r.requests
        assert "X-Gpugap-Signature" not in q.headers and "X-Evil" not in q.headers
        assert q.headers["X-Gpugap-Delivery"] == (
            "partial_gang/prod/my%20gang%0D%0AX-Evil:%201/%C3%A9/open"
        )
        assert q.json()["alert"]["alert_id"] == odd

    asyncio.run(scenario())


def test_answers() -> None:
    async def scenario() -> None:
        async with HttpReceiver(path="/hook/token-in-path") as r:
            t = target(r.url, timeout_s=0.3)
            await t.open()
            try:
                for status in (200, 201, 202, 204):
                    r.answer(status)
                    assert await t.send(idle_alert(A)) == status
                for status, body in [(400, "bad json"), (401, "no"), (404, "gone"), (410, "")]:
                    r.answer((status, body))
                    with pytest.raises(Refused) as refused:
                        await t.send(idle_alert(A))
                    assert refused.value.code == status
                    assert str(status) in refused.value.reason and body in refused.value.reason
                    assert "token-in-path" not in refused.value.reason
                r.answer((302, "", {"Location": "http://elsewhere.example/"}))
                with pytest.raises(Refused, match="redirect: not followed"):
                    await t.send(idle_alert(A))
                for status in (408, 429, 500, 502, 503, 504):
                    r.answer(status)
                    with pytest.raises(RetriableError, match=f"answered {status}") as down:
                        await t.send(idle_alert(A))
                    assert "token-in-path" not in str(down.value)
                # Retry-After is honoured (bounded), and a stop cuts the wait short
                t.stop.set()
                r.answer((429, "slow down", {"Retry-After": "30"}))
                started = time.monotonic()
                with pytest.raises(RetriableError, match="Retry-After: 30s"):
                    await t.send(idle_alert(A))
                assert time.monotonic() - started < 5
                r.delay_s = 1.0
                with pytest.raises(RetriableError, match=r"no answer within 0\.3s"):
                    await t.send(idle_alert(A))
            finally:
                await t.close()
        gone = target(f"http://127.0.0.1:{free_port()}/hook")
        await gone.open()
        try:
            with pytest.raises(RetriableError, match="cannot connect"):
                await gone.send(idle_alert(A))
        finally:
            await gone.close()

    asyncio.run(scenario())


@pytest.mark.kafka
def test_once_per_alert_state_through_kafka(kafka: KafkaSettings) -> None:
    refused_key = f"{B}/open"

    async def scenario() -> None:
        async with HttpReceiver() as r:
            r.rules.append(
                lambda q: (
                    (404, "unknown hook") if q.headers["X-Gpugap-Delivery"] == refused_key else None
                )
            )
            first, second = await ledger_scenario(
                kafka,
                lambda: WebhookTarget(WebhookSettings(url=r.url, secret=SecretStr(SECRET)), kafka),
                lambda: len(r.delivered),
            )
            check_scenario(first, second, "webhook", 404)
            keys = sorted(q.headers["X-Gpugap-Delivery"] for q in r.delivered)
            assert keys == sorted([f"{A}/open", f"{A}/resolved", f"{quote(C)}/open"])
            assert all(verify(SECRET.encode(), q.headers, q.body) for q in r.requests)
            assert [q.headers["X-Gpugap-Delivery"] for q in r.requests].count(refused_key) == 1

    asyncio.run(scenario())
