"""Real receivers for the alert-target tests, run in the test's own event loop: an HTTP server
(aiohttp) that records every request and answers as told, an SMTP server (aiosmtpd) with
STARTTLS or implicit TLS and AUTH that records every mail, a throwaway PKI (the ``openssl``
CLI) and the Kafka scenario every direct target must pass (once per alert state, across
re-deliveries and restarts; refusals dead-lettered while the rest goes on)."""

from __future__ import annotations

import asyncio
import base64
import email
import email.policy
import json
import shutil
import ssl
import subprocess
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiohttp import web
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert, AlertDelivery, DeadLetter, decode
from gpugap.schemas.examples import gpu_uuid, one_of_each
from gpugap.schemas.topics import ALERTS, DEAD_LETTER, DELIVERIES
from gpugap.sinks.alerting import AlertTarget
from tests.harness.topics import read_topic

# --- alerts -----------------------------------------------------------------------------------

EXAMPLE: Alert = one_of_each()["alerts.v1"]  # type: ignore[assignment]


def alert(alert_id: str = EXAMPLE.alert_id, state: str = "open", **fields: Any) -> Alert:
    """The example alert with another id, state or fields (validated like a record)."""
    data = EXAMPLE.model_dump()
    data.update(alert_id=alert_id, state=state, **fields)
    if state == "resolved":
        if data.get("resolved_at") is None:
            data["resolved_at"] = EXAMPLE.time + timedelta(minutes=15)
        data["time"] = data["resolved_at"]
    return Alert.model_validate(data)


def idle_alert(alert_id: str, state: str = "open", **fields: Any) -> Alert:
    return alert(
        alert_id,
        state,
        **{
            "nodes": ("node001",),
            "gpus": (gpu_uuid("node001", 0), gpu_uuid("node001", 1)),
            "team": "vision",
            "workload_class": "batch",
            **fields,
        },
    )


# --- HTTP -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered

    def json(self) -> Any:
        return json.loads(self.body)


Rule = Callable[[Request], "tuple[int, str] | None"]


@dataclass
class HttpReceiver:
    """``async with HttpReceiver() as r``: listens on 127.0.0.1 (``r.url``), records every
    request in ``r.requests``. Answers: the next of ``r.answers`` (``r.answer(429, 200)``),
    else the first ``rules`` match, else 200 "ok"; ``delay_s`` holds every answer back."""

    path: str = "/hook"
    answers: deque[tuple[int, str, dict[str, str]]] = field(default_factory=deque)
    rules: list[Rule] = field(default_factory=list)
    delay_s: float = 0.0
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    def answer(self, *answers: int | tuple[int, str] | tuple[int, str, dict[str, str]]) -> None:
        """The next answers: a status, (status, body) or (status, body, headers)."""
        for a in answers:
            given = (a, "ok" if a < 300 else "error") if isinstance(a, int) else a
            self.answers.append((given[0], given[1], given[2] if len(given) > 2 else {}))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    @property
    def delivered(self) -> list[Request]:
        return [r for r in self.requests if 200 <= r.status < 300]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        seen = Request(request.method, request.path, dict(request.headers), body, 0)
        status, text, headers = 200, "ok", dict[str, str]()
        if self.answers:
            status, text, headers = self.answers.popleft()
        else:
            for rule in self.rules:
                got = rule(seen)
                if got is not None:
                    status, text = got
                    break
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.requests.append(Request(seen.method, seen.path, seen.headers, seen.body, status))
        return web.Response(status=status, text=text, headers=headers)

    async def __aenter__(self) -> HttpReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


# --- TLS --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path  # trust this and the server's certificate verifies
    cert: Path  # the server's: localhost and 127.0.0.1, signed by ca
    key: Path


def make_pki(root: Path) -> Pki:
    """A throwaway CA and a server certificate it signed (EC P-256: quick to make)."""
    exe = shutil.which("openssl")
    assert exe, "the TLS tests need the openssl command"

    def run(*args: str) -> None:
        out = subprocess.run([exe, *args], cwd=root, capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"openssl {args[0]}: {out.stderr[-2000:]}"

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-days", "2", "-subj", "/CN=gpugap test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    run("req", "-new", *ec, "-subj", "/CN=localhost", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (root / "server.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "server.ext",
        "-out", "server.pem")  # fmt: skip
    return Pki(root / "ca.pem", root / "server.pem", root / "server.key")


# --- SMTP -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mail:
    sender: str
    recipients: list[str]
    message: EmailMessage


@dataclass
class SmtpServer:
    """``async with SmtpServer(pki) as s``: aiosmtpd on 127.0.0.1 (``s.port``), STARTTLS
    required (or implicit TLS with ``implicit_tls``) and AUTH (PLAIN/LOGIN) as ``user``.
    Records accepted mails in ``s.mails``; ``refuse_rcpt`` maps an address to the reply its
    RCPT gets, ``data_replies`` are the next answers to DATA (else 250)."""

    pki: Pki
    user: str = "gpugap"
    password: str = "s3cret-pw"
    implicit_tls: bool = False
    refuse_rcpt: dict[str, str] = field(default_factory=dict)
    data_replies: deque[str] = field(default_factory=deque)
    mails: list[Mail] = field(default_factory=list)
    logins: list[tuple[str, bool]] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    # aiosmtpd hooks
    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if address in self.refuse_rcpt:
            return self.refuse_rcpt[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_replies:
            return self.data_replies.popleft()
        assert isinstance(envelope.content, bytes)
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        self.mails.append(Mail(str(envelope.mail_from), list(envelope.rcpt_tos), msg))
        return "250 OK"

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        ok = data.login.decode() == self.user and data.password.decode() == self.password
        self.logins.append((mechanism, ok))
        return AuthResult(success=ok, handled=False)

    async def __aenter__(self) -> SmtpServer:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.pki.cert, self.pki.key)

        def protocol() -> SMTP:
            with warnings.catch_warnings():
                # "AUTH while not requiring TLS": it is TLS, implicitly (aiosmtpd cannot tell)
                warnings.simplefilter("ignore", UserWarning)
                return smtp()

        def smtp() -> SMTP:
            return SMTP(
                self,
                hostname="localhost",
                tls_context=None if self.implicit_tls else ctx,
                require_starttls=not self.implicit_tls,
                auth_required=True,
                # aiosmtpd only knows of STARTTLS; with implicit TLS the whole session is TLS
                auth_require_tls=not self.implicit_tls,
                authenticator=self._authenticate,
                timeout=30,
            )

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            protocol, "127.0.0.1", 0, ssl=ctx if self.implicit_tls else None
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


# --- the ledger scenario ----------------------------------------------------------------------

A, B, C = "idle_gpu/slurm/prod/4242/node001/a", "idle_gpu/slurm/prod/77/node009/b", "idle_gpu/c"


def scenario_alerts(refused_owner: str = "bob") -> list[Alert]:
    """Open A, update A, open B (the receiver refuses it), open C, open A again (Kafka's
    re-delivery), resolve A: a direct target delivers A's open and resolve and C's open."""
    return [
        idle_alert(A),
        idle_alert(A, "update", idle_minutes=45, idle_gpu_hours=1.5),
        idle_alert(B, owner=refused_owner),
        idle_alert(C),
        idle_alert(A),
        idle_alert(A, "resolved", idle_gpu_hours=1.5),
    ]


async def publish(kafka: KafkaSettings, alerts: list[Alert]) -> None:
    async with KafkaPublisher(kafka) as pub:
        for a in alerts:
            await pub.send(ALERTS, a)


async def run_target(
    target: AlertTarget, kafka: KafkaSettings, records: int, group: str, timeout_s: float = 40
) -> DeadLetters:
    """``target.run()`` until it has stored or dead-lettered ``records`` alerts, then stop."""
    async with KafkaPublisher(kafka) as pub:
        dead = DeadLetters(pub, f"notify-{target.name}", kafka.topic_prefix)

        async def until_done() -> None:
            while target.stored + dead.counts["rejected"] < records:
                await asyncio.sleep(0.05)
            target.stop.set()

        watch = asyncio.create_task(until_done())
        try:
            async with asyncio.timeout(timeout_s):
                await target.run(kafka, dead, group=group)
        finally:
            watch.cancel()
    return dead


@dataclass(frozen=True)
class Outcome:
    ledger: list[AlertDelivery]
    dead: list[DeadLetter]


async def ledger_scenario(
    kafka: KafkaSettings, make_target: Callable[[], AlertTarget], sent: Callable[[], int]
) -> tuple[Outcome, Outcome]:
    """Publish ``scenario_alerts`` (B must be refused by the receiver), run a target over them,
    then a new instance in a new consumer group (every alert delivered again, the ledger read
    back). ``sent`` counts the receiver's deliveries: it must not move in the second run."""
    alerts = scenario_alerts()
    await publish(kafka, alerts)
    first = make_target()
    await run_target(first, kafka, len(alerts), "gpugap-notify-test")
    ledger = await read_topic(kafka, DELIVERIES, 4, settle_s=0.3)
    dead = await read_topic(kafka, DEAD_LETTER, 1)
    before = sent()
    again = make_target()
    await run_target(again, kafka, len(alerts), "gpugap-notify-test-restarted")
    assert sent() == before, "a restarted target sent again what its ledger holds"
    assert again.delivered == 0 and again.refused == 0
    ledger2 = await read_topic(kafka, DELIVERIES, 4, settle_s=0.3)
    dead2 = await read_topic(kafka, DEAD_LETTER, 2)
    return Outcome(ledger, dead), Outcome(ledger2, dead2)


def check_scenario(first: Outcome, second: Outcome, target: str, code: int) -> None:
    """What ``ledger_scenario`` must leave: one delivery per alert state sent, B refused with
    ``code`` and dead-lettered (again in the second run, from the ledger, not re-sent)."""
    got = sorted((d.alert_id, d.state.value, d.outcome.value, d.target) for d in first.ledger)
    assert got == sorted(
        [
            (A, "open", "delivered", target),
            (A, "resolved", "delivered", target),
            (B, "open", "refused", target),
            (C, "open", "delivered", target),
        ]
    )
    refused = next(d for d in first.ledger if d.alert_id == B)
    assert refused.code == code
    assert len(second.ledger) == 4, "the restarted target recorded deliveries again"
    assert len(first.dead) == 1 and len(second.dead) == 2  # B again, from the ledger
    for dead in second.dead:
        assert decode(ALERTS, base64.b64decode(dead.value_b64)).alert_id == B
        assert dead.reason.startswith(f"{target}: ") and str(code) in dead.reason
        assert dead.kind.value == "rejected"


@contextmanager
def smtp_capture(tmp_path: Path) -> Iterator[tuple[int, Path, list[Mail]]]:
    """(port, CA file, the mails): the list fills when the block ends."""
    (tmp_path / "pki").mkdir(exist_ok=True)
    pki = make_pki(tmp_path / "pki")
    mails: list[Mail] = []
    ready, done = threading.Event(), threading.Event()
    port: list[int] = []

    def serve() -> None:
        async def run() -> None:
            async with SmtpServer(pki) as server:
                port.append(server.port)
                ready.set()
                while not done.is_set():
                    await asyncio.sleep(0.05)
                mails.extend(server.mails)

        asyncio.run(run())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert ready.wait(10)
        yield port[0], pki.ca, mails
    finally:
        done.set()
        thread.join(10)
