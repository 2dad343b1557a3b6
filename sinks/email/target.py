"""``gpugap notify email``: a plain-text mail per alert opened and resolved, through an SMTP
server (the standard library's smtplib, in a thread: one connection per mail, every socket
operation bounded by ``GPUGAP_EMAIL_TIMEOUT_S``).

- **Security.** ``starttls`` (port 587: EHLO, STARTTLS verifying the server's certificate and
  name against the system CAs or ``GPUGAP_EMAIL_CAFILE``, EHLO again), ``tls`` (implicit TLS,
  port 465, verified the same way) or ``none`` (a local relay; no AUTH then: the password
  would cross in clear). AUTH (smtplib picks CRAM-MD5, PLAIN or LOGIN) when
  ``GPUGAP_EMAIL_USERNAME`` is set.
- **Recipients.** ``GPUGAP_EMAIL_TO`` always, and ``<owner>@<GPUGAP_EMAIL_OWNER_DOMAIN>`` when
  that is set and the alert's owner is a plain user name (``OWNER_PATTERN``: letters, digits,
  ``._-``, at most 64); an address is never built from anything else. An alert with no
  recipient at all is refused (dead-lettered: "no recipient").
- **Threading.** ``Message-ID`` is derived from the alert id and state (a receiving system can
  dedupe a re-sent mail); the resolve has ``In-Reply-To``/``References`` set to the open's, so
  mail clients show them as one thread. ``Auto-Submitted: auto-generated`` keeps vacation
  responders quiet.
- **Answers.** The final reply (250) is the delivery's code. A refused connection, a timeout
  and 4xx replies (421, 450, 451, 452) are retried with backoff. 5xx replies to the mail
  itself (550 mailbox unavailable, 553, 554; every recipient refused) refuse the alert: it is
  dead-lettered with the code and the next one goes out; recipients refused while others
  took the mail are logged. Problems of the connection rather than of a mail (a login refused
  with 535, no STARTTLS offered, a certificate that does not verify, a 5xx greeting) are
  retried, not refused: they hold the stream back, with a warning at each retry that names
  what to fix, instead of dead-lettering every alert until someone notices; once fixed,
  nothing is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import smtplib
import ssl
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import Any

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.groundfloor.text import clean
from gpugap.schemas import Alert
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.schemas.types import AlertState
from gpugap.sinks.alerting import AlertTarget, Refused
from gpugap.sinks.message import check_template, describe, plain_text

from .settings import EmailSettings

log = logging.getLogger(__name__)

#: an owner that is mailed at the owner domain: a plain user name, dot-separated atoms
OWNER_PATTERN = re.compile(r"(?=.{1,64}\Z)[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DOMAIN_PATTERN = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")
REPLY_MAX = 300


def address(value: str, setting: str) -> tuple[str, str]:
    """``value`` (``a@b`` or ``Name <a@b>``) as (the header form, the envelope address)."""
    name, spec = parseaddr(value)
    if any(c in value for c in "\r\n\0") or not spec:
        raise ConfigError(f"{setting}: {value!r} is not a mail address")
    try:
        addr = Address(display_name=name, addr_spec=spec)
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"{setting}: {value!r} is not a mail address ({exc})") from None
    if not addr.username or not DOMAIN_PATTERN.fullmatch(addr.domain):
        raise ConfigError(f"{setting}: {value!r} is not a mail address (user@domain)")
    if not addr.addr_spec.isascii():
        raise ConfigError(f"{setting}: {value!r}: only ASCII addresses (no SMTPUTF8)")
    return str(addr), addr.addr_spec


def message_id(alert_id: str, state: AlertState, domain: str, minutes: int = 0) -> str:
    """The same Message-ID for the same alert state (a reminder: and idle minutes), every
    time it is sent."""
    digest = hashlib.sha256(alert_id.encode()).hexdigest()[:32]
    part = f"{state.value}-{minutes}" if state is AlertState.UPDATE else state.value
    return f"<gpugap.{part}.{digest}@{domain}>"


def header_text(value: str) -> str:
    """Text from records as a header's value that no Python this project supports turns into
    another header: the email package decodes RFC 2047 encoded words (``=?utf-8?q?...?=``) in
    a value and, before 3.11.10/3.12.5 (CVE-2024-6923), wrote a CR LF one decoded to as is,
    starting a header of the sender's choosing (``Reply-To:``). So no value holds ``=?``: a
    space goes between (what it says stays readable), and no control character at all."""
    one_line = " ".join(value.split())
    return one_line.replace("=?", "= ?")


def _reply(code: int, text: bytes | str) -> str:
    said = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return f"{code} {clean(said, REPLY_MAX)}"


class EmailTarget(AlertTarget):
    """Each alert's open and resolve as a mail (the module's documentation)."""

    @staticmethod
    def mails_owner(owner: str) -> bool:
        """Whether an owner's name is a plain user name, the only kind mailed at the domain."""
        return OWNER_PATTERN.fullmatch(owner) is not None

    @staticmethod
    def parse_address(value: str, setting: str) -> tuple[str, str]:
        """A configured address as (header form, envelope address), checked as the sender's
        and GPUGAP_EMAIL_TO's are (the monthly report's team addresses use it)."""
        return address(value, setting)

    name = "email"

    def __init__(self, config: EmailSettings, kafka: KafkaSettings, **batching: Any) -> None:
        if not config.host:
            raise ConfigError("GPUGAP_EMAIL_HOST is not set: the SMTP server to send alerts with")
        if not config.to and not config.owner_domain:
            raise ConfigError(
                "no recipients: set GPUGAP_EMAIL_TO (always mailed, e.g. an on-call list) "
                "and/or GPUGAP_EMAIL_OWNER_DOMAIN (each alert's owner at that domain)"
            )
        if config.owner_domain and not DOMAIN_PATTERN.fullmatch(config.owner_domain):
            raise ConfigError(f"GPUGAP_EMAIL_OWNER_DOMAIN={config.owner_domain!r} is not a domain")
        if config.username and config.password is None:
            raise ConfigError(
                "GPUGAP_EMAIL_USERNAME is set without GPUGAP_EMAIL_PASSWORD (or _PASSWORD_FILE)"
            )
        if config.username and config.security == "none":
            raise ConfigError(
                "GPUGAP_EMAIL_SECURITY=none with GPUGAP_EMAIL_USERNAME would send the password "
                "in clear: use starttls or tls"
            )
        check_template(config.evidence_url, "GPUGAP_EMAIL_EVIDENCE_URL")
        self.sender, self.envelope_sender = address(config.sender, "GPUGAP_EMAIL_SENDER")
        self.to = [address(a, "GPUGAP_EMAIL_TO") for a in config.to]
        self.domain = self.envelope_sender.rpartition("@")[2]
        self._tls: ssl.SSLContext | None = None
        if config.security != "none":
            try:
                self._tls = ssl.create_default_context(
                    cafile=str(config.cafile) if config.cafile else None
                )
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"GPUGAP_EMAIL_CAFILE={config.cafile}: not a PEM CA bundle ({exc})"
                ) from None
        super().__init__(config, kafka, **batching)
        self.settings = config

    # --- the mail ---------------------------------------------------------------------------

    def recipients(self, alert: Alert) -> list[tuple[str, str]]:
        """(header form, envelope address) of everyone this alert is mailed to."""
        out = list(self.to)
        owner = alert.owner or ""
        if self.settings.owner_domain and self.mails_owner(owner):
            spec = f"{owner}@{self.settings.owner_domain}"
            out.append((spec, spec))
        seen: set[str] = set()
        unique = []
        for header, spec in out:
            if spec.lower() not in seen:
                seen.add(spec.lower())
                unique.append((header, spec))
        return unique

    def compose(self, alert: Alert, to: list[tuple[str, str]]) -> EmailMessage:
        m = describe(alert, self.settings.evidence_url)
        msg = EmailMessage()
        msg["Subject"] = header_text(m.title)
        msg["From"] = self.sender
        msg["To"] = ", ".join(header for header, _ in to)
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = message_id(alert.alert_id, alert.state, self.domain, alert.idle_minutes)
        if alert.state is not AlertState.OPEN:  # the resolve and reminders thread under it
            opened = message_id(alert.alert_id, AlertState.OPEN, self.domain)
            msg["In-Reply-To"] = opened
            msg["References"] = opened
        msg["Auto-Submitted"] = "auto-generated"
        msg.set_content(plain_text(m))
        return msg

    # --- sending ----------------------------------------------------------------------------

    async def send(self, alert: Alert) -> int | None:
        to = self.recipients(alert)
        if not to:
            raise Refused(
                f"no recipient: GPUGAP_EMAIL_TO is empty and the owner "
                f"{clean(alert.owner) or '(none)'!r} is not a plain user name to mail at "
                f"{self.settings.owner_domain}"
            )
        msg = self.compose(alert, to)
        return await asyncio.to_thread(self._deliver, msg, [spec for _, spec in to])

    def _connect(self) -> smtplib.SMTP:
        """An SMTP connection, secured and logged in; RetriableError when it cannot be had."""
        s = self.settings
        assert s.host is not None
        where = f"the SMTP server {s.host}:{s.port}"
        step = "connecting"
        smtp: smtplib.SMTP | None = None
        try:
            if s.security == "tls":
                smtp = smtplib.SMTP_SSL(s.host, s.port, timeout=s.timeout_s, context=self._tls)
            else:
                smtp = smtplib.SMTP(s.host, s.port, timeout=s.timeout_s)
            step = "EHLO"
            smtp.ehlo()
            if s.security == "starttls":
                step = "STARTTLS"
                smtp.starttls(context=self._tls)
                step = "EHLO after STARTTLS"
                smtp.ehlo()
            if s.username:
                assert s.password is not None
                step = f"login as {s.username!r}"
                smtp.login(s.username, s.password.get_secret_value())
            return smtp
        except Exception as exc:
            if smtp is not None:
                smtp.close()
            raise RetriableError(f"{where}, {step}: {_connection_failure(exc)}") from None

    def deliver(self, msg: EmailMessage, to: list[str]) -> int:
        """Send a composed mail (the daily digest uses it too); blocking: call in a thread."""
        return self._deliver(msg, to)

    def _deliver(self, msg: EmailMessage, to: list[str]) -> int:
        smtp = self._connect()
        try:
            refused = smtp.send_message(msg, from_addr=self.envelope_sender, to_addrs=to)
        except smtplib.SMTPRecipientsRefused as exc:  # every recipient
            replies = {r: (c, _reply(c, t)) for r, (c, t) in exc.recipients.items()}
            said = "every recipient refused: " + "; ".join(
                f"{r}: {t}" for r, (_, t) in replies.items()
            )
            codes = [c for c, _ in replies.values()]
            if any(400 <= c < 500 for c in codes):
                raise RetriableError(f"the SMTP server: {said}") from None
            raise Refused(said, next((c for c in codes if 500 <= c < 600), None)) from None
        except smtplib.SMTPResponseException as exc:  # MAIL FROM, DATA
            said = _reply(exc.smtp_code, exc.smtp_error)
            if 500 <= exc.smtp_code < 600:
                raise Refused(f"the SMTP server refused the mail: {said}", exc.smtp_code) from None
            raise RetriableError(f"the SMTP server: {said}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise RetriableError(f"the SMTP server: {_connection_failure(exc)}") from None
        finally:
            _quit(smtp)
        if refused:
            log.warning(
                "email: %s sent, but refused for %s",
                msg["Message-ID"],
                "; ".join(f"{r}: {_reply(c, t)}" for r, (c, t) in refused.items()),
            )
        return 250  # smtplib raises unless DATA was answered 250


def _connection_failure(exc: BaseException) -> str:
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return (
            f"login refused ({_reply(exc.smtp_code, exc.smtp_error)}): check "
            "GPUGAP_EMAIL_USERNAME and GPUGAP_EMAIL_PASSWORD"
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return f"{exc} (GPUGAP_EMAIL_SECURITY, GPUGAP_EMAIL_USERNAME)"
    if isinstance(exc, smtplib.SMTPResponseException):
        return _reply(exc.smtp_code, exc.smtp_error)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate does not verify: {exc.verify_message} (GPUGAP_EMAIL_CAFILE)"
    if isinstance(exc, TimeoutError):
        return "no answer in time (GPUGAP_EMAIL_TIMEOUT_S)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {clean(str(exc), REPLY_MAX)}"


def _quit(smtp: smtplib.SMTP) -> None:
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        smtp.close()
