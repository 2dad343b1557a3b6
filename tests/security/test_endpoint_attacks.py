"""The security review's attacks on the embedded ClickHouse endpoint, one test each.

Every test starts from the contract the endpoint follows: errors are ClickHouse's (body
'Code: N. DB::Exception: ...', header X-ClickHouse-Exception-Code: N); the reader, every GET
and every request with readonly=1|2 run read-only (164); host access (files, URLs, other
servers, programs) is refused for every user (497; INTO OUTFILE 564); URL parameters and SET
change only an allow-list of settings (452), and never for another user or a later request;
sessions belong to (user, session_id); slow or stalled clients and long queries hold up nobody
and are cut off by the server's limits; oversized bodies are refused before they are buffered;
the endpoint never listens beyond loopback without a password, nor logs one.

All traffic goes to 127.0.0.1; every loop is bounded in count and in time.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.services.kafka import free_port
from gpugap.warehouse.client import connect
from tests.harness.embedded_clickhouse import answers
from tests.security.conftest import (
    ADMIN,
    ADMIN_PASSWORD,
    GIB,
    MAX_QUERY_BYTES,
    READER,
    READER_PASSWORD,
    RECEIVE_TIMEOUT_S,
    SHORT_MAX_EXECUTION_TIME_S,
    Endpoint,
    User,
    Way,
    chunked,
    closed_by,
    describe,
    memory_watch,
    minimal_env,
    peer_closed,
    poll,
    readable,
    refused,
    request_head,
    unique,
    upload,
)

# --- read-only means read-only ------------------------------------------------------------

READ_ONLY_WAYS = {
    "reader": Way(READER),
    "reader?readonly=0": Way(READER, params={"readonly": "0"}),
    "admin-GET": Way(ADMIN, get=True),
    "admin-GET?readonly=0": Way(ADMIN, get=True, params={"readonly": "0"}),
    "admin?readonly=1": Way(ADMIN, params={"readonly": "1"}),
    "admin?readonly=2": Way(ADMIN, params={"readonly": "2"}),
}
WRITES = {
    "drop": "DROP TABLE {t}",
    "nested-comment": "/* /* */ SELECT 1 */ DROP TABLE {t}",
    "nested-comment-tight": "/*/**/*/DROP TABLE {t}",
    "dash-comment": "-- x\nDROP TABLE {t}",
    "hash-comment": "# x\nDROP TABLE {t}",
    "insert": "INSERT INTO {t} VALUES (2)",
    "insert-select": "INSERT INTO {t} SELECT 2",
    "truncate": "TRUNCATE TABLE {t}",
    "rename": "RENAME TABLE {t} TO {t}_renamed",
}
MULTI_STATEMENTS = {
    "plain": "SELECT 1; DROP TABLE {t}",
    "newline": "SELECT 1;\nDROP TABLE {t}",
    "dollar-string": "SELECT $$;$$; DROP TABLE {t}",
    "quote-in-dollar-string": "SELECT $$'$$; DROP TABLE {t} --'",
    "comment-in-dollar-string": "SELECT $$/*$$; DROP TABLE {t} -- */",
    "dash-in-dollar-string": "SELECT $$--$$; DROP TABLE {t}",
}


@pytest.mark.parametrize("statement", WRITES.values(), ids=WRITES.keys())
@pytest.mark.parametrize("way", READ_ONLY_WAYS.values(), ids=READ_ONLY_WAYS.keys())
def test_read_only_requests_cannot_write(
    endpoint: Endpoint, table: str, way: Way, statement: str
) -> None:
    r = way.ask(endpoint, statement.format(t=table))
    harm = endpoint.damage(table)
    assert harm is None, f"{harm}; the response: {describe(r)}"
    refused(r, {164}, status=403)


# (the reader's ?readonly=0 is refused as such, 164, whatever the statement)
MULTI_WAYS = {"admin": Way(ADMIN)} | {
    k: v for k, v in READ_ONLY_WAYS.items() if k != "reader?readonly=0"
}


@pytest.mark.parametrize("statement", MULTI_STATEMENTS.values(), ids=MULTI_STATEMENTS.keys())
@pytest.mark.parametrize("way", MULTI_WAYS.values(), ids=MULTI_WAYS.keys())
def test_multi_statements_are_refused(
    endpoint: Endpoint, table: str, way: Way, statement: str
) -> None:
    r = way.ask(endpoint, statement.format(t=table))
    harm = endpoint.damage(table)
    assert harm is None, f"{harm}; the response: {describe(r)}"
    refused(r, {62}, status=400)
    assert "Multi-statements are not allowed" in r.text, describe(r)


@pytest.mark.parametrize(
    "statement",
    [WRITES["drop"], WRITES["nested-comment"], MULTI_STATEMENTS["dollar-string"]],
    ids=["drop", "nested-comment", "dollar-string"],
)
def test_gpugap_sql_cannot_write_even_as_the_admin(
    endpoint: Endpoint, table: str, statement: str
) -> None:
    env = minimal_env(
        {
            "GPUGAP_CLICKHOUSE_URL": endpoint.url,
            "GPUGAP_CLICKHOUSE_USER": ADMIN.name,
            "GPUGAP_CLICKHOUSE_PASSWORD": ADMIN_PASSWORD,
            "GPUGAP_CLICKHOUSE_DATABASE": "default",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpugap", "sql", statement.format(t=table)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    harm = endpoint.damage(table)
    assert harm is None, f"{harm}; gpugap sql said: {done.stdout[-300:]} {done.stderr[-300:]}"
    assert done.returncode != 0, f"gpugap sql exited 0: {done.stdout[-300:]}"


# --- no access to the host, for anybody ------------------------------------------------------

HOST_WAYS = {"admin": Way(ADMIN), "admin-GET": Way(ADMIN, get=True), "reader": Way(READER)}
OUTFILE = "SELECT 1 INTO OUTFILE '{dir}/out'"
HOST_ACCESS: dict[str, tuple[str, frozenset[int]]] = {
    "file-passwd": ("SELECT * FROM file('/etc/passwd', 'LineAsString')", frozenset({497})),
    "file-environ": ("SELECT * FROM file('/proc/self/environ', 'RawBLOB')", frozenset({497})),
    "file-scalar": ("SELECT file('/etc/hostname')", frozenset({497})),
    "file-scalar-environ": ("SELECT file('/proc/self/environ')", frozenset({497})),
    "url-self": ("SELECT * FROM url('http://127.0.0.1:{port}/ping', 'RawBLOB')", frozenset({497})),
    "s3-self": (
        "SELECT * FROM s3('http://127.0.0.1:{port}/bucket/key.csv', 'CSV', 'x String')",
        frozenset({497}),
    ),
    "remote": ("SELECT * FROM remote('127.0.0.1:{free}', system.one)", frozenset({497})),
    "executable": (
        "SELECT * FROM executable('cat /etc/hostname', 'TSV', 'x String')",
        frozenset({497}),
    ),
    "insert-into-function-file": (
        "INSERT INTO FUNCTION file('{dir}/x.csv') SELECT 1",
        frozenset({497}),
    ),
    "engine-file": (
        "CREATE TABLE {name} (a Int32) ENGINE = File(CSV, '{dir}/x')",
        frozenset({497}),
    ),
    "engine-url": (
        "CREATE TABLE {name} (a String) ENGINE = URL('http://127.0.0.1:{port}/ping', RawBLOB)",
        frozenset({497}),
    ),
    "dictionary-file-source": (
        "CREATE DICTIONARY {name} (id UInt64, a String) PRIMARY KEY id "
        "SOURCE(FILE(path '/etc/passwd' format 'CSV')) LAYOUT(FLAT()) LIFETIME(0)",
        frozenset({497}),
    ),
    "from-infile": (
        "INSERT INTO {t} FROM INFILE '/etc/hostname' FORMAT CSV",
        frozenset({497, 564}),
    ),
    "into-outfile": (OUTFILE, frozenset({564})),
    # the engine's default database read any file named as a table
    "path-as-table": ("SELECT * FROM `/etc/passwd`", frozenset({60, 497})),
    "path-as-table-environ": ("SELECT * FROM `/proc/self/environ`", frozenset({60, 497})),
    "path-in-default": ("SELECT * FROM default.`/etc/passwd`", frozenset({60, 497})),
    "path-in-the-overlay": (
        "SELECT * FROM _gpugap_host_files_off.`/etc/passwd`",
        frozenset({81, 497}),
    ),
    "filesystem-database": ("CREATE DATABASE {name} ENGINE = Filesystem('/etc')", frozenset({497})),
}


@pytest.mark.parametrize("attack", HOST_ACCESS.keys())
@pytest.mark.parametrize("way", HOST_WAYS.values(), ids=HOST_WAYS.keys())
def test_host_access_is_refused_for_every_user(
    endpoint: Endpoint, table: str, tmp_path: Path, way: Way, attack: str
) -> None:
    template, codes = HOST_ACCESS[attack]
    name = unique("host")
    sql = template.format(port=endpoint.port, free=free_port(), dir=tmp_path, name=name, t=table)
    try:
        r = way.ask(endpoint, sql)
    finally:
        endpoint.settle()
        endpoint.ask(f"DROP DICTIONARY IF EXISTS {name}")
        endpoint.ask(f"DROP TABLE IF EXISTS {name}")
        endpoint.ask(f"DROP DATABASE IF EXISTS {name}")
    assert "root:" not in r.text, f"a host file came back: {describe(r)}"
    written = sorted(p.name for p in tmp_path.iterdir())
    assert not written, f"the endpoint wrote {written} into {tmp_path}; {describe(r)}"
    # a read-only request may be refused for being read-only first; INTO OUTFILE never runs
    allowed = codes | {164} if way.readonly and template != OUTFILE else codes
    refused(r, allowed)
    assert endpoint.damage(table) is None


# --- settings: an allow-list, and nothing outlives its request -------------------------------


@dataclass(frozen=True)
class SettingAttack:
    way: Way
    query: str
    codes: frozenset[int]  # empty: the request may succeed; only nothing may leak from it
    session: str | None = None


SETTING_ATTACKS = {
    "reader ?readonly=0": SettingAttack(
        Way(READER, params={"readonly": "0"}), "SELECT 1", frozenset({164})
    ),
    "reader SET readonly=0": SettingAttack(Way(READER), "SET readonly = 0", frozenset({164}), "s1"),
    "reader SET readonly=1": SettingAttack(Way(READER), "SET readonly = 1", frozenset()),
    "reader SET readonly=1 in s1": SettingAttack(
        Way(READER), "SET readonly = 1", frozenset(), "s1"
    ),
    "admin ?readonly=1": SettingAttack(
        Way(ADMIN, params={"readonly": "1"}), "SELECT 1", frozenset()
    ),
    "admin GET": SettingAttack(Way(ADMIN, get=True), "SELECT 1", frozenset()),
    "admin SET readonly=1": SettingAttack(Way(ADMIN), "SET readonly = 1", frozenset()),
    "admin ?allow_ddl=0": SettingAttack(
        Way(ADMIN, params={"allow_ddl": "0"}), "SELECT 1", frozenset({452})
    ),
    "admin SET allow_ddl=0": SettingAttack(Way(ADMIN), "SET allow_ddl = 0", frozenset({452})),
    "reader ?allow_ddl=0": SettingAttack(
        Way(READER, params={"allow_ddl": "0"}), "SELECT 1", frozenset({452})
    ),
    "reader SET allow_ddl=0 in s1": SettingAttack(
        Way(READER), "SET allow_ddl = 0", frozenset({452}), "s1"
    ),
    "admin ?allow_introspection_functions=1": SettingAttack(
        Way(ADMIN, params={"allow_introspection_functions": "1"}), "SELECT 1", frozenset({452})
    ),
    "reader ?allow_introspection_functions=1": SettingAttack(
        Way(READER, params={"allow_introspection_functions": "1"}), "SELECT 1", frozenset({452})
    ),
    "admin ?max_execution_time=100000": SettingAttack(
        Way(ADMIN, params={"max_execution_time": "100000"}), "SELECT 1", frozenset({452})
    ),
    "admin SET max_execution_time=100000 in s1": SettingAttack(
        Way(ADMIN), "SET max_execution_time = 100000", frozenset({452}), "s1"
    ),
    "admin ?profile=default": SettingAttack(
        Way(ADMIN, params={"profile": "default"}), "SELECT 1", frozenset({452})
    ),
}
WATCHED = "('readonly', 'allow_ddl', 'allow_introspection_functions', 'max_execution_time')"


def _settings_seen(ep: Endpoint, who: User) -> str:
    q = f"SELECT name, value FROM system.settings WHERE name IN {WATCHED} ORDER BY name"
    r = ep.ask(q, who)
    return r.text if r.status_code == 200 else describe(r)


def _after_effects(ep: Endpoint, attack: SettingAttack, before: dict[str, str]) -> list[str]:
    """What the attack changed for later requests: the admin's DDL and writes (no session,
    another session, and the attacker's session id when the attacker was the reader), the
    reader's reads and its read-only-ness, and the settings either of them sees."""
    problems = []
    sessions: list[str | None] = [None, "s2"]
    if attack.way.who == READER:
        sessions.append("s1")
    for session in sessions:
        t = unique("after")
        for q in (
            f"CREATE TABLE {t} (n Int32) ENGINE = MergeTree ORDER BY n",
            f"INSERT INTO {t} VALUES (1)",
            f"DROP TABLE {t}",
        ):
            r = ep.ask(q, ADMIN, session=session)
            if r.status_code != 200:
                problems.append(f"admin {q.split()[0]} (session {session}): {describe(r)}")
                break
    r = ep.ask("SELECT 1", READER)
    if r.text != "1\n":
        problems.append(f"reader SELECT 1: {describe(r)}")
    r = ep.ask("CREATE TABLE reader_wrote (n Int32) ENGINE = Memory", READER)
    if r.headers.get("X-ClickHouse-Exception-Code") != "164":
        problems.append(f"reader CREATE TABLE was not refused 164: {describe(r)}")
    for who in (ADMIN, READER):
        now = _settings_seen(ep, who)
        if now != before[who.name]:
            problems.append(f"{who.name} now sees {now!r}, before {before[who.name]!r}")
    return problems


@pytest.mark.parametrize("attack", SETTING_ATTACKS.values(), ids=SETTING_ATTACKS.keys())
def test_setting_attacks_are_refused_and_change_nothing_for_later_requests(
    fresh: Endpoint, attack: SettingAttack
) -> None:
    before = {who.name: _settings_seen(fresh, who) for who in (ADMIN, READER)}
    r = attack.way.ask(fresh, attack.query, session=attack.session)
    problems = _after_effects(fresh, attack, before)
    assert not problems, f"after {describe(r)}: " + "; ".join(problems)
    if attack.codes:
        refused(r, attack.codes)


def test_settings_bi_tools_send_still_work_for_the_reader(endpoint: Endpoint) -> None:
    limited = endpoint.ok(
        "SELECT number FROM numbers(100)",
        READER,
        params={"max_result_rows": "5", "result_overflow_mode": "break", "max_block_size": "1"},
    )
    assert limited.split() == ["0", "1", "2", "3", "4"]
    big = "SELECT toUInt64(18446744073709551615) AS x FORMAT JSONEachRow"
    unquoted = endpoint.ok(big, READER, params={"output_format_json_quote_64bit_integers": "0"})
    quoted = endpoint.ok(big, READER, params={"output_format_json_quote_64bit_integers": "1"})
    assert (unquoted.strip(), quoted.strip()) == (
        '{"x":18446744073709551615}',
        '{"x":"18446744073709551615"}',
    )
    iso = endpoint.ok(
        "SELECT toDateTime('2026-01-02 03:04:05', 'UTC')",
        READER,
        params={"date_time_output_format": "iso"},
    )
    assert iso == "2026-01-02T03:04:05Z\n"


def test_a_bi_client_still_works_for_the_reader(endpoint: Endpoint) -> None:
    settings = ClickHouseSettings(
        url=endpoint.url,
        user=READER.name,
        password=SecretStr(READER_PASSWORD),
        database="default",
    )
    client = connect(settings)
    try:
        rows = client.query("SELECT number FROM numbers(3)").result_rows
    finally:
        client.close()
    assert rows == [(0,), (1,), (2,)]


# --- sessions belong to (user, session_id) ---------------------------------------------------

TEN_ROWS = "SELECT number FROM numbers(10)"


def _rows(ep: Endpoint, who: User, session: str) -> str | int:
    r = ep.ask(TEN_ROWS, who, session=session, params={"max_block_size": "1"})
    return len(r.text.split()) if r.status_code == 200 else describe(r)


@pytest.mark.parametrize(
    "owner, other", [(ADMIN, READER), (READER, ADMIN)], ids=["admin", "reader"]
)
def test_session_settings_do_not_reach_another_user_with_the_same_session_id(
    endpoint: Endpoint, owner: User, other: User
) -> None:
    sid = unique("s")
    endpoint.ok("SET max_result_rows = 1, result_overflow_mode = 'break'", owner, session=sid)
    assert _rows(endpoint, owner, sid) == 1, "the SET did not hold in its own session"
    assert _rows(endpoint, other, sid) == 10


def test_temporary_tables_do_not_leak_between_sessions_or_users(endpoint: Endpoint) -> None:
    tt, marker, s1 = unique("tt"), unique("secret"), unique("s1")
    try:
        made = endpoint.ask(f"CREATE TEMPORARY TABLE {tt} (a String)", ADMIN, session=s1)
        if made.status_code == 200:  # (the table may already be gone for the insert too)
            endpoint.ask(f"INSERT INTO {tt} VALUES ('{marker}')", ADMIN, session=s1)
        else:  # refusing temporary tables is fine, with a clear ClickHouse error
            refused(made, None)
        for who, session in ((READER, s1), (ADMIN, unique("s2")), (ADMIN, None), (READER, None)):
            r = endpoint.ask(f"SELECT * FROM {tt}", who, session=session)
            assert r.status_code != 200 and marker not in r.text, (
                f"{who.name} in session {session} sees {tt}: {describe(r)}"
            )
            refused(r, None)
    finally:
        endpoint.ask(f"DROP TEMPORARY TABLE IF EXISTS {tt}", ADMIN, session=s1)


# --- sizes: refused before they are buffered ---------------------------------------------------

CHUNK = 1 << 20


def test_a_query_over_the_size_limit_is_refused_and_inserts_are_not_limited(
    endpoint: Endpoint,
) -> None:
    over = b"SELECT 1 --" + b"x" * (MAX_QUERY_BYTES + 1000)
    refused(endpoint.ask(None, body=over), {62}, status=413)
    under = b"SELECT 1 --" + b"x" * (MAX_QUERY_BYTES // 2)
    assert endpoint.ask(None, body=under).text == "1\n"
    t = unique("big_insert")
    endpoint.ok(f"CREATE TABLE {t} (n UInt32) ENGINE = MergeTree ORDER BY n")
    try:
        rows = "".join(f"{i}\n" for i in range(300_000)).encode()  # ~2 MB
        assert len(rows) > 4 * MAX_QUERY_BYTES
        r = endpoint.ask(None, params={"query": f"INSERT INTO {t} FORMAT CSV"}, body=rows)
        assert r.status_code == 200, describe(r)
        inline = f"INSERT INTO {t} FORMAT CSV\n".encode() + rows
        r = endpoint.ask(None, body=inline)
        assert r.status_code == 200, describe(r)
        assert endpoint.ok(f"SELECT count() FROM {t}") == "600000\n"
    finally:
        endpoint.ask(f"DROP TABLE IF EXISTS {t}")


def test_a_30_mb_query_is_refused_early_while_ping_answers(endpoint: Endpoint) -> None:
    total, piece = 30 << 20, 256 << 10
    body = (b"SELECT 1 --" + b"x" * (piece - 11), *[b"x" * piece] * (total // piece - 1))
    with endpoint.connect() as sock:
        sock.sendall(request_head("POST", "/", ADMIN, {"Content-Length": str(total)}))
        up = upload(endpoint, sock, body, within=20, pause_s=0.01)
    endpoint.settle()
    assert up.ping_s is not None and up.ping_s < 0.1, f"/ping took {up.ping_s} s meanwhile"
    assert up.reply is not None, f"no reply after {up.sent} bytes"
    assert (up.reply.status, up.reply.code) == (413, "62"), up.reply
    assert up.answered_early and up.sent < total, (
        f"the reply came only after {up.sent} of {total} bytes"
    )


def _two_gib_body(first: bytes) -> Iterator[bytes]:
    filler = b"x" * CHUNK
    yield first + filler[len(first) :]
    for _ in range(2 * GIB // CHUNK - 1):
        yield filler


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_2_gib_query_body_is_refused_and_memory_stays_bounded(
    fresh: Endpoint, framing: str
) -> None:
    total = 2 * GIB
    body = _two_gib_body(b"SELECT 1 --")
    headers = {"Content-Length": str(total)}
    if framing == "chunked":
        headers, body = {"Transfer-Encoding": "chunked"}, chunked(body)
    with memory_watch(fresh) as watch, fresh.connect() as sock:
        sock.sendall(request_head("POST", "/", ADMIN, headers))
        up = upload(fresh, sock, body, within=20)
    assert watch.peak < GIB, f"{watch} ({up.sent} B sent)"
    fresh.settle()
    assert up.reply is not None and (up.reply.status, up.reply.code) == (413, "62"), (
        f"{up.reply} after {up.sent} bytes"
    )
    assert up.sent < total
    assert fresh.ok("SELECT 1") == "1\n"


@functools.cache
def _zstd_bomb(prefix: bytes) -> bytes:
    """``prefix`` and then 1 GiB of zeros, as ~32 KB of zstd."""
    from backports import zstd

    compressor = zstd.ZstdCompressor()
    zeros = bytes(16 << 20)
    parts = [compressor.compress(prefix)]
    parts += [compressor.compress(zeros) for _ in range(GIB // len(zeros))]
    return b"".join([*parts, compressor.flush()])


ZSTD_BOMBS = {
    "query": ({}, b""),
    "insert-query-in-url": ({"query": "INSERT INTO bomb FORMAT CSV"}, b""),
    "insert-query-in-body": ({}, b"INSERT INTO bomb FORMAT CSV\n"),
}


@pytest.mark.parametrize("bomb", ZSTD_BOMBS.keys())
def test_a_zstd_bomb_is_refused_or_bounded(fresh: Endpoint, bomb: str) -> None:
    params, prefix = ZSTD_BOMBS[bomb]
    fresh.ok("CREATE TABLE bomb (n Int32) ENGINE = MergeTree ORDER BY n")
    data = _zstd_bomb(prefix)
    assert len(data) < 64 << 10
    with memory_watch(fresh) as watch:
        took, r = fresh.timed(
            None, params=params, body=data, headers={"Content-Encoding": "zstd"}, timeout=60
        )
    assert watch.peak < GIB, str(watch)
    fresh.settle()
    assert took < 30, f"the bomb took {took:.1f} s"
    refused(r, None)
    assert fresh.ok("SELECT 1") == "1\n"


# --- exposure: never beyond loopback without a password ---------------------------------------


def _serve_on_all_addresses(
    root: Path, flags: list[str], env: dict[str, str]
) -> tuple[bool, int | None, str, float]:
    """Start ``gpugap clickhouse serve --host 0.0.0.0``: (whether it answered on 127.0.0.1,
    its exit status if it exited by itself, its output, seconds until either). Stopped at once
    when it answers: nothing else is sent to it."""
    port = free_port()
    out = root / "serve.log"
    argv = [sys.executable, "-m", "gpugap", "clickhouse", "serve", "--path", str(root / "data")]
    argv += ["--host", "0.0.0.0", "--port", str(port), *flags]
    started = time.monotonic()
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        up = poll(lambda: proc.poll() is not None or answers(f"http://127.0.0.1:{port}"), 30, 0.1)
        took = time.monotonic() - started
        served = up and proc.poll() is None
        code = proc.returncode
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return served, code, out.read_text(errors="replace"), took


def test_serving_beyond_loopback_without_a_password_generates_one(tmp_path: Path) -> None:
    """No password configured: the endpoint generates one (0600, beside its data) and
    serves only with it, on any address (as Jupyter does with its token)."""
    served, code, output, took = _serve_on_all_addresses(tmp_path, [], minimal_env())
    assert served, f"exit status {code}: {output[-500:]}"
    kept = tmp_path / "data.password"
    assert str(kept) in output, output[-500:]
    assert kept.stat().st_mode & 0o777 == 0o600
    assert kept.read_text().strip() not in output  # (not a terminal: the file only)
    assert took < 30


@pytest.mark.parametrize("how", ["--insecure-no-password", "password-set"])
def test_serving_beyond_loopback_starts_when_allowed(tmp_path: Path, how: str) -> None:
    flags = ["--insecure-no-password"] if how == "--insecure-no-password" else []
    env = minimal_env({} if flags else {"GPUGAP_CLICKHOUSE_PASSWORD": ADMIN_PASSWORD})
    served, code, output, _ = _serve_on_all_addresses(tmp_path, flags, env)
    assert served, f"exit status {code}: {output[-500:]}"


# --- nobody holds up anybody; the server's limits cut off the rest -----------------------------


def test_a_long_reader_query_does_not_hold_up_the_admin(endpoint: Endpoint) -> None:
    long: list[tuple[float, requests.Response | None]] = []

    def run_long() -> None:
        long.append(
            endpoint.timed(
                "SELECT sleepEachRow(1) FROM numbers(8)",
                READER,
                params={"max_block_size": "1"},
                timeout=20,
            )
        )

    worker = threading.Thread(target=run_long, name="long-reader-query")
    worker.start()
    try:
        time.sleep(1.0)
        waited, r = endpoint.timed("SELECT 1", ADMIN, timeout=12)
    finally:
        worker.join(25)
    assert long, "the long query did not come back"
    long_s, long_r = long[0]
    assert long_r is not None and long_r.status_code == 200 and long_s >= 7, (
        f"the reader's 8 s query: {long_s:.1f} s, {describe(long_r)}"
    )
    assert r is not None and r.text == "1\n", describe(r)
    assert waited < 0.5, f"the admin's SELECT 1 took {waited:.2f} s"


def test_a_stalled_insert_neither_blocks_others_nor_lives_forever(endpoint: Endpoint) -> None:
    t = unique("stalled")
    endpoint.ok(f"CREATE TABLE {t} (n Int32) ENGINE = MergeTree ORDER BY n")
    target = "/?" + urlencode({"query": f"INSERT INTO {t} FORMAT CSV"})
    seen = bytearray()
    try:
        with endpoint.connect() as sock:
            sock.sendall(request_head("POST", target, ADMIN, {"Content-Length": "1000"}) + b"1")
            stalled_at = time.monotonic()
            time.sleep(0.3)
            waited, r = endpoint.timed("SELECT 1", ADMIN, timeout=4)
            closed_at = closed_by(sock, stalled_at + RECEIVE_TIMEOUT_S + 4, seen)
        assert r is not None and r.text == "1\n", describe(r)
        assert waited < 0.5, f"SELECT 1 took {waited:.2f} s beside the stalled insert"
        reply = bytes(seen[:120]).decode(errors="replace")
        assert closed_at is not None, (
            f"the server kept the stalled connection open (having sent {reply!r})"
        )
        assert closed_at - stalled_at < RECEIVE_TIMEOUT_S + 3.5, (
            f"closed only after {closed_at - stalled_at:.1f} s (having sent {reply!r})"
        )
        assert endpoint.ok(f"SELECT count() FROM {t}") == "0\n", "a truncated body was inserted"
    finally:
        endpoint.settle()
        endpoint.ask(f"DROP TABLE IF EXISTS {t}")


def test_slowloris_headers_are_cut_off_while_ping_answers(endpoint: Endpoint) -> None:
    pings: list[float] = []
    closed_after = None
    with endpoint.connect() as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        for i in range(int((RECEIVE_TIMEOUT_S + 6) / 0.5)):
            if readable(sock, 0.5) and peer_closed(sock):
                closed_after = time.monotonic() - started
                break
            try:
                sock.sendall(b"a")
            except OSError:
                closed_after = time.monotonic() - started
                break
            if i % 2:
                pings.append(endpoint.ping())
    assert pings and max(pings) < 0.1, f"/ping took {pings} s beside the slow client"
    assert closed_after is not None, "the server kept the slow connection open"
    assert closed_after < RECEIVE_TIMEOUT_S + 4, f"closed only after {closed_after:.1f} s"


def test_a_query_whose_client_went_away_is_cancelled(endpoint: Endpoint) -> None:
    marker = uuid.uuid4().hex[:12]
    body = f"SELECT sleepEachRow(1), 'mk{marker}' FROM numbers(10)".encode()
    # the probe's own text must not match: 'mk' and the marker are two literals in it
    probe = f"SELECT count() FROM system.processes WHERE query LIKE concat('%mk', '{marker}%')"

    def running(expected: int) -> bool:
        try:
            r = endpoint.ask(probe, ADMIN, timeout=1.0)
        except requests.RequestException:
            return False
        return r.status_code == 200 and r.text == f"{expected}\n"

    head = request_head("POST", "/?max_block_size=1", READER, {"Content-Length": str(len(body))})
    try:
        with endpoint.connect() as sock:
            sock.sendall(head + body)
            seen = poll(lambda: running(1), 3.0)
        gone = seen and poll(lambda: running(0), 4.0)
    finally:
        endpoint.settle()
    assert seen, "the reader's query never showed in system.processes (or the probe was held up)"
    assert gone, "the query kept running after its client went away"


@dataclass(frozen=True)
class Lift:
    """A query that sleeps 6 s, and maybe a try to lift the server's 3 s limit for it: the
    try may be refused (452) instead of the query timing out (159)."""

    who: User
    codes: frozenset[int] = frozenset({159, 452})
    params: tuple[tuple[str, str], ...] = ()
    suffix: str = ""
    set_first: str = ""


LIFTS = {
    "admin": Lift(ADMIN, frozenset({159})),
    "reader": Lift(READER, frozenset({159})),
    "?max_execution_time=0": Lift(ADMIN, params=(("max_execution_time", "0"),)),
    "SETTINGS max_execution_time=0": Lift(ADMIN, suffix=" SETTINGS max_execution_time = 0"),
    "SET max_execution_time=0 in the session": Lift(ADMIN, set_first="SET max_execution_time = 0"),
}


@pytest.mark.parametrize("lift", LIFTS.values(), ids=LIFTS.keys())
def test_queries_stop_at_the_servers_time_limit(short_endpoint: Endpoint, lift: Lift) -> None:
    sid = unique("lift")
    if lift.set_first:
        short_endpoint.ask(lift.set_first, lift.who, session=sid)
    took, r = short_endpoint.timed(
        f"SELECT sleepEachRow(1) FROM numbers(6){lift.suffix}",
        lift.who,
        params={"max_block_size": "1", **dict(lift.params)},
        session=sid,
        timeout=9,
    )
    try:
        assert r is not None, f"no answer in {took:.1f} s"
        assert took < SHORT_MAX_EXECUTION_TIME_S + 2, f"the query ran {took:.1f} s: {describe(r)}"
        refused(r, lift.codes)
    finally:
        short_endpoint.settle()


# --- last: the shared endpoint's log, after all it went through ------------------------------


def test_passwords_never_reach_the_log(endpoint: Endpoint) -> None:
    """Passwords in the URL, right and wrong, and whatever the attacks above made the shared
    endpoint log (it runs at GPUGAP_LOG_LEVEL=DEBUG): none of it may show a password."""
    wrong = unique("WRONGSECRET")
    logged_before = endpoint.log.stat().st_size

    def with_url_password(user: str, password: str) -> requests.Response:
        params = {"user": user, "password": password, "query": "SELECT 1"}
        return requests.get(f"{endpoint.url}/", params=params, timeout=10)

    assert with_url_password(ADMIN.name, ADMIN_PASSWORD).text == "1\n"
    assert with_url_password(READER.name, READER_PASSWORD).text == "1\n"
    bad = with_url_password(ADMIN.name, wrong)
    refused(bad, {516})
    assert wrong not in bad.text
    assert poll(lambda: endpoint.log.stat().st_size > logged_before, 2.0), (
        "the endpoint logged nothing about three requests (is there no access log?)"
    )
    time.sleep(0.3)  # the rest of the lines
    log = endpoint.log.read_text(errors="replace")
    leaked = sum(s in log for s in (ADMIN_PASSWORD, READER_PASSWORD, wrong))
    clean = leaked == 0  # (no password in pytest's own explanation)
    assert clean, f"{endpoint.log} contains {leaked} of the 3 passwords sent"
