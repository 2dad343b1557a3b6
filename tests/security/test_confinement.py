"""The operating system is the engine's boundary: with every SQL-level guard of the endpoint
off (tests/security/unguarded.py: no check of what a request names, no grant, constraint or
row policy), what SQL reaches the engine still cannot read a host file, its environment, open
a connection, run a program or write outside its data directory, as the admin or as the
reader. The same attacks against the same unguarded endpoint with the confinement off all
work: they are real, and the confinement is what stops them.

Each attack is judged by its traces, not by its error code: the content it would show (this
machine's hostname, a line of /etc/passwd, a variable of the environment), a request to the
web server it would reach, the file a planted script or the attack would write.
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from gpugap.services.kafka import free_port
from gpugap.warehouse.embedded.confine import landlock_abi
from tests.harness.embedded_clickhouse import EmbeddedClickHouse
from tests.security.conftest import (
    ADMIN,
    ADMIN_PASSWORD,
    READER,
    READER_PASSWORD,
    Endpoint,
    User,
    describe,
    minimal_env,
)

HOSTNAME = socket.gethostname()
UNGUARDED = [sys.executable, "-m", "tests.security.unguarded"]
# what each attack asks; {web}: a port where a web server counts requests, {outside}: a
# directory outside the data directory
ATTACKS = {
    "file() of a host file": "SELECT file('/etc/hostname')",
    "file() of the environment": "SELECT file('/proc/self/environ')",
    "a path read as a table": "SELECT * FROM `/etc/passwd` LIMIT 1",
    "format(Values) expression": (
        "SELECT * FROM format(Values, 'x String', '(file(''/etc/hostname''))')"
    ),
    "url()": "SELECT * FROM url('http://127.0.0.1:{web}/from-the-engine', RawBLOB)",
    "remote()": "SELECT * FROM remote('127.0.0.1:{web}', system.one)",
    "executable() of a planted script": "SELECT * FROM executable('planted.sh', TSV, 'x String')",
    "python() of the process's objects": "SELECT * FROM python(head)",
    "INSERT INTO FUNCTION file()": (
        "INSERT INTO FUNCTION file('{outside}/written', RawBLOB) SELECT 'written'"
    ),
}
WHO = {"admin": ADMIN, "reader": READER}
# bounded: url() and remote() retry by default
PARAMS = {"max_execution_time": "20", "http_max_tries": "1", "connect_timeout": "2"}


class _Counter(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"answered-the-engine")

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Target:
    endpoint: Endpoint
    outside: Path
    web: int
    seen: list[str] = field(default_factory=list)

    @property
    def marker(self) -> Path:
        return self.outside / "the-script-ran"

    def attack(self, name: str, who: User) -> requests.Response:
        sql = ATTACKS[name].format(web=self.web, outside=self.outside)
        return self.endpoint.ask(sql, who, params=PARAMS, timeout=60)

    def traces(self, response: requests.Response) -> list[str]:
        """What of the host the attack reached, in words (empty: nothing)."""
        found = []
        text = response.text
        if HOSTNAME in text.replace("'/etc/hostname'", ""):
            found.append(f"the hostname {HOSTNAME!r} in the answer")
        if "root:x:" in text or "PATH=" in text:
            found.append("a host file's content in the answer")
        if self.seen:
            found.append(f"requests to the web server: {self.seen}")
        if self.marker.exists():
            found.append("the planted script ran")
        if (self.outside / "written").exists():
            found.append("a file written outside the data directory")
        return found


def _launch(root: Path, confine: str) -> Iterator[Target]:
    """An unguarded endpoint in ``root`` with its own web server to be reached and a script
    planted where executable() looks."""
    seen: list[str] = []
    handler = type("Counter", (_Counter,), {"seen": seen})
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, name="attack-web", daemon=True).start()
    outside = root / "outside"
    outside.mkdir()
    scripts = root / "data" / "user_scripts"
    scripts.mkdir(parents=True)
    planted = scripts / "planted.sh"
    planted.write_text(f"#!/bin/sh\ntouch {outside}/the-script-ran\necho ran\n")
    planted.chmod(0o755)
    env = minimal_env(
        {
            "GPUGAP_CLICKHOUSE_PASSWORD": ADMIN_PASSWORD,
            "GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PASSWORD,
            "GPUGAP_CLICKHOUSE_SERVE_CONFINE": confine,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
    )
    server = EmbeddedClickHouse(
        root / "data", free_port(), env=env, log=root / "endpoint.log", command=UNGUARDED
    )
    server.env = env
    server.start(timeout_s=90)
    try:
        yield Target(Endpoint(server), outside, web.server_address[1], seen)
    finally:
        server.stop(timeout_s=20)
        web.shutdown()


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    yield from _launch(tmp_path_factory.mktemp("confined"), "required")


@pytest.fixture(scope="module")
def unconfined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    yield from _launch(tmp_path_factory.mktemp("unconfined"), "off")


def test_this_machine_confines_the_engine() -> None:
    """CI's kernel has what the default (required) needs: otherwise every endpoint of the suite
    would fail to start, and this says why."""
    assert landlock_abi() >= 2, "this kernel has no Landlock ABI 2 (Linux 5.19): see security.md"


@pytest.mark.parametrize("who", WHO.values(), ids=WHO.keys())
@pytest.mark.parametrize("attack", ATTACKS)
def test_with_the_sql_guards_off_the_engine_still_cannot_reach_the_host(
    confined: Target, attack: str, who: User
) -> None:
    response = confined.attack(attack, who)
    assert not confined.traces(response), (
        f"{attack}: {confined.traces(response)}: {describe(response)}"
    )
    if response.status_code == 200:  # (executable(): the engine reads an empty answer)
        assert response.text.strip() in ("", "0"), describe(response)
    elif who is ADMIN and attack in (
        "file() of a host file",
        "url()",
        "INSERT INTO FUNCTION file()",
    ):
        # the operating system said no, not a check of the endpoint's
        assert "Permission denied" in response.text, describe(response)


@pytest.mark.parametrize(
    "attack",
    ["file() of a host file", "a path read as a table", "url()", "executable() of a planted script",
     "INSERT INTO FUNCTION file()"],
)  # fmt: skip
def test_the_same_attacks_reach_the_host_without_the_confinement(
    unconfined: Target, attack: str
) -> None:
    """The control: what stops them above is the confinement."""
    response = unconfined.attack(attack, ADMIN)
    assert unconfined.traces(response), f"{attack} left no trace: {describe(response)}"


def test_no_secret_enters_the_engine_process(confined: Target, unconfined: Target) -> None:
    """Its environment holds a few names and no password, even where it can read it."""
    environ = unconfined.endpoint.ok("SELECT file('/proc/self/environ')", ADMIN, params=PARAMS)
    names = {v.split("=", 1)[0] for v in environ.replace("\\0", "\0").split("\0") if "=" in v}
    assert names <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "TMPDIR"}, names
    assert ADMIN_PASSWORD not in environ and READER_PASSWORD not in environ
    for target in (confined, unconfined):
        engine = target.endpoint.engine_pid()
        raw = (
            Path(f"/proc/{engine}/environ").read_bytes()
            + Path(f"/proc/{engine}/cmdline").read_bytes()
        )
        assert ADMIN_PASSWORD.encode() not in raw and READER_PASSWORD.encode() not in raw


@pytest.mark.parametrize("mode", ["required", "best-effort"])
def test_without_landlock_the_endpoint_refuses_or_says_what_it_lacks(
    tmp_path: Path, mode: str
) -> None:
    """On a kernel without Landlock (simulated: its calls answer ENOSYS) the default refuses
    to start, saying what is missing and what to do; best-effort starts, says the same as a
    warning, and still blocks the network and programs (seccomp)."""
    env = minimal_env(
        {
            "GPUGAP_CLICKHOUSE_PASSWORD": ADMIN_PASSWORD,
            "GPUGAP_CLICKHOUSE_SERVE_CONFINE": mode,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
    )
    command = [sys.executable, "-m", "tests.security.no_landlock", *UNGUARDED]
    server = EmbeddedClickHouse(
        tmp_path / "data", free_port(), env=env, log=tmp_path / "endpoint.log", command=command
    )
    server.env = env
    if mode == "required":
        with pytest.raises(Exception, match="cannot be confined") as refused:
            server.start(timeout_s=90)
        text = str(refused.value)
        assert "no Landlock" in text and "GPUGAP_CLICKHOUSE_SERVE_CONFINE" in text, text
        return
    server.start(timeout_s=90)
    try:
        log = server.log.read_text()
        assert "NOT fully confined" in log and "no Landlock" in log, log
        ep = Endpoint(server)
        # files are not confined here: the network still is
        r = ep.ask("SELECT * FROM url('http://127.0.0.1:9/x', RawBLOB)", ADMIN, params=PARAMS)
        assert r.status_code != 200 and "Permission denied" in r.text, describe(r)
    finally:
        server.stop(timeout_s=20)
