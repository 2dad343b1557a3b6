"""The email target against a real SMTP server (aiosmtpd, STARTTLS or implicit TLS, AUTH):
what arrives (Subject, To, threading headers, body), who is mailed (never an address built
from arbitrary text), the server's replies, and once per alert state through Kafka."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.services.kafka import free_port
from gpugap.sinks.alerting import Refused
from gpugap.sinks.email.settings import EmailSettings
from gpugap.sinks.email.target import EmailTarget, message_id
from tests.sinks.receivers import (
    A,
    Pki,
    SmtpServer,
    check_scenario,
    idle_alert,
    ledger_scenario,
    make_pki,
)

ONCALL = "oncall@example.org"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("smtp-pki"))


@pytest.fixture(autouse=True)
def _no_email_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("HOST", "TO", "OWNER_DOMAIN", "USERNAME", "PASSWORD", "SECURITY", "CAFILE"):
        monkeypatch.delenv(f"GPUGAP_EMAIL_{name}", raising=False)
    yield


def settings(server: SmtpServer | None = None, **fields: Any) -> EmailSettings:
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": server.port if server else free_port(),
        "security": "starttls",
        "cafile": server.pki.ca if server else None,
        "username": server.user if server else None,
        "password": SecretStr(server.password) if server else None,
        "sender": "gpugap <gpugap@example.org>",
        "to": [ONCALL],
        "owner_domain": "example.org",
        "timeout_s": 5.0,
    }
    return EmailSettings(**{**base, **fields})


def target(config: EmailSettings, kafka: KafkaSettings | None = None) -> EmailTarget:
    return EmailTarget(config, kafka or KafkaSettings())


def test_configuration_is_checked(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"host": None}, "GPUGAP_EMAIL_HOST is not set"),
        ({"to": [], "owner_domain": None}, "no recipients: set GPUGAP_EMAIL_TO"),
        ({"owner_domain": "example.org>, evil@x"}, "GPUGAP_EMAIL_OWNER_DOMAIN"),
        ({"owner_domain": "example.org\n"}, "GPUGAP_EMAIL_OWNER_DOMAIN"),
        ({"username": "u", "password": None}, "without GPUGAP_EMAIL_PASSWORD"),
        ({"username": "u", "password": SecretStr("p"), "security": "none"}, "in clear"),
        ({"to": ["not-an-address"]}, "GPUGAP_EMAIL_TO: 'not-an-address'"),
        ({"to": ["a@b.example\r\nBcc: x@y.example"]}, "GPUGAP_EMAIL_TO"),
        ({"sender": "nobody"}, "GPUGAP_EMAIL_SENDER"),
        ({"cafile": tmp_path / "missing.pem"}, "GPUGAP_EMAIL_CAFILE"),
        ({"evidence_url": "https://g/{alert}"}, "GPUGAP_EMAIL_EVIDENCE_URL"),
    ]
    for fields, message in cases:
        with pytest.raises(ConfigError, match=message):
            target(settings(**fields))


def test_recipients_only_plain_owner_names() -> None:
    t = target(settings())
    assert [s for _, s in t.recipients(idle_alert(A, owner="alice"))] == [
        ONCALL,
        "alice@example.org",
    ]
    assert [s for _, s in t.recipients(idle_alert(A, owner="first.last-2_x"))][1] == (
        "first.last-2_x@example.org"
    )
    for owner in (
        "alice@evil.example",
        "alice,bob",
        "a b",
        "<x@y>",
        "../etc",
        ".alice",
        "a..b",
        "x" * 65,
        "eve\r\nBcc: victim@example.com",
        "ålice",
        None,
    ):
        assert [s for _, s in t.recipients(idle_alert(A, owner=owner))] == [ONCALL], owner
    # names are compared in their normal form: a newline or a no-break space at the end is
    # not part of the name (schemas.types.normal_text), and the owner shown is the one mailed
    for owner in ("alice\n", "alice\u00a0", "\u200balice"):
        alert = idle_alert(A, owner=owner)
        assert alert.owner == "alice"
        assert [s for _, s in t.recipients(alert)] == [ONCALL, "alice@example.org"], owner
    # the owner on the list already is mailed once
    t = target(settings(to=["Alice <ALICE@example.org>"]))
    assert [s for _, s in t.recipients(idle_alert(A, owner="alice"))] == ["ALICE@example.org"]


def test_no_recipient_is_refused() -> None:
    t = target(settings(to=[]))
    with pytest.raises(Refused, match="no recipient"):
        asyncio.run(t.send(idle_alert(A, owner="not a user")))


def test_starttls_auth_subject_to_and_threading(pki: Pki) -> None:
    async def scenario() -> SmtpServer:
        async with SmtpServer(pki) as s:
            t = target(settings(s))
            assert await t.send(idle_alert(A)) == 250
            assert await t.send(idle_alert(A, "resolved")) == 250
            return s

    s = asyncio.run(scenario())
    assert [ok for _, ok in s.logins] == [True, True]
    opened, resolved = s.mails
    assert opened.sender == "gpugap@example.org"
    assert opened.recipients == [ONCALL, "alice@example.org"]
    m = opened.message
    assert m["Subject"] == "GPUs idle: alice on prod"
    assert m["From"] == "gpugap <gpugap@example.org>"
    assert m["To"] == f"{ONCALL}, alice@example.org"
    assert m["Message-ID"] == message_id(A, idle_alert(A).state, "example.org")
    assert m["Auto-Submitted"] == "auto-generated"
    assert m["In-Reply-To"] is None and m["Date"]
    assert m.get_content_type() == "text/plain"
    body = m.get_content()
    for line in (
        "Who:               alice (team vision)",
        "What:              2 GPUs idle on 1 node: node001",
        "GPU-hours wasted:  0.50 GPU-h so far",
        "Class / scheduler: batch / slurm",
        f"  SELECT * FROM v_alerts WHERE alert_id = '{A}'",
    ):
        assert line in body.splitlines(), (line, body)
    r = resolved.message
    assert r["Subject"] == "Resolved: GPUs idle: alice on prod"
    assert r["In-Reply-To"] == m["Message-ID"] and r["References"] == m["Message-ID"]
    assert r["Message-ID"] != m["Message-ID"]
    assert "idle for 30 min; alert opened 2026-11-01 00:30 → resolved 01:15 UTC" in r.get_content()


def test_implicit_tls_and_a_hostile_owner(pki: Pki) -> None:
    hostile = "eve\r\nBcc: victim@example.com\r\n\r\nhttp://evil.example"

    async def scenario() -> SmtpServer:
        async with SmtpServer(pki, implicit_tls=True) as s:
            t = target(settings(s, security="tls", evidence_url="https://g.example/a/{alert_id}"))
            assert await t.send(idle_alert(A, owner=hostile)) == 250
            return s

    (mail,) = asyncio.run(scenario()).mails
    assert mail.recipients == [ONCALL]
    assert mail.message["Bcc"] is None
    subject = mail.message["Subject"]
    assert "\n" not in subject and "\r" not in subject and "://" not in subject
    body = mail.message.get_content()
    assert "://evil" not in body and "http[:]//evil.example" in body
    assert "https://g.example/a/idle_gpu%2Fslurm%2Fprod%2F4242%2Fnode001%2Fa" in body


def test_an_owner_of_encoded_words_adds_no_header(pki: Pki) -> None:
    """An owner (a pod annotation is free text) written as an RFC 2047 encoded word holding
    CR LF became a Reply-To header on Python < 3.11.10 / 3.12.5 (CVE-2024-6923)."""
    hostile = "=?utf-8?q?x=0D=0AReply-To:_a@evil.example?="
    mail_bytes = target(settings()).compose(idle_alert(A, owner=hostile), [(ONCALL, ONCALL)])
    head = mail_bytes.as_bytes().split(b"\n\n", 1)[0]
    starts = [line.split(b":", 1)[0].lower() for line in head.splitlines()]
    assert b"reply-to" not in starts, head

    async def scenario() -> SmtpServer:
        async with SmtpServer(pki) as s:
            assert await target(settings(s)).send(idle_alert(A, owner=hostile)) == 250
            return s

    (mail,) = asyncio.run(scenario()).mails
    assert mail.message["Reply-To"] is None
    assert sorted(mail.message.keys()) == sorted(
        ["Subject", "From", "To", "Date", "Message-ID", "Auto-Submitted", "Content-Type",
         "Content-Transfer-Encoding", "MIME-Version"]
    )  # fmt: skip


def test_login_refused_certificate_unverified_and_server_down(pki: Pki) -> None:
    async def scenario() -> SmtpServer:
        async with SmtpServer(pki) as s:
            wrong = target(settings(s, password=SecretStr("wrong")))
            # the login is the connection's problem, not the alert's: retried, not refused
            with pytest.raises(RetriableError, match=r"login as 'gpugap': login refused \(535"):
                await wrong.send(idle_alert(A))
            untrusted = target(settings(s, cafile=None))  # the system CAs: not the test CA
            with pytest.raises(RetriableError, match="certificate does not verify"):
                await untrusted.send(idle_alert(A))
            return s

    s = asyncio.run(scenario())
    assert s.mails == [] and s.logins and not any(ok for _, ok in s.logins)
    down = target(settings())  # nothing listens on its port
    with pytest.raises(RetriableError, match=r"127\.0\.0\.1:\d+, connecting: Connection refused"):
        asyncio.run(down.send(idle_alert(A)))


def test_replies(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> SmtpServer:
        async with SmtpServer(pki) as s:
            t = target(settings(s))
            for reply in ("421 4.3.2 shutting down", "451 4.3.0 try again", "452 4.3.1 full"):
                s.data_replies.append(reply)
                with pytest.raises(RetriableError, match=reply[:3]):
                    await t.send(idle_alert(A))
            for reply in ("554 5.7.1 rejected as spam", "550 5.7.1 policy"):
                s.data_replies.append(reply)
                with pytest.raises(Refused) as refused:
                    await t.send(idle_alert(A))
                assert refused.value.code == int(reply[:3]) and reply[4:] in refused.value.reason
            # every recipient refused: 5xx refuses the alert, 4xx is retried
            s.refuse_rcpt = {
                ONCALL: "550 5.1.1 mailbox unavailable",
                "alice@example.org": "553 5.1.3 bad address",
            }
            with pytest.raises(Refused, match="every recipient refused") as refused:
                await t.send(idle_alert(A))
            assert refused.value.code == 550 and "553" in refused.value.reason
            s.refuse_rcpt = {ONCALL: "450 4.2.1 try later", "alice@example.org": "450 4.2.1"}
            with pytest.raises(RetriableError, match="450"):
                await t.send(idle_alert(A))
            # one refused, the other takes it: delivered, the refusal logged
            s.refuse_rcpt = {"alice@example.org": "550 5.1.1 no such user"}
            with caplog.at_level(logging.WARNING, logger="gpugap.sinks.email.target"):
                assert await t.send(idle_alert(A)) == 250
            assert "alice@example.org: 550" in caplog.text
            return s

    (mail,) = asyncio.run(scenario()).mails
    assert mail.recipients == [ONCALL]


@pytest.mark.kafka
def test_once_per_alert_state_through_kafka(kafka: KafkaSettings, pki: Pki) -> None:
    async def scenario() -> None:
        async with SmtpServer(pki, refuse_rcpt={"bob@example.org": "550 5.1.1 no bob"}) as s:
            first, second = await ledger_scenario(
                kafka, lambda: target(settings(s, to=[]), kafka), lambda: len(s.mails)
            )
            check_scenario(first, second, "email", 550)
            assert sorted(m.message["Subject"] for m in s.mails) == [
                "GPUs idle: alice on prod",
                "GPUs idle: alice on prod",
                "Resolved: GPUs idle: alice on prod",
            ]
            assert all(m.recipients == ["alice@example.org"] for m in s.mails)

    asyncio.run(scenario())
