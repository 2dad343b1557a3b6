"""Endpoints of the security suite's own and the helpers that attack them.

Each endpoint is a real ``gpugap clickhouse serve`` child process on a free 127.0.0.1 port,
with small limits (receive timeout, query time, query size) so that the timeouts under test
are quick. The process inherits only the variables in ``_INHERITED`` besides its own settings,
so an attack that reads ``/proc/self/environ`` can never show a secret of this machine.
"""

from __future__ import annotations

import base64
import http.client
import os
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from gpugap.schemas.errors import GpugapError
from gpugap.services.kafka import free_port
from tests.harness.embedded_clickhouse import EmbeddedClickHouse

ADMIN_PASSWORD = "sec-admin-pw-5d0c9e71"
READER_PASSWORD = "sec-reader-pw-a71f4238"
GIB = 1 << 30
RECEIVE_TIMEOUT_S = 2.0
MAX_QUERY_BYTES = 262_144
SERVER_MAX_EXECUTION_TIME_S = 30
SHORT_MAX_EXECUTION_TIME_S = 3
LIMITS = {
    "GPUGAP_CLICKHOUSE_SERVE_RECEIVE_TIMEOUT_S": str(int(RECEIVE_TIMEOUT_S)),
    "GPUGAP_CLICKHOUSE_SERVE_MAX_EXECUTION_TIME_S": str(SERVER_MAX_EXECUTION_TIME_S),
    "GPUGAP_CLICKHOUSE_SERVE_MAX_QUERY_BYTES": str(MAX_QUERY_BYTES),
}
_INHERITED = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONPATH")
_SECRETS = (ADMIN_PASSWORD, READER_PASSWORD)


@dataclass(frozen=True)
class User:
    name: str
    password: str

    @property
    def auth(self) -> tuple[str, str]:
        return (self.name, self.password)

    @property
    def basic(self) -> str:
        token = base64.b64encode(f"{self.name}:{self.password}".encode()).decode()
        return f"Basic {token}"


ADMIN = User("default", ADMIN_PASSWORD)
READER = User("reader", READER_PASSWORD)


def minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: the basics of this one and ``extra``, no more."""
    return {**{k: os.environ[k] for k in _INHERITED if k in os.environ}, **(extra or {})}


def redact(text: str) -> str:
    for secret in _SECRETS:
        text = text.replace(secret, "<PASSWORD>")
    return text


def describe(r: requests.Response | None) -> str:
    """A response in one line for an assertion message (the test passwords blanked out)."""
    if r is None:
        return "no response (timed out or the connection failed)"
    code = r.headers.get("X-ClickHouse-Exception-Code")
    return f"HTTP {r.status_code}, exception code {code}, body {redact(r.text[:240])!r}"


def no_secrets(r: requests.Response) -> None:
    seen = r.text + "".join(f"{k}: {v}" for k, v in r.headers.items())
    clean = not any(s in seen for s in _SECRETS)  # (no secret in pytest's own explanation)
    assert clean, f"the response contains a password: {describe(r)}"


def refused(
    r: requests.Response | None, codes: Collection[int] | None, status: int | None = None
) -> int:
    """Assert a ClickHouse-style error: a status >= 400, X-ClickHouse-Exception-Code among
    ``codes`` (None: any), a body 'Code: N. DB::Exception: ... (version ...)'. Returns N."""
    assert r is not None, describe(r)
    no_secrets(r)
    header = r.headers.get("X-ClickHouse-Exception-Code", "")
    want = "any code" if codes is None else f"code {sorted(codes)}"
    assert r.status_code >= 400 and header.isdigit(), f"expected {want}: {describe(r)}"
    code = int(header)
    assert codes is None or code in codes, f"expected {want}: {describe(r)}"
    assert r.text.startswith(f"Code: {code}. DB::Exception: "), describe(r)
    assert "(version " in r.text, describe(r)
    if status is not None:
        assert r.status_code == status, f"expected HTTP {status}: {describe(r)}"
    return code


@dataclass(frozen=True)
class Way:
    """How a request is sent: by whom, GET or POST, with which URL parameters."""

    who: User
    get: bool = False
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def readonly(self) -> bool:
        return self.who == READER or self.get or self.params.get("readonly", "0") != "0"

    def ask(self, ep: Endpoint, query: str, session: str | None = None) -> requests.Response:
        return ep.ask(query, self.who, get=self.get, params=self.params, session=session)


@dataclass
class Endpoint:
    server: EmbeddedClickHouse

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def log(self) -> Path:
        return self.server.log

    def ask(
        self,
        query: str | None,
        who: User | None = ADMIN,
        *,
        get: bool = False,
        params: Mapping[str, str] | None = None,
        session: str | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 15.0,
    ) -> requests.Response:
        """POST the query as the body (GET: in the URL), or with ``body`` the query in the
        URL and ``body`` as the data."""
        p = dict(params or {})
        if session is not None:
            p["session_id"] = session
        data = body
        if get or body is not None:
            if query is not None:
                p["query"] = query
        else:
            data = (query or "").encode()
        return requests.request(
            "GET" if get else "POST",
            f"{self.url}/",
            params=p,
            data=data,
            auth=who.auth if who else None,
            headers=dict(headers or {}),
            timeout=timeout,
        )

    def ok(self, query: str, who: User = ADMIN, **kw: Any) -> str:
        r = self.ask(query, who, **kw)
        assert r.status_code == 200, f"{redact(query[:120])!r}: {describe(r)}"
        no_secrets(r)
        return r.text

    def timed(
        self, query: str | None, who: User = ADMIN, **kw: Any
    ) -> tuple[float, requests.Response | None]:
        """Seconds the request took and its response (None: it timed out or failed)."""
        started = time.monotonic()
        try:
            r: requests.Response | None = self.ask(query, who, **kw)
        except requests.RequestException:
            r = None
        return time.monotonic() - started, r

    def ping(self) -> float:
        """Seconds /ping takes on a new connection (inf if it fails or takes over 2 s)."""
        started = time.monotonic()
        try:
            r = requests.get(f"{self.url}/ping", timeout=2)
        except requests.RequestException:
            return float("inf")
        return time.monotonic() - started if r.text == "Ok.\n" else float("inf")

    def settle(self, timeout: float = 20.0) -> None:
        """Wait (bounded) until the admin's SELECT 1 answers: an attack that went through on
        the engine may still hold it, and the next test should not pay for that one."""
        with suppress(requests.RequestException):
            self.ask("SELECT 1", timeout=timeout)

    def damage(self, table: str, rows: int = 1) -> str | None:
        """None while ``table`` exists with ``rows`` rows (checked as the admin)."""
        try:
            r = self.ask(f"SELECT count() FROM {table}", timeout=30)
        except requests.RequestException as exc:
            return f"the admin could not read {table}: {exc}"
        if r.status_code != 200:
            return f"table {table} is gone or unreadable: {describe(r)}"
        if r.text != f"{rows}\n":
            return f"table {table} holds {r.text.strip()} rows, not {rows}"
        return None

    def memory(self, field_name: str = "VmHWM") -> int:
        """VmHWM (peak resident set) or VmRSS, in bytes, of the endpoint's process and of its
        engine process, summed (the peaks need not have been at the same time: an upper
        bound)."""
        assert self.server.proc is not None, "the endpoint is not running"
        pid = self.server.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        total = 0
        for process in [str(pid), *children]:
            try:
                status = Path(f"/proc/{process}/status").read_text()
            except OSError:  # the engine process ended meanwhile
                continue
            for line in status.splitlines():
                if line.startswith(f"{field_name}:"):
                    total += int(line.split()[1]) * 1024
        if not total:
            raise AssertionError(f"no {field_name} in /proc/{pid}/status")
        return total

    def engine_pid(self) -> int:
        assert self.server.proc is not None, "the endpoint is not running"
        pid = self.server.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, f"the endpoint has children {children}"
        return int(children[0])

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def poll(check: Callable[[], bool], within: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + within
    while True:
        if check():
            return True
        if time.monotonic() + every > deadline:
            return False
        time.sleep(every)


@dataclass
class Watch:
    peak: int = 0  # the highest VmRSS seen, in bytes
    killed: bool = False

    def __str__(self) -> str:
        killed = " (and the test killed it there)" if self.killed else ""
        return f"the endpoint's peak RSS reached {self.peak >> 20} MiB{killed}"


@contextmanager
def memory_watch(ep: Endpoint, kill_above: int = GIB + GIB // 2) -> Iterator[Watch]:
    """Sample the endpoint's RSS every 10 ms meanwhile; SIGKILL it past ``kill_above``, so that
    an endpoint that does buffer a bomb fails the test instead of exhausting this machine."""
    watch, stop = Watch(), threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                rss = ep.memory("VmRSS")
            except (OSError, AssertionError):  # it is gone
                return
            watch.peak = max(watch.peak, rss)
            if rss > kill_above and ep.server.proc is not None:
                ep.server.proc.kill()
                watch.killed = True
                return
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, name="endpoint-rss-watch", daemon=True)
    sampler.start()
    try:
        yield watch
    finally:
        stop.set()
        sampler.join(5)
    if not watch.killed:
        watch.peak = max(watch.peak, ep.memory("VmHWM"))


# --- raw sockets ----------------------------------------------------------------------------


def request_head(
    method: str, target: str, who: User | None, headers: Mapping[str, str] | None = None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if who is not None:
        lines.append(f"Authorization: {who.basic}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def readable(sock: socket.socket, wait: float = 0.0) -> bool:
    ready, _, _ = select.select([sock], [], [], wait)
    return bool(ready)


def peer_closed(sock: socket.socket, seen: bytearray | None = None) -> bool:
    """Drain what the server sent (the first 4 KiB of it kept in ``seen``); True once it
    closed the connection (EOF or reset)."""
    while readable(sock):
        try:
            data = sock.recv(65536)
        except OSError:
            return True
        if not data:
            return True
        if seen is not None and len(seen) < 4096:
            seen += data[: 4096 - len(seen)]
    return False


def closed_by(sock: socket.socket, deadline: float, seen: bytearray | None = None) -> float | None:
    """Read until the server closes the connection: the monotonic time it did, or None if it
    is still open at ``deadline``."""
    while (left := deadline - time.monotonic()) > 0:
        if readable(sock, min(left, 0.1)) and peer_closed(sock, seen):
            return time.monotonic()
    return None


@dataclass
class Reply:
    status: int
    code: str | None
    body: str


def read_reply(sock: socket.socket, timeout: float) -> Reply | None:
    sock.settimeout(timeout)
    resp = http.client.HTTPResponse(sock)
    try:
        resp.begin()
        body = resp.read(4096).decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        resp.close()
    return Reply(resp.status, resp.getheader("X-ClickHouse-Exception-Code"), body)


@dataclass
class Upload:
    sent: int = 0
    answered_early: bool = False  # the reply came while the body was still being sent
    ping_s: float | None = None  # /ping on another connection, in the middle of the upload
    rss_max: int = 0
    reply: Reply | None = None


def upload(
    ep: Endpoint,
    sock: socket.socket,
    chunks: Iterable[bytes],
    *,
    within: float,
    pause_s: float = 0.0,
    ping_after: int = 1 << 20,
    rss_limit: int = GIB,
) -> Upload:
    """Send ``chunks`` (bounded: until the server answers or closes, ``within`` seconds pass,
    or the server's RSS passes ``rss_limit``), ping once in the middle, then read the reply."""
    up = Upload()
    deadline = time.monotonic() + within
    sock.settimeout(5)
    for chunk in chunks:
        if readable(sock):
            up.answered_early = True
            break
        if time.monotonic() > deadline:
            break
        try:
            sock.sendall(chunk)
        except OSError:  # reset, or the server stopped reading
            up.answered_early = readable(sock, 1.0)
            break
        up.sent += len(chunk)
        up.rss_max = max(up.rss_max, ep.memory("VmRSS"))
        if up.rss_max > rss_limit:
            break
        if up.ping_s is None and up.sent >= ping_after:
            up.ping_s = ep.ping()
        if pause_s:
            time.sleep(pause_s)
    if up.ping_s is None:
        up.ping_s = ep.ping()
    if readable(sock, 5.0):
        up.reply = read_reply(sock, 5.0)
    return up


def chunked(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """HTTP/1.1 chunked framing (without the final empty chunk: the uploads never end)."""
    for chunk in chunks:
        yield f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"


# --- endpoints --------------------------------------------------------------------------------


@contextmanager
def running(
    root: Path, limits: Mapping[str, str] | None = None, flags: Iterable[str] = ()
) -> Iterator[Endpoint]:
    env = minimal_env(
        {
            "GPUGAP_CLICKHOUSE_PASSWORD": ADMIN_PASSWORD,
            "GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PASSWORD,
            **LIMITS,
            **(limits or {}),
        }
    )
    command = [sys.executable, "-m", "gpugap", "clickhouse", "serve", *flags]
    server = EmbeddedClickHouse(
        root / "data", free_port(), env=env, log=root / "endpoint.log", command=command
    )
    server.env = env  # not os.environ as well (see the module's docstring)
    try:
        server.start(timeout_s=60)
    except GpugapError as exc:
        pytest.fail(f"the embedded endpoint did not start: {redact(str(exc))}")
    try:
        yield Endpoint(server)
    finally:
        server.stop(timeout_s=10)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """The endpoint most attacks share (query time limit 30 s, receive timeout 2 s), logging
    all it logs: the log test reads what it wrote during the whole module."""
    with running(tmp_path_factory.mktemp("endpoint"), {"GPUGAP_LOG_LEVEL": "DEBUG"}) as ep:
        yield ep


@pytest.fixture(scope="module")
def short_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """An endpoint whose queries may run 3 s at most."""
    limit = {"GPUGAP_CLICKHOUSE_SERVE_MAX_EXECUTION_TIME_S": str(SHORT_MAX_EXECUTION_TIME_S)}
    with running(tmp_path_factory.mktemp("short"), limit) as ep:
        yield ep


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Endpoint]:
    """An endpoint of this test's own: for attacks that may leave the engine changed for good
    (a setting nobody can reset) and for peak-memory checks (VmHWM only grows)."""
    with running(tmp_path) as ep:
        yield ep


@pytest.fixture
def table(endpoint: Endpoint) -> Iterator[str]:
    """A MergeTree table with one row, the target of the write attacks."""
    name = unique("victim")
    endpoint.ok(f"CREATE TABLE {name} (n Int32) ENGINE = MergeTree ORDER BY n", timeout=30)
    endpoint.ok(f"INSERT INTO {name} VALUES (1)", timeout=30)
    yield name
    endpoint.settle()
    endpoint.ask(f"DROP TABLE IF EXISTS {name}", timeout=30)
