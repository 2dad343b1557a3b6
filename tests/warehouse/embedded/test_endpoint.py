"""The protocol suite: the endpoint driven only through clickhouse-connect and plain HTTP.

The same tests run against a real ClickHouse server when GPUGAP_CLICKHOUSE_URL is set
(those that start their own endpoint process test the embedded one on purpose)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError
from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas.errors import ConfigError
from gpugap.services.kafka import free_port
from gpugap.warehouse.client import client_options, connect
from tests.harness.embedded_clickhouse import EmbeddedClickHouse
from tests.harness.warehouse import READER_PASSWORD

COLUMNS = (
    "lc LowCardinality(String), s String, dt DateTime('UTC'), dt64 DateTime64(3, 'UTC'), "
    "u8 UInt8, u16 UInt16, u32 UInt32, u64 UInt64, i32 Int32, i64 Int64, f32 Float32, "
    "f64 Float64, arr Array(String), ndt Nullable(DateTime64(3, 'UTC')), ni Nullable(Int32), "
    "nu Nullable(UInt32), ns Nullable(String)"
)
NAMES = [
    "lc",
    "s",
    "dt",
    "dt64",
    "u8",
    "u16",
    "u32",
    "u64",
    "i32",
    "i64",
    "f32",
    "f64",
    "arr",
    "ndt",
    "ni",
    "nu",
    "ns",
]


def sample_rows() -> list[list[object]]:
    t = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
    return [
        [
            "node001",
            "slurm/prod/42",
            t,
            t + timedelta(milliseconds=123),
            255,
            60_000,
            4_000_000_000,
            2**63,
            -7,
            -(2**40),
            0.25,
            1 / 3,
            ["a", "b"],
            t,
            -1,
            7,
            "x",
        ],
        [
            "",
            "ünïcødé ✓",
            t + timedelta(minutes=1),
            t,
            0,
            0,
            0,
            0,
            0,
            0,
            0.0,
            0.0,
            [],
            None,
            None,
            None,
            None,
        ],
    ]


def normalise(rows: list[tuple[object, ...]] | list[list[object]]) -> list[tuple[object, ...]]:
    out = []
    for row in rows:
        vals = []
        for value in row:
            v = value
            if isinstance(v, datetime):
                v = v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)
            if isinstance(v, float):
                v = round(v, 6)
            vals.append(v)
        out.append(tuple(vals))
    return out


@pytest.fixture
def client(clickhouse: ClickHouseSettings) -> Iterator[Any]:
    c = connect(clickhouse)
    yield c
    c.close()


def test_every_column_type_round_trips_sync_and_async(
    client: Any, clickhouse: ClickHouseSettings
) -> None:
    c = client
    c.command(f"CREATE TABLE types ({COLUMNS}) ENGINE = MergeTree ORDER BY s")
    c.insert("types", sample_rows(), column_names=NAMES)
    got = c.query(f"SELECT {', '.join(NAMES)} FROM types ORDER BY u8 DESC").result_rows
    assert normalise(got) == normalise(sample_rows())

    async def via_async() -> list[tuple[object, ...]]:
        ac = await clickhouse_connect.get_async_client(**client_options(clickhouse))
        try:
            await ac.command(f"CREATE TABLE types2 ({COLUMNS}) ENGINE = MergeTree ORDER BY s")
            await ac.insert("types2", sample_rows(), column_names=NAMES)
            return (
                await ac.query(f"SELECT {', '.join(NAMES)} FROM types2 ORDER BY u8 DESC")
            ).result_rows
        finally:
            await ac.close()

    assert normalise(asyncio.run(via_async())) == normalise(sample_rows())
    df = c.query_df("SELECT u32, s FROM types ORDER BY u32")
    assert list(df["u32"]) == [0, 4_000_000_000]
    table = c.query_arrow("SELECT i64 FROM types ORDER BY i64")
    assert table.column("i64").to_pylist() == [-(2**40), 0]


def test_a_million_rows_in_one_chunked_lz4_insert_land_whole(
    clickhouse: ClickHouseSettings,
) -> None:
    c = clickhouse_connect.get_client(**{**client_options(clickhouse), "compress": "lz4"})
    c.command(
        "CREATE TABLE big (n UInt64, g LowCardinality(String), v Float32) "
        "ENGINE = MergeTree ORDER BY n"
    )
    n = 1_000_000
    cols = [list(range(n)), [f"GPU-{i % 64}" for i in range(n)], [float(i % 7) for i in range(n)]]
    summary = c.insert("big", cols, column_names=["n", "g", "v"], column_oriented=True)
    assert summary.written_rows == n
    count, total, groups = c.query("SELECT count(), sum(n), uniqExact(g) FROM big").result_rows[0]
    assert (count, total, groups) == (n, n * (n - 1) // 2, 64)
    c.close()


def test_errors_carry_clickhouse_code_and_message(
    client: Any, clickhouse: ClickHouseSettings
) -> None:
    with pytest.raises(DatabaseError) as err:
        client.query("SELECT * FROM no_such_table")
    assert err.value.code == 60
    assert "Code: 60. DB::Exception:" in str(err.value) and "UNKNOWN_TABLE" in str(err.value)
    r = requests.post(clickhouse.url, data="SELEC 1", auth=_auth(clickhouse), timeout=10)
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "62"
    assert r.text.startswith("Code: 62. DB::Exception:")


def test_wrong_password_and_anonymous_access_are_refused(clickhouse: ClickHouseSettings) -> None:
    wrong = clickhouse.model_copy(update={"password": SecretStr("nope")})
    with pytest.raises(ConfigError) as err:  # one line naming the settings to check
        connect(wrong)
    assert "516" in str(err.value) and "GPUGAP_CLICKHOUSE_PASSWORD" in str(err.value)
    r = requests.get(f"{clickhouse.url}/?query=SELECT+1", timeout=10)
    assert r.status_code in (401, 403) and r.headers["X-ClickHouse-Exception-Code"] == "516"
    ok = requests.get(
        f"{clickhouse.url}/?query=SELECT+1",
        timeout=10,
        headers={"X-ClickHouse-User": clickhouse.user, "X-ClickHouse-Key": _password(clickhouse)},
    )
    assert ok.status_code == 200 and ok.text == "1\n"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd", "lz4", "br"])
def test_compressed_responses_decode(
    client: Any, clickhouse: ClickHouseSettings, encoding: str
) -> None:
    r = requests.get(
        clickhouse.url,
        auth=_auth(clickhouse),
        timeout=10,
        stream=True,
        params={
            "query": "SELECT number FROM numbers(1000) FORMAT JSONEachRow",
            "enable_http_compression": "1",
        },
        headers={"Accept-Encoding": encoding},
    )
    assert r.status_code == 200
    if clickhouse.url.startswith("http://127.0.0.1") or encoding in ("gzip", "deflate"):
        assert r.headers.get("Content-Encoding") == encoding
    raw = r.raw.read()
    body = _decompress(raw, r.headers.get("Content-Encoding", ""))
    assert [json.loads(line)["number"] for line in body.splitlines()] == list(range(1000))
    mode = encoding if encoding in ("gzip", "lz4", "zstd") else True
    via_client = clickhouse_connect.get_client(**{**client_options(clickhouse), "compress": mode})
    try:
        assert via_client.query("SELECT sum(number) FROM numbers(100000)").result_rows == [
            (4_999_950_000,)
        ]
    finally:
        via_client.close()


def _decompress(raw: bytes, encoding: str) -> bytes:
    import cramjam

    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    codec = {"zstd": cramjam.zstd, "lz4": cramjam.lz4, "br": cramjam.brotli}.get(encoding)
    return bytes(codec.decompress(raw)) if codec else raw


def test_plain_http_forms(client: Any, clickhouse: ClickHouseSettings) -> None:
    url, auth, db = clickhouse.url, _auth(clickhouse), clickhouse.database
    assert requests.get(f"{url}/ping", timeout=10).text == "Ok.\n"
    client.command("CREATE TABLE kv (k String, v UInt32) ENGINE = MergeTree ORDER BY k")
    # query in the URL, data in the body (chunked), gzip-compressed request body
    chunks = (line.encode() for line in ["a,1\n", "b,2\n", "c,3\n"])
    r = requests.post(
        url,
        params={"query": "INSERT INTO kv FORMAT CSV", "database": db},
        data=chunks,
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert json.loads(r.headers["X-ClickHouse-Summary"])["written_rows"] == "3"
    body = gzip.compress(b'INSERT INTO kv FORMAT JSONEachRow\n{"k":"d","v":4}\n')
    r = requests.post(
        url,
        params={"database": db},
        data=body,
        auth=auth,
        timeout=10,
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    # query in the body, default_format, parameters, query id echoed
    r = requests.post(
        url,
        params={
            "database": db,
            "default_format": "JSONCompact",
            "param_min": "2",
            "query_id": "q-123",
        },
        data="SELECT k, v FROM kv WHERE v >= {min:UInt32} ORDER BY k",
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-ClickHouse-Format"] == "JSONCompact"
    assert r.headers["X-ClickHouse-Query-Id"] == "q-123"
    assert r.json()["data"] == [["b", 2], ["c", 3], ["d", 4]]
    # FORMAT clause wins; GET is read-only
    r = requests.get(
        url,
        params={"query": "SELECT sum(v) FROM kv FORMAT CSV", "database": db},
        auth=auth,
        timeout=10,
    )
    assert (r.text, r.headers["X-ClickHouse-Format"]) == ("10\n", "CSV")
    r = requests.get(url, params={"query": "DROP TABLE kv", "database": db}, auth=auth, timeout=10)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"
    # one statement per request
    r = requests.post(
        url, params={"database": db}, data="SELECT 1; DROP TABLE kv", auth=auth, timeout=10
    )
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "62"
    assert client.query("SELECT count() FROM kv").result_rows == [(4,)]


def test_read_only_user_reads_but_cannot_write(client: Any, clickhouse: ClickHouseSettings) -> None:
    if not clickhouse.url.startswith("http://127.0.0.1"):
        pytest.skip("the read-only BI user is configured on the embedded endpoint")
    client.command("CREATE TABLE ro (n UInt8) ENGINE = MergeTree ORDER BY n")
    reader = clickhouse.model_copy(
        update={"user": "reader", "password": SecretStr(READER_PASSWORD)}
    )
    c = connect(reader)
    try:
        assert c.query("SELECT count() FROM ro").result_rows == [(0,)]
        for statement in (
            "INSERT INTO ro VALUES (1)",
            "DROP TABLE ro",
            "CREATE TABLE x (a UInt8) ENGINE = Memory",
        ):
            with pytest.raises(DatabaseError) as err:
                c.command(statement)
            assert err.value.code == 164
    finally:
        c.close()


def test_readers_see_whole_inserts_while_a_writer_inserts(
    client: Any, clickhouse: ClickHouseSettings
) -> None:
    client.command("CREATE TABLE rw (batch UInt32, n UInt32) ENGINE = MergeTree ORDER BY batch")
    batches, per = 30, 5_000
    done = threading.Event()
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def write() -> None:
        w = connect(clickhouse)
        try:
            for b in range(batches):
                w.insert(
                    "rw",
                    [[b] * per, list(range(per))],
                    column_names=["batch", "n"],
                    column_oriented=True,
                )
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()
            w.close()

    def read() -> None:
        r = connect(clickhouse)
        try:
            while not done.is_set():
                seen.append(r.query("SELECT count(), uniqExact(batch) FROM rw").result_rows[0])
        except BaseException as exc:
            errors.append(exc)
        finally:
            r.close()

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(seen) > 5
    assert all(count == batches_seen * per for count, batches_seen in seen), (
        "a partial insert was visible"
    )
    assert client.query("SELECT count() FROM rw").result_rows == [(batches * per,)]


def test_an_engine_process_that_dies_stops_the_endpoint_and_says_so(tmp_path: Path) -> None:
    """The engine runs in a process of its own: if it dies (a crash on some query), the
    endpoint does not go on answering /ping with nothing behind it. It exits non-zero and its
    log says what happened, for a supervisor to restart it."""
    server = EmbeddedClickHouse(tmp_path / "data", free_port())
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    (engine,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    os.kill(int(engine), signal.SIGKILL)
    try:
        code = server.proc.wait(30)
    finally:
        server.stop()
    assert code not in (0, None)
    log = server.log.read_text(errors="replace")
    assert "the ClickHouse engine process ended" in log, log[-1000:]


def test_every_acknowledged_row_survives_kill_9(tmp_path: Path) -> None:
    server = EmbeddedClickHouse(tmp_path / "data", free_port())
    server.start()
    settings = ClickHouseSettings(
        url=server.url, database="default", password_file=server.password_file
    )
    acked = 0
    try:
        c = connect(settings)
        c.command("CREATE TABLE durable (n UInt64) ENGINE = MergeTree ORDER BY n")
        for b in range(20):
            c.insert("durable", [[b * 1000 + i] for i in range(1000)], column_names=["n"])
            acked += 1000
        c.close()
        server.kill()
        server.start()
        c = connect(settings)
        assert c.query("SELECT count(), sum(n) FROM durable").result_rows == [
            (acked, acked * (acked - 1) // 2)
        ]
        c.close()
    finally:
        server.stop()


def _password(settings: ClickHouseSettings) -> str:
    return settings.password.get_secret_value() if settings.password else ""


def _auth(settings: ClickHouseSettings) -> tuple[str, str]:
    return (settings.user, _password(settings))


def test_basic_auth_header_is_accepted(clickhouse: ClickHouseSettings) -> None:
    token = base64.b64encode(f"{clickhouse.user}:{_password(clickhouse)}".encode()).decode()
    r = requests.get(
        clickhouse.url,
        params={"query": "SELECT 2"},
        timeout=10,
        headers={"Authorization": f"Basic {token}"},
    )
    assert r.text == "2\n"


def test_session_settings_persist_within_the_session_only(clickhouse: ClickHouseSettings) -> None:
    url, auth = clickhouse.url, _auth(clickhouse)

    def max_threads(session: str | None) -> str:
        params = {"query": "SELECT value FROM system.settings WHERE name = 'max_threads'"}
        if session:
            params["session_id"] = session
        return requests.get(url, params=params, auth=auth, timeout=10).text.strip()

    default = max_threads(None)
    r = requests.post(
        url, params={"session_id": "s1"}, data="SET max_threads = 1", auth=auth, timeout=10
    )
    assert r.status_code == 200, r.text
    assert max_threads("s1") == "1"
    assert max_threads("s2") == default and max_threads(None) == default
    r = requests.post(
        url, params={"session_id": "s1"}, data="SET no_such_setting = 1", auth=auth, timeout=10
    )
    assert r.status_code == 404 and r.headers["X-ClickHouse-Exception-Code"] == "115"


@pytest.mark.parametrize("encoding", ["lz4", "gzip"])
def test_bodies_of_several_frames_split_anywhere_arrive_whole(
    client: Any, clickhouse: ClickHouseSettings, encoding: str
) -> None:
    """clickhouse-connect compresses an insert block by block: one body, many lz4 frames.
    Every frame must be decoded wherever the chunk boundaries fall (none silently dropped)."""
    import lz4.frame

    client.command("CREATE TABLE frames (n UInt32) ENGINE = MergeTree ORDER BY n")
    compress = lz4.frame.compress if encoding == "lz4" else gzip.compress
    parts = [b"INSERT INTO frames FORMAT CSV\n"] + [
        "".join(f"{i}\n" for i in range(k * 1000, (k + 1) * 1000)).encode() for k in range(20)
    ]
    body = b"".join(compress(p) for p in parts)

    def pieces(size: int) -> Iterator[bytes]:
        for i in range(0, len(body), size):
            yield body[i : i + size]

    for size in (7, 333, 4096, len(body)):
        client.command("TRUNCATE TABLE frames")
        r = requests.post(
            clickhouse.url,
            params={"database": clickhouse.database},
            data=pieces(size),
            auth=_auth(clickhouse),
            timeout=30,
            headers={"Content-Encoding": encoding},
        )
        assert r.status_code == 200, r.text
        assert client.query("SELECT count(), sum(n) FROM frames").result_rows == [
            (20_000, 20_000 * 19_999 // 2)
        ]
    truncated = body[: len(body) - 5]
    r = requests.post(
        clickhouse.url,
        params={"database": clickhouse.database},
        data=truncated,
        auth=_auth(clickhouse),
        timeout=30,
        headers={"Content-Encoding": encoding},
    )
    assert r.status_code != 200


def test_a_client_that_drops_mid_insert_leaves_the_endpoint_serving(
    client: Any, clickhouse: ClickHouseSettings
) -> None:
    import socket
    from urllib.parse import urlparse

    if not clickhouse.url.startswith("http://127.0.0.1"):
        pytest.skip("tests the embedded endpoint's engine lock")
    client.command("CREATE TABLE dropped (n UInt32) ENGINE = MergeTree ORDER BY n")
    url = urlparse(clickhouse.url)
    token = base64.b64encode(f"{clickhouse.user}:{_password(clickhouse)}".encode()).decode()
    head = (
        f"POST /?database={clickhouse.database}&query=INSERT%20INTO%20dropped%20FORMAT%20CSV"
        f" HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = "".join(f"{i}\n" for i in range(1000)).encode()
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(head.encode() + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        time.sleep(0.5)  # the insert is open in the engine, holding it
    # the connection is gone mid-body: the insert is cancelled and the engine free again
    started = time.monotonic()
    assert client.query("SELECT count() FROM dropped").result_rows == [(0,)]
    assert time.monotonic() - started < 10
