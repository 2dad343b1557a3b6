"""The second security review's attacks on the embedded endpoint, one test each: settings that
read or write host files, one user starving the others, cross-site requests, other users'
query text, and what real clients need of settings and sessions.

All traffic goes to 127.0.0.1; every loop is bounded in count and in time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpugap.warehouse.embedded import allowed
from tests.security.conftest import (
    ADMIN,
    READER,
    Endpoint,
    User,
    describe,
    poll,
    refused,
    running,
    unique,
)

WHO = {"admin": ADMIN, "reader": READER}

# --- settings that name a file, a URL or a schema ---------------------------------------------

# (setting, value, query): each reads or writes the host, or reaches the network, when allowed
FILE_SETTINGS = {
    "output_format_schema": ("{dir}/authorized_keys", "SELECT 1 AS ssh_key FORMAT Protobuf"),
    "format_template_row": ("/etc/passwd", "SELECT 1 FORMAT Template"),
    "format_template_resultset": ("/etc/passwd", "SELECT 1 FORMAT Template"),
    "format_schema": ("/etc/passwd:Message", "SELECT 1 FORMAT Protobuf"),
    "format_avro_schema_registry_url": (
        "http://127.0.0.1:{port}/",
        "SELECT 1 FORMAT AvroConfluent",
    ),
    "input_format_record_errors_file_path": ("{dir}/errors", "SELECT 1"),
}


@pytest.mark.parametrize("who", WHO.values(), ids=WHO.keys())
@pytest.mark.parametrize("setting", FILE_SETTINGS.keys())
def test_settings_that_name_a_file_or_url_are_refused(
    endpoint: Endpoint, tmp_path: Path, who: User, setting: str
) -> None:
    value, query = FILE_SETTINGS[setting]
    value = value.format(dir=tmp_path, port=endpoint.port)
    as_param = endpoint.ask(query, who, params={setting: value})
    refused(as_param, {452})
    assert "root:" not in as_param.text, describe(as_param)
    sid = unique("s")
    refused(endpoint.ask(f"SET {setting} = '{value}'", who, session=sid), {452, 164})
    # in a query's own SETTINGS clause the engine refuses it (a constant in its profile)
    clause = endpoint.ask(f"SELECT 1 SETTINGS {setting} = '{value}'", who)
    refused(clause, {452, 164})
    written = sorted(p.name for p in tmp_path.iterdir())
    assert not written, f"the endpoint wrote {written}"


def test_every_allowed_setting_is_reviewed_and_none_names_a_path_file_url_or_schema(
    endpoint: Endpoint,
) -> None:
    """The list is the engine's own settings less those that speak of the host (derived by
    allowed.derive, committed as allowed_settings.txt), and the engine agrees about each."""
    rows = [
        json.loads(line)
        for line in endpoint.ok(
            "SELECT name, description, alias_for, readonly FROM system.settings FORMAT JSONEachRow"
        ).splitlines()
    ]
    committed = allowed.committed()
    assert allowed.derive(rows) == committed, (
        "allowed_settings.txt is not what allowed.derive() gives for this engine: run "
        "`python -m warehouse.embedded.allowed` and review the difference"
    )
    words = re.compile(r"\b(paths?|files?|filenames?|urls?|uris?|schemas?)\b", re.IGNORECASE)
    by_name = {r["name"]: r for r in rows}
    for name in committed:
        row = by_name[name]
        if row["alias_for"]:  # its text is its target's
            row = by_name[row["alias_for"]]
        text = f"{name.replace('_', ' ')} {row['description']}"
        assert not words.search(text), f"{name} is allowed but speaks of {words.search(text)}"
        assert by_name[name]["readonly"] == 0, f"{name} is allowed but constant in the engine"
    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert allowed.doc_block(doc) == allowed.render_doc(committed), (
        "docs/security.md does not list the allowed settings as they are: run "
        "`python -m warehouse.embedded.allowed --write`"
    )
    constant = {r["name"] for r in rows if r["readonly"]}
    for name in ("output_format_schema", "format_template_row", "format_schema"):
        assert name in constant, f"{name} is changeable in the engine"


# --- Grafana's ad hoc filters: SQL in a setting ------------------------------------------------


@pytest.fixture
def filtered(endpoint: Endpoint) -> str:
    name = unique("filtered")
    endpoint.ok(f"CREATE TABLE {name} (n UInt32) ENGINE = MergeTree ORDER BY n")
    endpoint.ok(f"INSERT INTO {name} SELECT number FROM numbers(10)")
    return name


def test_additional_table_filters_work_and_cannot_read_the_host(
    endpoint: Endpoint, filtered: str
) -> None:
    good = {"additional_table_filters": f"{{'{filtered}': 'n >= 7'}}"}
    for who in (ADMIN, READER):
        assert endpoint.ok(f"SELECT count() FROM {filtered}", who, params=good) == "3\n"
    result = {"additional_result_filter": "n < 2"}
    assert endpoint.ok(f"SELECT n FROM {filtered}", READER, params=result) == "0\n1\n"
    sid = unique("s")  # in a session, each request carries its own filters
    assert endpoint.ok(f"SELECT n FROM {filtered}", session=sid, params=result) == "0\n1\n"
    assert endpoint.ok(f"SELECT count() FROM {filtered}", session=sid) == "10\n"
    bad = {"additional_table_filters": f"{{'{filtered}': 'toUInt8(file(\\'/etc/passwd\\')) = 1'}}"}
    for who in (ADMIN, READER):
        r = endpoint.ask(f"SELECT count() FROM {filtered}", who, params=bad)
        refused(r, {497})
        assert "root:" not in r.text, describe(r)
        r = endpoint.ask(f"SELECT n FROM {filtered}", who, session=unique("s"), params=bad)
        refused(r, {497})
        # in SET or a query's own SETTINGS clause the same check holds (tests/security/
        # test_third_pass.py has what they let through)
        sid = unique("s")
        hostile = "SET additional_result_filter = 'file(\\'/etc/passwd\\') != \\'\\''"
        r = endpoint.ask(hostile, who, session=sid)
        refused(r, {497})
        clause = endpoint.ask(
            f"SELECT count() FROM {filtered} SETTINGS additional_result_filter = "
            "'toUInt8(file(\\'/etc/passwd\\')) = 1'",
            who,
        )
        refused(clause, {497})
        assert "root:" not in clause.text


# --- one user cannot starve the others ----------------------------------------------------------


def test_a_reader_filling_every_slot_does_not_stall_the_admin_or_the_sink(
    tmp_path: Path,
) -> None:
    with running(tmp_path, {"GPUGAP_CLICKHOUSE_SERVE_QUEUE_WAIT_S": "1"}) as ep:
        table = unique("sink")
        ep.ok(f"CREATE TABLE {table} (n UInt32) ENGINE = MergeTree ORDER BY n")
        answers: list[requests.Response | None] = []

        def slow() -> None:
            answers.append(
                ep.timed(
                    "SELECT sleepEachRow(0.5) FROM numbers(10)",
                    READER,
                    params={"max_block_size": "1"},
                    timeout=30,
                )[1]
            )

        readers = [threading.Thread(target=slow, name=f"slow-{i}") for i in range(16)]
        for t in readers:
            t.start()
        try:
            time.sleep(1.5)  # the reader's 8 run, its other 8 have waited their second
            took, one = ep.timed("SELECT 1", ADMIN, timeout=10)
            assert one is not None and one.text == "1\n", describe(one)
            assert took < 1.0, f"the admin's SELECT 1 waited {took:.2f} s"
            took, ins = ep.timed(None, ADMIN, params={"query": f"INSERT INTO {table} FORMAT CSV"},
                                 body=b"1\n2\n", timeout=10)  # fmt: skip
            assert ins is not None and ins.status_code == 200, describe(ins)
            assert took < 1.0, f"the sink's insert waited {took:.2f} s"
        finally:
            for t in readers:
                t.join(30)
        codes = [r.headers.get("X-ClickHouse-Exception-Code") if r is not None else "none"
                 for r in answers]  # fmt: skip
        assert len(codes) == 16, codes
        assert codes.count("202") == 8 and codes.count(None) == 8, (
            f"the reader's 16 queries: 8 should run (its share), 8 get 202: {codes}"
        )
        assert ep.ok(f"SELECT count() FROM {table}") == "2\n"


# --- the browser: other origins, other host names ----------------------------------------------


def _post(ep: Endpoint, headers: dict[str, str], sql: str) -> requests.Response:
    """A request as a web page's fetch() sends it: text/plain, no credentials of its own."""
    return requests.post(
        f"{ep.url}/", data=sql, headers={"Content-Type": "text/plain", **headers}, timeout=10
    )


@pytest.fixture
def open_endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    """No password at all (--insecure-no-password), on 127.0.0.1: only the browser checks
    stand between a web page and the warehouse."""
    with running(
        tmp_path,
        {
            "GPUGAP_CLICKHOUSE_PASSWORD": "",
            "GPUGAP_CLICKHOUSE_SERVE_ALLOWED_ORIGINS": "http://grafana.example:3000",
            "GPUGAP_CLICKHOUSE_SERVE_ALLOWED_HOSTS": "gpugap.warehouse.internal",
        },
        flags=["--insecure-no-password"],
    ) as ep:
        yield ep


def test_a_web_page_of_another_origin_or_host_name_is_refused(open_endpoint: Endpoint) -> None:
    ep = open_endpoint
    table = unique("victim")
    assert _post(ep, {}, f"CREATE TABLE {table} (n UInt8) ENGINE = Memory").status_code == 200
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{ep.port}.evil.example"):
        r = _post(ep, {"Origin": origin}, f"DROP TABLE {table}")
        refused(r, {497}, status=403)
    rebound = requests.get(
        f"{ep.url}/", params={"query": f"SELECT count() FROM {table}"},
        headers={"Host": f"attacker.example:{ep.port}"}, timeout=10,
    )  # fmt: skip
    refused(rebound, {497}, status=403)
    # its own page (/play), a listed origin, a listed host name, and clients without Origin
    assert _post(ep, {"Origin": f"http://127.0.0.1:{ep.port}"}, "SELECT 1").text == "1\n"
    assert _post(ep, {"Origin": "http://grafana.example:3000"}, "SELECT 1").text == "1\n"
    listed = requests.get(
        f"{ep.url}/", params={"query": "SELECT 2"},
        headers={"Host": f"gpugap.warehouse.internal:{ep.port}"}, timeout=10,
    )  # fmt: skip
    assert listed.text == "2\n", describe(listed)
    local = requests.get(f"http://localhost:{ep.port}/", params={"query": "SELECT 3"}, timeout=10)
    assert local.text == "3\n", describe(local)
    assert _post(ep, {}, f"SELECT count() FROM {table}").text == "0\n"  # still there


# --- other users' query text --------------------------------------------------------------------


def test_the_reader_sees_only_its_own_running_queries(endpoint: Endpoint) -> None:
    marker = unique("secret_admin_query")
    done = threading.Event()

    def admin_query() -> None:
        endpoint.timed(f"SELECT sleepEachRow(0.5), '{marker}' FROM numbers(8) FORMAT Null",
                       ADMIN, params={"max_block_size": "1"}, timeout=20)  # fmt: skip
        done.set()

    worker = threading.Thread(target=admin_query, name="admin-query")
    worker.start()
    try:
        seen = "SELECT query FROM system.processes"
        assert poll(lambda: marker in endpoint.ok(seen, ADMIN), within=5), "never started"
        mine = endpoint.ok(f"SELECT query FROM system.processes /* {unique('r')} */", READER)
        assert marker not in mine, "the reader sees the admin's query text"
        assert "system.processes" in mine, f"the reader does not see its own query: {mine!r}"
        for table in ("system.processes", "system.query_cache", "system.asynchronous_inserts"):
            text = endpoint.ok(f"SELECT * FROM {table} FORMAT JSONEachRow", READER)
            assert marker not in text, f"{table} shows the admin's query to the reader"
    finally:
        worker.join(25)
    assert done.is_set()


# --- what real clients need ---------------------------------------------------------------------


def test_a_session_keeps_its_temporary_tables_and_is_one_request_at_a_time(
    endpoint: Endpoint,
) -> None:
    sid, tt = unique("s"), unique("tt")
    endpoint.ok(f"CREATE TEMPORARY TABLE {tt} (a UInt8)", session=sid)
    endpoint.ok(f"INSERT INTO {tt} VALUES (1), (2)", session=sid)
    assert endpoint.ok(f"SELECT sum(a) FROM {tt}", session=sid) == "3\n"
    refused(endpoint.ask(f"SELECT * FROM {tt}"), {60})  # outside the session: unknown
    # a setting given with one request does not outlive it; a SET does
    endpoint.ok("SELECT 1", session=sid, params={"max_block_size": "7"})
    value = "SELECT getSetting('max_block_size')"
    assert endpoint.ok(value, session=sid) != "7\n"
    endpoint.ok("SET max_block_size = 9", session=sid)
    assert endpoint.ok(value, session=sid) == "9\n"
    # while one request runs in it, another one of the same session is refused (373)
    slow = threading.Thread(
        target=endpoint.timed,
        args=("SELECT sleepEachRow(0.5) FROM numbers(4) FORMAT Null", ADMIN),
        kwargs={"session": sid, "params": {"max_block_size": "1"}, "timeout": 20},
    )
    slow.start()
    try:
        time.sleep(0.7)
        refused(endpoint.ask("SELECT 1", session=sid), {373})
    finally:
        slow.join(20)
    assert endpoint.ok(f"SELECT count() FROM {tt}", session=sid) == "2\n"
    refused(endpoint.ask("SELECT 1", session=unique("none"), params={"session_check": "1"}),
            {372})  # fmt: skip


def test_a_users_many_sessions_never_end_another_users_session(tmp_path: Path) -> None:
    with running(tmp_path, {"GPUGAP_CLICKHOUSE_SERVE_MAX_SESSIONS": "3"}) as ep:
        sid, tt = unique("s"), unique("tt")
        ep.ok(f"CREATE TEMPORARY TABLE {tt} (a UInt8)", session=sid)
        for _ in range(6):
            ep.ok("SET max_block_size = 5", READER, session=unique("r"))
        assert ep.ok(f"SELECT count() FROM {tt}", session=sid) == "0\n"


def test_format_values_is_named_in_the_format_header(endpoint: Endpoint) -> None:
    r = endpoint.ask("SELECT 1, 'a' FORMAT Values", READER)
    assert r.text == "(1,'a')", describe(r)
    assert r.headers["X-ClickHouse-Format"] == "Values"
