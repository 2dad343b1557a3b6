"""Query bodies that are forms, as ClickHouse's HTTP interface reads them (HTTPHandler.cpp's
DynamicQueryHandler::getQuery, HTMLForm.cpp): a multipart/form-data body's ``query`` and
``param_*`` fields are the query and its parameters (a URL parameter wins, the URL's ``query``
comes first), its other fields set nothing, its file parts are external tables (which the
embedded endpoint refuses); an application/x-www-form-urlencoded body is SQL, as any body.

The tests that need no embedded user or limit also run against a real ClickHouse server
(GPUGAP_CLICKHOUSE_URL): the same answers are expected of it."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.binding import MAX_URL_BIND_PARAM_LENGTH, use_form_encoding
from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.services.kafka import free_port
from gpugap.warehouse.client import client_options, connect
from gpugap.warehouse.embedded import form
from gpugap.warehouse.embedded.errors import EngineError
from gpugap.warehouse.embedded.limits import EndpointLimits
from tests.harness.embedded_clickhouse import EmbeddedClickHouse
from tests.harness.warehouse import CLICKHOUSE_PASSWORD, READER_PASSWORD


def embedded(settings: ClickHouseSettings) -> bool:
    return settings.url.startswith("http://127.0.0.1")


def _password(settings: ClickHouseSettings) -> str:
    return settings.password.get_secret_value() if settings.password else ""


def _reader(settings: ClickHouseSettings) -> ClickHouseSettings:
    if not embedded(settings):
        pytest.skip("the read-only BI user is configured on the embedded endpoint")
    return settings.model_copy(update={"user": "reader", "password": SecretStr(READER_PASSWORD)})


@dataclass
class Answer:
    status: int
    code: str | None  # X-ClickHouse-Exception-Code
    text: str


def curl(settings: ClickHouseSettings, *args: str, url_query: str = "") -> Answer:
    """The curl on this machine, as a user would run it: ``args`` are its own arguments."""
    url = f"{settings.url}/?database={settings.database}{url_query}"
    out = subprocess.run(
        ["curl", "-sS", "-D", "-", "-u", f"{settings.user}:{_password(settings)}", *args, url],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    head, _, text = out.partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
    code = headers.get("x-clickhouse-exception-code")
    return Answer(int(lines[0].split()[1]), code, text)


def ids(n: int) -> list[str]:
    return [f"slurm/prod/{i:08d}" for i in range(n)]


@pytest.fixture
def allocations(clickhouse: ClickHouseSettings) -> Iterator[Any]:
    """A client on the test's database with a table of 600 allocation ids (as the report's
    ``WHERE allocation_id IN {ids:Array(String)}`` reads)."""
    c = connect(clickhouse)
    c.command("CREATE TABLE ids (allocation_id String) ENGINE = MergeTree ORDER BY tuple()")
    c.insert("ids", [[i] for i in ids(600)], column_names=["allocation_id"])
    try:
        yield c
    finally:
        c.close()


SELECTED = "SELECT allocation_id FROM ids WHERE allocation_id IN {ids:Array(String)} ORDER BY 1"


def test_clickhouse_connect_sends_over_4_kib_of_parameters_as_a_form(
    clickhouse: ClickHouseSettings, allocations: Any
) -> None:
    wanted = ids(600)[::2]
    params = {"ids": wanted}
    # the driver's own rule: these parameters go as a multipart form, not in the URL
    bound = {"param_ids": "['" + "','".join(wanted) + "']"}
    assert len(bound["param_ids"]) > MAX_URL_BIND_PARAM_LENGTH
    assert use_form_encoding(SELECTED, bound)
    got = allocations.query(SELECTED, parameters=params).result_rows
    assert got == [(i,) for i in wanted]
    assert allocations.command(
        "SELECT count() FROM ids WHERE allocation_id IN {ids:Array(String)}", parameters=params
    ) == len(wanted)

    async def via_async() -> list[tuple[object, ...]]:
        ac = await clickhouse_connect.get_async_client(**client_options(clickhouse))
        try:
            return list((await ac.query(SELECTED, parameters=params)).result_rows)
        finally:
            await ac.close()

    assert asyncio.run(via_async()) == [(i,) for i in wanted]


def test_form_encode_query_params_sends_every_query_as_a_form(
    clickhouse: ClickHouseSettings, allocations: Any
) -> None:
    c = clickhouse_connect.get_client(**client_options(clickhouse), form_encode_query_params=True)
    try:
        assert c.query(SELECTED, parameters={"ids": ids(3)}).result_rows == [(i,) for i in ids(3)]
        c.command("INSERT INTO ids SELECT {id:String}", parameters={"id": "k8s/new"})
        assert c.query("SELECT count() FROM ids").result_rows == [(601,)]
        df = c.query_df("SELECT {n:UInt32} AS n", parameters={"n": 7})
        assert list(df["n"]) == [7]
    finally:
        c.close()


def test_curl_form_fields_are_the_query_and_its_parameters(clickhouse: ClickHouseSettings) -> None:
    r = curl(clickhouse, "-F", "query=SELECT {x:UInt8}", "-F", "param_x=7")
    assert (r.status, r.text) == (200, "7\n"), r
    # ClickHouse's own example (docs: HTTP interface, parameterized queries)
    r = curl(
        clickhouse,
        "-X", "POST", "-F", "query=select {p1:UInt8} + {p2:UInt8}", "-F", "param_p1=3",
        "-F", "param_p2=4",
    )  # fmt: skip
    assert (r.status, r.text) == (200, "7\n"), r
    # the URL's query comes first, the form's follows it (as they come, nothing between)
    r = curl(clickhouse, "-F", "query=1 + {x:UInt8}", "-F", "param_x=2",
             url_query="&query=SELECT%20")  # fmt: skip
    assert (r.status, r.text) == (200, "3\n"), r
    # a URL parameter wins over a form field of the same name
    r = curl(clickhouse, "-F", "query=SELECT {x:UInt8}", "-F", "param_x=2",
             url_query="&param_x=5")  # fmt: skip
    assert (r.status, r.text) == (200, "5\n"), r
    # the body is not SQL: no query field, no query
    r = curl(clickhouse, "-F", "param_x=2")
    assert (r.status, r.code) == (400, "62") and "Empty query" in r.text, r


def test_a_urlencoded_body_is_the_querys_text_as_in_clickhouse(
    clickhouse: ClickHouseSettings,
) -> None:
    """ClickHouse reads no form from an x-www-form-urlencoded body (its docs send SQL with
    ``curl -d``, which labels the body so): the body is SQL, whatever it looks like."""
    r = curl(clickhouse, "-d", "SELECT 1 + {x:UInt8}", url_query="&param_x=1")
    assert (r.status, r.text) == (200, "2\n"), r
    # the body "SELECT+1" is SQL (SELECT +1); read as a form it would hold no query
    r = curl(clickhouse, "--data-urlencode", "SELECT 1")
    assert (r.status, r.text) == (200, "1\n"), r
    # "query=SELECT+1" is SQL that names `query`: a syntax error to a server (62); the
    # embedded engine reads a bare expression as a SELECT (clickhouse-local's
    # implicit_select) and finds no such column (47)
    r = curl(clickhouse, "--data-urlencode", "query=SELECT 1")
    assert r.status in (400, 404) and r.code in ("62", "47") and "query" in r.text, r


def test_other_form_fields_are_no_settings_as_in_clickhouse(
    clickhouse: ClickHouseSettings,
) -> None:
    """ClickHouse takes settings, ``database`` and ``default_format`` from the URL (and the
    headers) before it reads the form: the same fields in the form change nothing."""
    r = curl(
        clickhouse,
        "-F", "query=SELECT getSetting('max_result_rows'), currentDatabase()",
        "-F", "max_result_rows=1", "-F", "database=system", "-F", "default_format=JSON",
    )  # fmt: skip
    assert (r.status, r.text) == (200, f"0\t{clickhouse.database}\n"), r
    # the URL's settings hold for a form's query as for any other
    r = curl(clickhouse, "-F", "query=SELECT getSetting('max_result_rows')",
             url_query="&max_result_rows=5&default_format=CSV")  # fmt: skip
    assert (r.status, r.text) == (200, "5\n"), r


def test_a_readers_form_fields_lift_nothing(clickhouse: ClickHouseSettings) -> None:
    """The read-only user: ``readonly=0`` and a setting off the list are refused in the URL
    (164, 452) whatever the body is; as form fields they are not settings at all, so the
    query still runs read-only, with the setting untouched."""
    reader = _reader(clickhouse)
    query = "query=SELECT getSetting('readonly'), getSetting('max_memory_usage_for_user')"
    r = curl(reader, "-F", query, url_query="&readonly=0")
    assert (r.status, r.code) == (403, "164"), r
    r = curl(reader, "-F", query, url_query="&max_memory_usage_for_user=1")
    assert (r.status, r.code) == (400, "452"), r
    r = curl(reader, "-F", query, "-F", "readonly=0", "-F", "max_memory_usage_for_user=1")
    assert r.status == 200 and r.text.split("\t")[0] == "1", r
    assert r.text.split("\t")[1].strip() != "1", r
    for statement in ("DROP TABLE gpu_hours", "CREATE TABLE x (a UInt8) ENGINE = Memory"):
        r = curl(reader, "-F", f"query={statement}", "-F", "readonly=0")
        assert (r.status, r.code) == (403, "164"), (statement, r)
    # the admin's URL readonly=1 holds for the form's query too
    r = curl(clickhouse, "-F", "query=CREATE TABLE x (a UInt8) ENGINE = Memory",
             url_query="&readonly=1")  # fmt: skip
    assert (r.status, r.code) == (403, "164"), r


def test_a_file_part_is_refused_as_external_data(
    clickhouse: ClickHouseSettings, tmp_path: Path
) -> None:
    if not embedded(clickhouse):
        pytest.skip("a ClickHouse server reads file parts as external tables")
    data = tmp_path / "passwd.tsv"
    data.write_text("root\t0\n")
    r = curl(clickhouse, "-F", "passwd=@" + str(data), "-F", "query=SELECT count() FROM passwd",
             url_query="&passwd_structure=login+String,uid+UInt32")  # fmt: skip
    assert (r.status, r.code) == (501, "48"), r
    assert "External data" in r.text and "'passwd'" in r.text, r


# --- the reading of a body, without an endpoint -------------------------------------------


def test_parse_reads_fields_as_htmlform_does() -> None:
    body = (
        b"a preamble, ignored\r\n--B\r\n"
        b'Content-Disposition: form-data; name="query"\r\nContent-Type: text/plain\r\n\r\n'
        b"SELECT {x:UInt8},\r\n\r\n'--B is content here'\r\n--B  \r\n"
        b"Content-Disposition: form-data; name*=utf-8''param_%C3%A9\r\n\r\n\xc3\xa9\r\n--B\r\n"
        b'Content-Disposition: form-data; name="a\\"b"\r\n\r\n\r\n--B\r\n'
        b"\r\nno headers, no name\r\n--B--\r\nan epilogue, ignored"
    )
    assert form.parse(body, "B", EndpointLimits()) == [
        ("query", "SELECT {x:UInt8},\r\n\r\n'--B is content here'"),
        ("param_é", "é"),
        ('a"b', ""),
        ("", "no headers, no name"),
    ]
    assert form.bind_params([("param_x", "1"), ("param_x", "2"), ("x", "3")]) == {"x": "1"}
    with pytest.raises(EngineError) as err:
        form.parse(b'--B\r\nContent-Disposition: form-data; name="t"; filename*=utf-8\'\'t.csv'
                   b"\r\n\r\n1\r\n--B--", "B", EndpointLimits())  # fmt: skip
    assert err.value.code == 48 and "'t'" in err.value.message
    for cut in (b"--B", b"--B\r\n\r\nx", b"--B\r\n\r\nx\r\n--B\r\n"):
        with pytest.raises(EngineError) as err:
            form.parse(cut, "B", EndpointLimits())
        assert err.value.code == 33, cut


# --- bounds ----------------------------------------------------------------------------------

MAX_FORM_BYTES, MAX_FORM_FIELDS, MAX_URI_BYTES = 64 << 10, 8, 16 << 10


@pytest.fixture
def small(tmp_path: Path) -> Iterator[ClickHouseSettings]:
    """An endpoint of this test's own with small form limits."""
    server = EmbeddedClickHouse(
        tmp_path / "data",
        free_port(),
        env={
            "GPUGAP_CLICKHOUSE_PASSWORD": CLICKHOUSE_PASSWORD,
            "GPUGAP_CLICKHOUSE_SERVE_MAX_FORM_BYTES": str(MAX_FORM_BYTES),
            "GPUGAP_CLICKHOUSE_SERVE_MAX_FORM_FIELDS": str(MAX_FORM_FIELDS),
            "GPUGAP_CLICKHOUSE_SERVE_MAX_URI_BYTES": str(MAX_URI_BYTES),
        },
    )
    server.start()
    try:
        yield ClickHouseSettings(url=server.url, password=CLICKHOUSE_PASSWORD)
    finally:
        server.stop()


def _post(s: ClickHouseSettings, fields: list[tuple[str, str]] | bytes, **headers: str) -> Any:
    files = None if isinstance(fields, bytes) else [(k, (None, v)) for k, v in fields]
    return requests.post(
        s.url,
        files=files,
        data=fields if isinstance(fields, bytes) else None,
        headers=headers,
        auth=(s.user, _password(s)),
        timeout=30,
    )


def test_forms_past_the_limits_get_a_clear_error(small: ClickHouseSettings) -> None:
    def refused(r: Any, status: int, code: str, *words: str) -> None:
        assert (r.status_code, r.headers["X-ClickHouse-Exception-Code"]) == (status, code), r.text
        assert r.text.startswith(f"Code: {code}. DB::Exception: "), r.text
        assert all(w in r.text for w in words), r.text

    params = [(f"param_p{i}", "1") for i in range(MAX_FORM_FIELDS - 1)]
    query = "SELECT " + " + ".join(f"{{p{i}:UInt8}}" for i in range(MAX_FORM_FIELDS - 1))
    ok = _post(small, [("query", query), *params])
    assert (ok.status_code, ok.text) == (200, f"{MAX_FORM_FIELDS - 1}\n"), ok.text
    refused(_post(small, [("query", query), *params, ("param_extra", "1")]), 413, "290",
            "Too many form fields", "MAX_FORM_FIELDS")  # fmt: skip
    refused(_post(small, [("query", "SELECT {v:String}"), ("param_v", "x" * (MAX_URI_BYTES + 1))]),
            413, "290", "Field value too long", "MAX_URI_BYTES")  # fmt: skip
    refused(_post(small, [("x" * (MAX_URI_BYTES + 1), "1"), ("query", "SELECT 1")]),
            413, "290", "Field name too long", "MAX_URI_BYTES")  # fmt: skip
    big = [(f"param_v{i}", "x" * (MAX_URI_BYTES - 100)) for i in range(5)]  # each field fits
    refused(_post(small, [("query", "SELECT 1"), *big]), 413, "290",
            "larger than", "MAX_FORM_BYTES")  # fmt: skip
    # malformed: cut short, or no boundary at all
    cut = b'--B\r\nContent-Disposition: form-data; name="query"\r\n\r\nSELECT 1'
    kind = "multipart/form-data; boundary=B"
    refused(_post(small, cut, **{"Content-Type": kind}), 400, "33", "last boundary")
    refused(_post(small, b"SELECT 1", **{"Content-Type": kind}), 400, "1000", "No boundary")
    refused(_post(small, b"SELECT 1", **{"Content-Type": "multipart/form-data"}), 400, "1000",
            "no boundary")  # fmt: skip
    # and the endpoint goes on answering
    assert _post(small, [("query", "SELECT 42")]).text == "42\n"
