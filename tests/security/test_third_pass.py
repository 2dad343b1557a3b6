"""The third security review's attacks on the embedded endpoint, one test each (the engine's
confinement has tests/security/test_confinement.py): host files through row filters and
Values, other users' query text, answers that do not count against their user, results over
their limit, forged log lines, and what real clients need.

All traffic goes to 127.0.0.1; every loop is bounded in count and in time.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from tests.security.conftest import (
    ADMIN,
    READER,
    Endpoint,
    describe,
    poll,
    refused,
    request_head,
    running,
    unique,
)

MIB = 1 << 20
WHO = {"admin": ADMIN, "reader": READER}


# --- answers count against their user -----------------------------------------------------------

# about 15 MB of Native (1.9 million short strings): re-framed value by value in Python, it
# took the CPU from everyone
BIG_NATIVE = "SELECT toString(number) AS s FROM numbers(1900000) FORMAT Native"


def _admin_latency(ep: Endpoint, table: str) -> tuple[float, float]:
    """Median seconds of the admin's SELECT 1 (5) and of a 1,000-row insert (3)."""

    def timed(fn: object) -> float:
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        return time.perf_counter() - started

    def select() -> None:
        assert ep.ok("SELECT 1", timeout=60) == "1\n"

    rows = b"".join(b"%d\n" % i for i in range(1000))

    def insert() -> None:
        r = ep.ask(f"INSERT INTO {table} FORMAT TSV", body=rows, timeout=60)
        assert r.status_code == 200, describe(r)

    return (
        statistics.median(timed(select) for _ in range(5)),
        statistics.median(timed(insert) for _ in range(3)),
    )


def test_a_reader_asking_big_native_answers_does_not_starve_the_admin_or_the_sink(
    tmp_path: Path,
) -> None:
    """40 connections of the reader asking for 15 MB Native answers at clickhouse-connect's
    and clickhouse-go's revisions: the answers are framed from the engine's block sizes, in
    the reader's slots, so the admin's SELECT 1 and an insert stay within a few tenths of a
    second (they took 5-17 s when each answer was re-framed value by value after its slot)."""
    with running(tmp_path) as ep:
        table = unique("sink")
        ep.ok(f"CREATE TABLE {table} (n UInt64) ENGINE = MergeTree ORDER BY n")
        quiet = _admin_latency(ep, table)
        stop = threading.Event()
        statuses: Counter[int | str] = Counter()

        def reader(revision: str) -> None:
            with requests.Session() as session:
                while not stop.is_set():
                    try:
                        r = session.post(
                            f"{ep.url}/",
                            data=BIG_NATIVE,
                            params={"client_protocol_version": revision},
                            auth=READER.auth,
                            timeout=60,
                        )
                        statuses[r.status_code] += 1
                    except requests.RequestException as exc:
                        statuses[type(exc).__name__] += 1

        readers = [
            threading.Thread(target=reader, args=(("54405", "54460")[i % 2],), daemon=True)
            for i in range(40)
        ]
        for t in readers:
            t.start()
        try:
            time.sleep(2)  # the reader's slots are full from here
            select_s, insert_s = _admin_latency(ep, table)
        finally:
            stop.set()
            for t in readers:
                t.join(60)
        assert statuses[200] >= 8, f"the reader's answers: {dict(statuses)}"
        assert select_s < 0.75 and insert_s < 1.0, (
            f"under the reader's load the admin's SELECT 1 took {select_s:.3f} s and an insert "
            f"{insert_s:.3f} s (quiet: {quiet[0]:.3f} s, {quiet[1]:.3f} s)"
        )


def _stall(ep: Endpoint, query: str, count: int) -> list[socket.socket]:
    """``count`` connections of the reader asking ``query``, never reading the answer."""
    socks = []
    for _ in range(count):
        sock = ep.connect()
        body = query.encode()
        head = request_head("POST", "/", READER, {"Content-Length": str(len(body))})
        sock.sendall(head + body)
        socks.append(sock)
    return socks


def test_answers_nobody_reads_hold_their_users_slots_and_budget_then_go(tmp_path: Path) -> None:
    """40 answers of 28 MiB that the client never reads: they hold the reader's own slots and
    bytes (not the endpoint's memory: 1.15 GiB with no slot held before), the admin is served
    meanwhile, and once the send timeout passes the connections are cut and the slots free."""
    limits = {
        "GPUGAP_CLICKHOUSE_SERVE_SEND_TIMEOUT_S": "10",
        "GPUGAP_CLICKHOUSE_SERVE_QUEUE_WAIT_S": "1",
    }
    with running(tmp_path, limits) as ep:
        front, engine = ep.server.proc.pid, ep.engine_pid()  # type: ignore[union-attr]
        before = _rss(front), _rss(engine)
        query = "SELECT repeat('y', 1000) FROM numbers(29000) FORMAT TSV"  # 28 MiB
        socks = _stall(ep, query, 40)
        try:
            time.sleep(3)
            held = _rss(front) - before[0]  # the reader's 8 slots: 8 x 28 MiB waiting
            assert held < 400 * MIB, f"40 unread answers hold {held >> 20} MiB of the endpoint"
            # the engine let go of them (it only made them: its allocator gives that back)
            assert poll(lambda: _rss(engine) - before[1] < 250 * MIB, 15), (
                f"the engine process holds {(_rss(engine) - before[1]) >> 20} MiB more"
            )
            assert ep.ok("SELECT 1", timeout=10) == "1\n"  # the admin's slots are its own
            r = ep.ask("SELECT 2", READER, timeout=10)
            refused(r, {202, 241})  # the reader's are full with its unread answers
            # the send timeout cuts the stalled connections: the reader's slots come back
            assert poll(lambda: ep.ask("SELECT 3", READER, timeout=10).text == "3\n", 30), (
                "the reader's slots stayed taken after the send timeout"
            )
        finally:
            for sock in socks:
                sock.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_max_result_bytes_counts_the_bytes_sent(tmp_path: Path) -> None:
    """A constant column counts once a block in the engine's own count: 65 MB went out
    through a 4 MiB limit. The endpoint counts what it would send."""
    with running(tmp_path, {"GPUGAP_CLICKHOUSE_SERVE_MAX_RESULT_BYTES": str(4 * MIB)}) as ep:
        big = "SELECT repeat('x', 1000) FROM numbers(65000)"
        for who in (ADMIN, READER):
            for params in ({}, {"client_protocol_version": "54460", "default_format": "Native"}):
                r = ep.ask(big, who, params=params, timeout=60)
                refused(r, {396})
                assert len(r.content) < MIB, f"{len(r.content)} bytes came back"
        small = ep.ask("SELECT repeat('x', 1000) FROM numbers(3000)", READER, timeout=60)
        assert small.status_code == 200 and len(small.content) == 3000 * 1001, describe(small)


def test_one_users_queries_hold_at_most_its_share_of_memory(tmp_path: Path) -> None:
    """The reader's queries together may hold its share (here 600 MB), enforced by the engine's
    workloads: past it the engine stops the reader's largest query, and the admin's query of
    the same size, at the same time, runs to the end."""
    limits = {"GPUGAP_CLICKHOUSE_SERVE_MAX_MEMORY_USAGE_FOR_USER": str(600 * 10**6)}
    big = "SELECT uniqExact(number) FROM numbers(20000000)"
    with running(tmp_path, limits) as ep:
        answers: dict[str, requests.Response | None] = {}

        def run(name: str, who: object) -> None:
            one = {"max_threads": "1"}
            answers[name] = ep.timed(big, who, params=one, timeout=120)[1]  # type: ignore[arg-type]

        threads = [threading.Thread(target=run, args=(f"reader-{i}", READER)) for i in range(3)]
        threads.append(threading.Thread(target=run, args=("admin", ADMIN)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        admin = answers["admin"]
        assert admin is not None and admin.text == "20000000\n", describe(admin)
        stopped = [name for name, r in answers.items() if r is not None and r.status_code != 200]
        assert stopped, "three readers' queries of ~260 MB each ran within a 600 MB share"
        for name in stopped:
            r = answers[name]
            assert r is not None and "limit is hit" in r.text, describe(r)


def test_a_session_keeps_bounded_settings(endpoint: Endpoint) -> None:
    """100 reader sessions with 250 kB string settings held 2-3 GiB: a session keeps at most
    64 KiB of settings, and says so (30 sessions here: each is refused alike)."""
    before = endpoint.memory("VmRSS")
    value = "d" * 250_000
    for _ in range(30):
        sid = unique("big")
        r = endpoint.ask(f"SET format_custom_row_before_delimiter = '{value}'", READER, session=sid)
        refused(r, {452})
        assert "64" in r.text or "65536" in r.text, describe(r)
    small = unique("small")
    endpoint.ok("SET format_custom_row_before_delimiter = '<'", READER, session=small)
    grown = endpoint.memory("VmRSS") - before
    assert grown < 200 * MIB, f"30 refused sessions grew the endpoint by {grown >> 20} MiB"


# --- host files through row filters and Values; other users' query text ------------------------


@pytest.fixture(scope="module")
def filtered(endpoint: Endpoint) -> str:
    name = unique("filtered")
    endpoint.ok(f"CREATE TABLE {name} (n UInt32) ENGINE = MergeTree ORDER BY n")
    endpoint.ok(f"INSERT INTO {name} SELECT number FROM numbers(10)")
    return name


def _leaks(r: requests.Response) -> list[str]:
    text = r.text
    found = [s for s in ("PATH=", "root:x:", "GPUGAP_", "sec-admin-pw") if s in text]
    return found + ([f"hostname {socket.gethostname()!r}"] if socket.gethostname() in text else [])


@pytest.mark.parametrize(
    "value",
    [
        "map('{t}', concat('@', replaceAll(file('/proc/self/environ'), char(0), ' ')))",
        "map('{t}', concat('@', file('/etc/passwd')))",
        "{{'{t}': 'concat(\\'@\\', file(\\'/proc/self/environ\\')) = \\'\\''}}",
    ],
    ids=["the environment", "a host file", "file() in the filter"],
)
def test_a_row_filter_never_reads_a_host_file(
    endpoint: Endpoint, filtered: str, value: str
) -> None:
    """Grafana's row filter setting, read by the endpoint's check: its Values parser evaluated
    expressions, and the syntax error quoted the file (the admin's password among it)."""
    params = {"additional_table_filters": value.format(t=filtered)}
    for who in (READER, ADMIN):
        r = endpoint.ask(f"SELECT count() FROM {filtered}", who, params=params)
        assert r.status_code >= 400 and not _leaks(r), f"{_leaks(r)}: {describe(r)}"


def test_a_reader_filter_shows_no_other_users_query(endpoint: Endpoint, filtered: str) -> None:
    """The filter check ran before the reader's role was set on the connection, so the row
    policy on system.processes let the admin's running query text through."""
    secret = unique("admin_secret_text")
    admin = threading.Thread(
        target=endpoint.ask,
        args=(f"SELECT sleepEachRow(0.5), '{secret}' FROM numbers(8)",),
        kwargs={"params": {"max_block_size": "1"}, "timeout": 30},
    )
    admin.start()
    try:
        assert poll(lambda: secret in endpoint.ok("SELECT query FROM system.processes"), 5)
        probe = "toUInt8((SELECT any(query) FROM system.processes WHERE query LIKE '%secret%'))"
        quoted = probe.replace("'", "\\'")
        processes = "(SELECT any(query) FROM system.processes WHERE query LIKE '%secret%')"
        for params in (
            # evaluated by the old check's Values parser, its syntax error quoting the result
            {"additional_table_filters": f"map('{filtered}', concat('@', {processes}))"},
            {"additional_table_filters": f"{{'{filtered}': '{quoted} = 1'}}"},
            {"additional_result_filter": f"{probe} = 1"},
        ):
            r = endpoint.ask(f"SELECT count() FROM {filtered}", READER, params=params)
            assert secret not in r.text, f"the reader saw the admin's query: {describe(r)}"
            running = endpoint.ask("SELECT query FROM system.processes", READER, params=params)
            assert secret not in running.text, describe(running)
    finally:
        admin.join(30)


def test_values_run_no_sql_of_the_admins_but_in_its_inserts(endpoint: Endpoint) -> None:
    """Values data with expressions: format() refuses them for everyone; an admin's INSERT ...
    VALUES takes them (clickhouse-java sends fromUnixTimestamp64Nano(...)), and there the
    engine's confinement keeps host files out: the table never holds one."""
    r = endpoint.ask("SELECT * FROM format(Values, 'x String', '(file(''/etc/hostname''))')")
    refused(r, {344})
    assert not _leaks(r), describe(r)
    table = unique("values")
    endpoint.ok(f"CREATE TABLE {table} (s String, t DateTime64(9, 'UTC')) ENGINE = Memory")
    host = endpoint.ask(f"INSERT INTO {table} VALUES (file('/etc/hostname'), now())")
    assert host.status_code >= 400 and "Permission denied" in host.text, describe(host)
    endpoint.ok(
        f"INSERT INTO {table} VALUES ('jdbc', fromUnixTimestamp64Nano(1714557600000000000))"
    )
    assert endpoint.ok(f"SELECT s, t FROM {table}") == "jdbc\t2024-05-01 10:00:00.000000000\n"
    owned = {"input_format_values_interpret_expressions": "1", "workload": "'gpugap_admin'"}
    owned["log_comment"] = "'gpugap:admin:x'"
    for setting, value in owned.items():
        refused(endpoint.ask(f"SELECT 1 SETTINGS {setting} = {value}"), {452})
        refused(endpoint.ask("SELECT 1", params={setting: value.strip("'")}), {452})


@pytest.mark.parametrize("who", WHO.values(), ids=WHO.keys())
def test_executable_and_python_are_refused(endpoint: Endpoint, who: object) -> None:
    for sql in (
        "SELECT * FROM executable('x.sh', TSV, 'x String')",
        "SELECT * FROM python(head)",
        "SELECT * FROM Python(job)",
    ):
        refused(endpoint.ask(sql, who), {497})  # type: ignore[arg-type]


def test_the_reader_sees_no_paths_or_stacks(endpoint: Endpoint) -> None:
    """Every thread's stack (with its query id: the engine process cannot list its threads,
    confined, and the reader's row policy shows none anyway), the server's directories."""
    for sql in (
        "SELECT count() FROM system.stack_trace",
        "SELECT count() FROM system.disks",
        "SELECT count() FROM system.user_directories",
        "SELECT count() FROM system.server_settings WHERE name IN ('path', 'tmp_path')",
    ):
        r = endpoint.ask(sql, READER)
        assert r.text == "0\n" or r.status_code >= 400, f"{sql}: {describe(r)}"
    path = endpoint.ok("SELECT value FROM system.server_settings WHERE name = 'path'").strip()
    assert path, "the admin sees the server's settings"
    assert path not in endpoint.ask("SELECT * FROM system.disks", READER).text
    refused(endpoint.ask("SELECT getServerSetting('path')", READER), {497})
    assert endpoint.ok("SELECT getServerSetting('path') != ''", ADMIN) == "1\n"


# --- real clients ------------------------------------------------------------------------------


def test_grafanas_ad_hoc_filters_in_the_query_text_work(endpoint: Endpoint, filtered: str) -> None:
    """grafana/clickhouse-datasource applies ad hoc filters by appending ``settings
    additional_table_filters={...}`` to the query (adHocFilter.ts, apply()): refused with 452
    before, for the reader too (whose connection takes no SETTINGS clause)."""
    clause = "settings additional_table_filters={{'{t}' : ' {e} '}}"
    sql = f"SELECT count() FROM {filtered} " + clause.format(t=filtered, e="n >= 7")
    for who in (READER, ADMIN):
        assert endpoint.ok(sql, who) == "3\n"
    hostile = f"SELECT count() FROM {filtered} " + clause.format(
        t=filtered, e="file(\\'/etc/passwd\\') != \\'\\'"
    )
    for who in (READER, ADMIN):
        r = endpoint.ask(hostile, who)
        refused(r, {497})
        assert not _leaks(r)


def test_a_client_may_ask_for_more_threads_than_the_cores(endpoint: Endpoint) -> None:
    """clickhouse clients send max_threads=4 on machines of 2 cores, which a server takes."""
    sid = unique("threads")
    endpoint.ok("SET max_threads = 4", session=sid)
    assert endpoint.ok("SELECT getSetting('max_threads')", session=sid) == "4\n"
    assert endpoint.ok("SELECT 1", READER, params={"max_threads": "4"}) == "1\n"
    r = endpoint.ask("SELECT 1", READER, params={"max_threads": "100000"})
    refused(r, {452})
    assert "max_threads" in r.text


# --- the endpoint's log ------------------------------------------------------------------------


def test_no_request_writes_a_line_of_its_own_into_the_log(endpoint: Endpoint) -> None:
    """send_logs_level=trace with a comment holding a newline wrote an attacker's line at the
    start of a line of the endpoint's log."""
    marker = unique("FORGED")
    forged = f"SELECT 1 /*\n{marker} ERROR gpugap: the admin password is hunter2\n*/"
    for who in (ADMIN, READER):
        endpoint.ask(forged, who, params={"send_logs_level": "trace"})
        endpoint.ask(forged + " FROM nowhere", who, params={"send_logs_level": "trace"})
        endpoint.ask("SELECT 1", who, params={"query_id": f"q\n{marker}"})
        r = endpoint.ask("SET send_logs_level = 'trace'", who, session=unique("s"))
        refused(r, {452, 164})
    time.sleep(0.5)
    lines = endpoint.log.read_text(errors="replace").splitlines()
    assert not [line for line in lines if line.startswith(marker)], "a forged line in the log"
