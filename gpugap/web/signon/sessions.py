"""Signed-in sessions, kept on the server: the browser holds only a random id in an HttpOnly,
SameSite=Lax cookie (signed, so a guessed or altered id is refused before any lookup). Logging
out deletes the session here, so a copy of the cookie replayed afterwards finds nothing. A
session ends at the earlier of its lifetime and its ID token's expiry. Bounded: the oldest
session goes when the limit is reached."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from gpugap.web.signon.roles import Person

COOKIE = "gpugap_session"
LOGIN_COOKIE = "gpugap_login"
LOGIN_TTL_S = 600
MAX_PENDING = 10_000


@dataclass
class Session:
    person: Person
    expires_at: float


@dataclass(frozen=True)
class PendingLogin:
    """A login sent to the provider: what its answer must match."""

    state: str
    nonce: str
    verifier: str  # PKCE
    binding: str  # the browser's login cookie: the answer must come back to that browser
    next_path: str
    expires_at: float


class Sessions:
    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._key = secrets.token_bytes(32)  # per process: sessions live in its memory
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._pending: OrderedDict[str, PendingLogin] = OrderedDict()
        self._lock = threading.Lock()

    # --- cookies
    def _sign(self, value: str) -> str:
        mac = hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()
        return f"{value}.{mac}"

    def _unsign(self, cookie: str | None) -> str | None:
        if not cookie or len(cookie) > 256 or "." not in cookie:
            return None
        value, mac = cookie.rsplit(".", 1)
        good = hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()
        return value if hmac.compare_digest(mac, good) else None

    # --- sessions
    def start(self, person: Person, token_expires_at: float | None) -> tuple[str, float]:
        """A new session: the cookie's value and the session's lifetime in seconds."""
        now = time.time()
        ends = now + self.ttl_s
        if token_expires_at is not None:
            ends = min(ends, token_expires_at)
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[sid] = Session(person, ends)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return self._sign(sid), max(0.0, ends - now)

    def find(self, cookie: str | None) -> Person | None:
        sid = self._unsign(cookie)
        if sid is None:
            return None
        with self._lock:
            found = self._sessions.get(sid)
            if found is None:
                return None
            if found.expires_at <= time.time():
                del self._sessions[sid]
                return None
            return found.person

    def end(self, cookie: str | None) -> None:
        sid = self._unsign(cookie)
        if sid is not None:
            with self._lock:
                self._sessions.pop(sid, None)

    # --- logins under way
    def begin_login(self, next_path: str) -> tuple[PendingLogin, str]:
        """A login's state, nonce and PKCE verifier, kept here; and the browser's cookie."""
        login = PendingLogin(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(48),
            binding=secrets.token_urlsafe(32),
            next_path=next_path,
            expires_at=time.time() + LOGIN_TTL_S,
        )
        with self._lock:
            self._pending[login.state] = login
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return login, self._sign(login.binding)

    def take_login(self, state: str, cookie: str | None) -> PendingLogin | None:
        """The login ``state`` names, once, if this browser began it and it has not expired."""
        binding = self._unsign(cookie)
        with self._lock:
            login = self._pending.pop(state, None) if state else None
        if login is None or binding is None or login.expires_at <= time.time():
            return None
        return login if hmac.compare_digest(login.binding, binding) else None
