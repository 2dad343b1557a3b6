"""The HTTP protocol details real ClickHouse drivers rely on, checked on the wire: Native at the
client's revision, ClickHouse's block compression (frames, checksums, bounds), the headers and
the summary, the static handlers. ClickHouse's own sources are the reference (HTTPHandler,
authenticateUserByHTTP, NativeWriter, CompressedReadBufferBase); clickhouse-go's decoder
(lib/proto/block.go) is re-implemented here for the types the tests use."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import clickhouse_connect
import lz4.block
import pytest
import requests
from backports import zstd
from clickhouse_cityhash.cityhash import CityHash128

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.client import client_options, connect

BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"
GO_REVISION = 54460  # clickhouse-go v2.47's ClientTCPProtocolVersion
EMBEDDED = "the embedded endpoint's own choices"


def _auth(s: ClickHouseSettings) -> tuple[str, str]:
    return (s.user, s.password.get_secret_value() if s.password else "")


def _get(s: ClickHouseSettings, query: str, **params: str) -> requests.Response:
    return requests.get(
        s.url, params={"query": query, "database": s.database, **params}, auth=_auth(s), timeout=30
    )


def _post(
    s: ClickHouseSettings, data: bytes, headers: dict[str, str] | None = None, **params: str
) -> requests.Response:
    return requests.post(
        s.url,
        params={"database": s.database, **params},
        data=data,
        auth=_auth(s),
        headers=headers or {},
        timeout=30,
    )


# --- Native at a revision -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("revision", "expected"),
    [
        (None, b"\x01\x01\x05check\x05UInt8\x01"),
        ("0", b"\x01\x01\x05check\x05UInt8\x01"),
        ("54405", BLOCK_INFO + b"\x01\x01\x05check\x05UInt8\x01"),  # clickhouse-connect's
        (str(GO_REVISION), BLOCK_INFO + b"\x01\x01\x05check\x05UInt8\x00\x01"),
    ],
)
def test_native_is_framed_for_the_clients_revision(
    clickhouse: ClickHouseSettings, revision: str | None, expected: bytes
) -> None:
    params = {"client_protocol_version": revision} if revision else {}
    r = _get(clickhouse, "SELECT 1 AS check FORMAT Native", **params)
    assert r.status_code == 200, r.text
    assert r.content == expected
    assert r.headers["Content-Type"] == "application/octet-stream"


def test_old_revisions_are_refused_low_cardinality_and_nonsense_is_refused(
    clickhouse: ClickHouseSettings,
) -> None:
    """Below 54405 ClickHouse sends LowCardinality as its plain type; the embedded endpoint
    does not convert (clients that old predate 2018) and says so instead of sending it."""
    if clickhouse.url.startswith("http://127.0.0.1"):
        r = _get(clickhouse, "SELECT toLowCardinality('a') AS l FORMAT Native",
                 client_protocol_version="54400")  # fmt: skip
        assert r.status_code == 501 and r.headers["X-ClickHouse-Exception-Code"] == "48"
        assert "LowCardinality(String)" in r.text
    r = _get(clickhouse, "SELECT 1 AS x FORMAT Native", client_protocol_version="54400")
    assert r.content == BLOCK_INFO + b"\x01\x01\x01x\x05UInt8\x01"
    r = _get(clickhouse, "SELECT 1 FORMAT Native", client_protocol_version="new")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "6"


def test_an_empty_native_result_is_its_header_block(clickhouse: ClickHouseSettings) -> None:
    """ClickHouse answers a Native query with no rows with one block of 0 rows naming the
    columns and their types (clickhouse-go takes the columns from it); chDB writes nothing."""
    _post(clickhouse, b"CREATE TABLE hollow (n UInt32, s LowCardinality(String)) "
          b"ENGINE = MergeTree ORDER BY n")  # fmt: skip
    header = b"\x02\x00\x01n\x06UInt32\x01s\x16LowCardinality(String)"
    for revision, want in (
        (None, header),
        (str(GO_REVISION), BLOCK_INFO + b"\x02\x00\x01n\x06UInt32\x00\x01s"
         b"\x16LowCardinality(String)\x00"),
    ):  # fmt: skip
        params = {"client_protocol_version": revision} if revision else {}
        r = _get(clickhouse, "SELECT n, s FROM hollow WHERE n > 5 FORMAT Native", **params)
        assert r.status_code == 200 and r.content == want, (revision, r.content)
        r = _get(clickhouse, "SELECT n, s FROM hollow", default_format="Native", **params)
        assert r.content == want


class GoReader:
    """clickhouse-go's Block.Decode at a revision (>= 54454), for the types used below."""

    def __init__(self, data: bytes, revision: int) -> None:
        self.data, self.pos, self.revision = data, 0, revision

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        assert len(out) == n, "short read"
        self.pos += n
        return out

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7

    def str(self) -> str:
        return self.take(self.uvarint()).decode()

    def u64s(self, n: int) -> list[int]:
        return list(struct.unpack(f"<{n}Q", self.take(8 * n)))

    def blocks(self) -> Iterator[dict[str, list[Any]]]:
        while self.pos < len(self.data):
            assert self.take(8) == BLOCK_INFO  # field 1 bool, field 2 int32 -1, 0
            columns, rows = self.uvarint(), self.uvarint()
            block = {}
            for _ in range(columns):
                name, kind = self.str(), self.str()
                assert self.take(1) == b"\x00", "has_custom_serialization"
                block[name] = self.column(kind, rows) if rows else []
            yield block

    def column(self, kind: str, rows: int) -> list[Any]:
        if kind == "UInt64":
            return self.u64s(rows)
        if kind == "String":
            return [self.str() for _ in range(rows)]
        if kind == "Nullable(String)":
            nulls = self.take(rows)
            values = [self.str() for _ in range(rows)]
            return [None if n else v for n, v in zip(nulls, values, strict=True)]
        if kind == "Array(UInt64)":
            ends = self.u64s(rows)
            flat = self.u64s(ends[-1]) if ends else []
            return [flat[a:b] for a, b in zip([0, *ends], ends, strict=False)]
        if kind == "LowCardinality(String)":
            assert self.u64s(1) == [1]  # ReadStatePrefix: the keys' serialization version
            flags, count = self.u64s(2)
            keys = [self.str() for _ in range(count)]
            width = (1, 2, 4, 8)[flags & 0xFF]
            (n,) = self.u64s(1)
            idx = struct.unpack(f"<{n}{'BHIQ'[flags & 0xFF]}", self.take(width * n))
            return [keys[i] for i in idx]
        raise AssertionError(f"type {kind} not in this test's reader")


def test_a_multi_block_result_decodes_with_clickhouse_go_semantics(
    clickhouse: ClickHouseSettings,
) -> None:
    query = (
        "SELECT number AS n, toString(number) AS s, if(number % 3 = 0, NULL, 'v') AS ns, "
        "CAST(range(number % 4), 'Array(UInt64)') AS a, "
        "toLowCardinality(concat('g', toString(number % 5))) AS lc "
        "FROM numbers(2500) ORDER BY n FORMAT Native"
    )
    r = _get(clickhouse, query, client_protocol_version=str(GO_REVISION), max_block_size="1000")
    assert r.status_code == 200, r.text
    blocks = list(GoReader(r.content, GO_REVISION).blocks())
    assert len(blocks) >= 3
    got = {k: [v for b in blocks for v in b[k]] for k in ("n", "s", "ns", "a", "lc")}
    assert got["n"] == list(range(2500))
    assert got["s"] == [str(i) for i in range(2500)]
    assert got["ns"] == [None if i % 3 == 0 else "v" for i in range(2500)]
    assert got["a"] == [list(range(i % 4)) for i in range(2500)]
    assert got["lc"] == [f"g{i % 5}" for i in range(2500)]
    summary = json.loads(r.headers["X-ClickHouse-Summary"])
    assert summary["result_rows"] == "2500"
    # the same data at revision 0 is the same bytes less the markers
    plain = _get(clickhouse, query, max_block_size="1000").content
    assert len(r.content) == len(plain) + len(blocks) * (len(BLOCK_INFO) + 5)


def test_every_type_the_walker_knows_goes_out_at_a_revision(
    clickhouse: ClickHouseSettings,
) -> None:
    """Column boundaries of each type, checked by clickhouse-connect's own Native reader (it
    reads at 54405, BlockInfo and all) against the same rows as JSON."""
    exprs = [
        "toUInt8(number) AS u8", "toInt128(number) AS i128", "toUInt256(number) AS u256",
        "toFloat32(number) AS f32", "toDate(number) AS d", "toDate32(number) AS d32",
        "toDateTime(number, 'UTC') AS dt", "toDateTime64(number, 3, 'UTC') AS dt64",
        "toDecimal32(number, 2) AS dec32", "toDecimal128(number, 5) AS dec128",
        "CAST(number % 2, 'Enum8(\\'a\\' = 0, \\'b, c\\' = 1)') AS e8",
        "toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') AS uuid",
        "toIPv4('1.2.3.4') AS ip4", "toIPv6('::1') AS ip6", "number % 2 = 0 AS b",
        "toFixedString(toString(number % 10), 3) AS fs", "[[number], []] AS aa",
        "CAST((number, toString(number)), 'Tuple(a UInt64, `b c` String)') AS t",
        "map(toString(number), [toLowCardinality('x')]) AS m",
        "if(number % 2 = 0, NULL, toLowCardinality(toString(number))) AS nlc",
        "CAST([] AS Array(LowCardinality(String))) AS empty_lc", "NULL AS nothing",
        "CAST(number, 'SimpleAggregateFunction(sum, UInt64)') AS saf",
        "(1.5, 2.5)::Point AS p",
    ]  # fmt: skip
    query = f"SELECT {', '.join(exprs)} FROM numbers(300)"
    c = clickhouse_connect.get_client(**client_options(clickhouse), query_limit=0)
    try:
        assert c.protocol_version == 54405  # negotiated: the endpoint honours the revision
        got = c.query(query, settings={"max_block_size": 128}).result_rows
        assert len(got) == 300
        via_json = [
            json.loads(line)
            for line in _get(clickhouse, f"{query} FORMAT JSONEachRow").text.splitlines()
        ]
        names = [e.rsplit(" AS ", 1)[1] for e in exprs]
        for row, ref in zip(got, via_json, strict=True):
            assert str(row[names.index("u8")]) == str(ref["u8"])
            assert row[names.index("fs")].rstrip(b"\0").decode() == ref["fs"].rstrip("\0")
            assert row[names.index("t")] == ref["t"]
            assert row[names.index("aa")] == ref["aa"] and list(row[names.index("p")]) == ref["p"]
            assert str(row[names.index("uuid")]) == ref["uuid"]
            assert str(row[names.index("ip4")]) == ref["ip4"] and row[names.index("b")] == ref["b"]
            assert str(row[names.index("i128")]) == str(ref["i128"])
            assert row[names.index("m")] == {k: v for k, v in ref["m"].items()}
            assert row[names.index("nlc")] == ref["nlc"]
            assert row[names.index("saf")] == ref["saf"]
            assert row[names.index("nothing")] is None and row[names.index("empty_lc")] == []
            assert row[names.index("e8")] == ref["e8"]
    finally:
        c.close()


def test_a_type_the_walker_does_not_know_is_a_clear_error(clickhouse: ClickHouseSettings) -> None:
    if not clickhouse.url.startswith("http://127.0.0.1"):
        pytest.skip(EMBEDDED)
    r = _get(
        clickhouse,
        "SELECT uniqState(number) AS st FROM numbers(3) FORMAT Native",
        client_protocol_version=str(GO_REVISION),
    )
    assert r.status_code == 501 and r.headers["X-ClickHouse-Exception-Code"] == "48"
    assert "AggregateFunction(uniq, UInt64)" in r.text and "NOT_IMPLEMENTED" in r.text
    # at revision 0 the engine's own bytes go out untouched
    assert _get(clickhouse, "SELECT uniqState(number) FROM numbers(3) FORMAT Native").ok


def test_native_inserts_stay_revision_0_as_in_clickhouse(clickhouse: ClickHouseSettings) -> None:
    """ClickHouse reads an INSERT's Native data at revision 0 whatever client_protocol_version
    says (NativeInputFormat); clickhouse-go sends it so, with the parameter on every request."""
    _post(clickhouse, b"CREATE TABLE back (n UInt64, s String) ENGINE = MergeTree ORDER BY n")
    data = _get(
        clickhouse, "SELECT number AS n, toString(number) AS s FROM numbers(10) FORMAT Native"
    )
    r = _post(
        clickhouse,
        data.content,
        query="INSERT INTO back FORMAT Native",
        client_protocol_version=str(GO_REVISION),
    )
    assert r.status_code == 200, r.text
    assert _get(clickhouse, "SELECT count(), sum(n) FROM back").text == "10\t45\n"


# --- ClickHouse's block compression ----------------------------------------------------------


def _frames(body: bytes) -> Iterator[tuple[int, bytes]]:
    """(method, decompressed data) of each frame, its checksum checked."""
    pos = 0
    while pos < len(body):
        method, size, plain = struct.unpack_from("<BII", body, pos + 16)
        framed = body[pos + 16 : pos + 16 + size]
        h = CityHash128(framed)
        assert body[pos : pos + 16] == struct.pack("<QQ", h >> 64, h & (2**64 - 1))
        packed = framed[9:]
        data = (
            lz4.block.decompress(packed, uncompressed_size=plain)
            if method == 0x82
            else (zstd.decompress(packed) if method == 0x90 else packed)
        )
        assert len(data) == plain
        yield method, data
        pos += 16 + size


def _frame(data: bytes, method: int = 0x82, checksum: bytes | None = None) -> bytes:
    packed = (
        lz4.block.compress(data, store_size=False)
        if method == 0x82
        else (zstd.compress(data) if method == 0x90 else data)
    )
    framed = struct.pack("<BII", method, len(packed) + 9, len(data)) + packed
    h = CityHash128(framed)
    return (checksum or struct.pack("<QQ", h >> 64, h & (2**64 - 1))) + framed


def test_compress_1_answers_in_checked_lz4_frames_of_at_most_1_mib(
    clickhouse: ClickHouseSettings,
) -> None:
    query = "SELECT number, toString(number) FROM numbers(300000) FORMAT TSV"
    plain = _get(clickhouse, query).content
    r = _get(clickhouse, query, compress="1")
    frames = list(_frames(r.content))
    assert {m for m, _ in frames} == {0x82}  # ClickHouse's default codec, LZ4
    assert len(frames) >= 3 and all(len(d) <= 1 << 20 for _, d in frames)
    assert b"".join(d for _, d in frames) == plain
    # with HTTP compression too: block compression inside, Content-Encoding outside
    r = requests.get(
        clickhouse.url,
        params={"query": query, "compress": "1", "enable_http_compression": "1"},
        headers={"Accept-Encoding": "gzip"},
        auth=_auth(clickhouse),
        timeout=30,
    )
    assert r.headers["Content-Encoding"] == "gzip"
    assert b"".join(d for _, d in _frames(r.content)) == plain  # (requests undid the gzip)
    # an error after the query started is compressed like its data would have been
    r = _get(clickhouse, "SELECT * FROM no_such_table", compress="1")
    assert r.status_code == 404 and r.headers["X-ClickHouse-Exception-Code"] == "60"
    [(_, text)] = list(_frames(r.content))
    assert text.startswith(b"Code: 60. DB::Exception:")


@pytest.mark.parametrize("method", [0x82, 0x90, 0x02])
def test_decompress_1_bodies_of_frames_split_anywhere_arrive_whole(
    clickhouse: ClickHouseSettings, method: int
) -> None:
    _post(clickhouse, b"CREATE TABLE framed (n UInt32) ENGINE = MergeTree ORDER BY n")
    head = _frame(b"INSERT INTO framed FORMAT CSV\n", method)
    rows = [_frame("".join(f"{i}\n" for i in range(k, k + 1000)).encode(), method)
            for k in range(0, 20000, 1000)]  # fmt: skip
    body = head + b"".join(rows)
    for size in (5, 4096, len(body)):
        _post(clickhouse, b"TRUNCATE TABLE framed")
        pieces = (body[i : i + size] for i in range(0, len(body), size))
        r = requests.post(
            clickhouse.url,
            params={"database": clickhouse.database, "decompress": "1"},
            data=pieces,
            auth=_auth(clickhouse),
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert _get(clickhouse, "SELECT count(), sum(n) FROM framed").text == "20000\t199990000\n"
    # the query in the body, compressed, with its answer compressed back
    r = _post(clickhouse, _frame(b"SELECT 40 + 2", method), decompress="1", compress="1")
    assert [d for _, d in _frames(r.content)] == [b"42\n"]


def test_decompress_1_refuses_corrupt_and_oversized_frames(clickhouse: ClickHouseSettings) -> None:
    good = _frame(b"SELECT 1")
    bad_sum = good[:16] + good[16:-1] + bytes([good[-1] ^ 1])
    r = _post(clickhouse, bad_sum, decompress="1")
    assert r.headers["X-ClickHouse-Exception-Code"] == "40", r.text
    assert "Checksum doesn't match: corrupted data. Reference: " in r.text
    h = CityHash128(good[16:])
    assert f"Reference: {h:032x}." in r.text  # ClickHouse prints first half, then second
    # the checksum check can be switched off, as in ClickHouse
    wrong = _frame(b"SELECT 1", checksum=bytes(16))
    r = _post(
        clickhouse,
        wrong,
        decompress="1",
        http_native_compression_disable_checksumming_on_decompress="1",
    )
    assert r.text == "1\n"
    # a declared size is refused before anything is allocated: 4 GiB in 25 bytes
    bomb = bytes(16) + struct.pack("<BII", 0x82, 2**32 - 1, 2**32 - 1)
    r = _post(clickhouse, bomb, decompress="1")
    assert r.headers["X-ClickHouse-Exception-Code"] == "39", r.text
    # a frame of 64 MiB of zeros as a query: refused at the query's limit, not buffered
    r = _post(clickhouse, _frame(b"SELECT 1 --" + bytes(64 << 20)), decompress="1")
    assert (r.status_code, r.headers["X-ClickHouse-Exception-Code"]) == (413, "62"), r.text
    r = _post(clickhouse, good[:16] + bytes([0x42]) + good[17:], decompress="1")
    assert r.headers["X-ClickHouse-Exception-Code"] == "432", r.text
    r = _post(clickhouse, good[:-3], decompress="1")
    assert r.headers["X-ClickHouse-Exception-Code"] == "33", r.text


@pytest.mark.parametrize("compress", ["lz4", "zstd", "gzip"])
def test_clickhouse_connect_reads_and_writes_native_at_its_revision_compressed(
    clickhouse: ClickHouseSettings, compress: str
) -> None:
    c = clickhouse_connect.get_client(**{**client_options(clickhouse), "compress": compress})
    try:
        assert c.protocol_version == 54405
        c.command("CREATE TABLE cc (n UInt64, g LowCardinality(String)) ENGINE = Memory")
        n = 200_000
        c.insert("cc", [list(range(n)), [f"g{i % 9}" for i in range(n)]],
                 column_names=["n", "g"], column_oriented=True)  # fmt: skip
        got = c.query("SELECT n, g FROM cc ORDER BY n", settings={"max_block_size": 10_000})
        assert [r[0] for r in got.result_rows] == list(range(n))
        assert {r[1] for r in got.result_rows} == {f"g{i}" for i in range(9)}
    finally:
        c.close()


# --- headers, summary, static handlers --------------------------------------------------------


def test_headers_and_parameters_take_precedence_as_in_clickhouse(
    clickhouse: ClickHouseSettings,
) -> None:
    url, auth = clickhouse.url, _auth(clickhouse)
    # X-ClickHouse-Format and X-ClickHouse-Database win over default_format and database
    r = requests.post(
        url,
        params={"default_format": "CSV", "database": "no_such_db"},
        headers={"X-ClickHouse-Format": "JSONCompact", "X-ClickHouse-Database": "system"},
        data="SELECT currentDatabase()",
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-ClickHouse-Format"] == "JSONCompact" and r.json()["data"] == [["system"]]
    # query_id: the parameter wins over the X-ClickHouse-Query-Id header
    r = requests.get(url, params={"query": "SELECT 1"}, auth=auth, timeout=10,
                     headers={"X-ClickHouse-Query-Id": "from-header"})  # fmt: skip
    assert r.headers["X-ClickHouse-Query-Id"] == "from-header"
    r = requests.get(url, params={"query": "SELECT 1", "query_id": "from-param"}, auth=auth,
                     timeout=10, headers={"X-ClickHouse-Query-Id": "from-header"})  # fmt: skip
    assert r.headers["X-ClickHouse-Query-Id"] == "from-param"
    # the timezone and display name are the engine's own, and session_timezone moves the former
    r = _get(clickhouse, "SELECT timezone(), displayName()")
    tz, name = r.text.strip().split("\t")
    assert (r.headers["X-ClickHouse-Timezone"], r.headers["X-ClickHouse-Server-Display-Name"]) == (
        tz,
        name,
    )
    r = _get(clickhouse, "SELECT timezone()", session_timezone="Asia/Tokyo")
    assert r.text == "Asia/Tokyo\n" and r.headers["X-ClickHouse-Timezone"] == "Asia/Tokyo"


def test_mixing_ways_to_authenticate_is_refused_and_a_quota_key_is_accepted(
    clickhouse: ClickHouseSettings,
) -> None:
    user, password = _auth(clickhouse)
    keys = {"X-ClickHouse-User": user, "X-ClickHouse-Key": password}
    cases: list[tuple[dict[str, str], dict[str, str], Any, str]] = [
        (keys, {}, (user, password), "516"),  # headers and Basic
        (keys, {"user": user}, None, "516"),  # headers and parameters
        ({}, {"password": password}, (user, password), "516"),  # Basic and parameters
        ({**keys, "X-ClickHouse-Quota": "q"}, {"quota_key": "q"}, None, "36"),
    ]
    for headers, params, basic, code in cases:
        r = requests.get(clickhouse.url, params={"query": "SELECT 1", **params}, auth=basic,
                         headers=headers, timeout=10)  # fmt: skip
        assert r.headers.get("X-ClickHouse-Exception-Code") == code, (headers, params, r.text)
    r = requests.get(clickhouse.url, params={"query": "SELECT 1"}, timeout=10,
                     headers={**keys, "X-ClickHouse-Quota": "team-a"})  # fmt: skip
    assert r.text == "1\n"
    r = requests.get(clickhouse.url, params={"query": "SELECT 1", "user": user,
                     "password": password, "quota_key": "team-a"}, timeout=10)  # fmt: skip
    assert r.text == "1\n"


def test_the_summary_says_what_the_engine_did(clickhouse: ClickHouseSettings) -> None:
    r = _post(clickhouse, b"CREATE TABLE summed (n UInt64) ENGINE = MergeTree ORDER BY n")
    r = _post(clickhouse, b"INSERT INTO summed SELECT number FROM numbers(5000)")
    assert json.loads(r.headers["X-ClickHouse-Summary"])["written_rows"] == "5000"
    r = _post(clickhouse, "".join(f"{i}\n" for i in range(300)).encode(),
              query="INSERT INTO summed FORMAT TSV")  # fmt: skip
    summary = json.loads(r.headers["X-ClickHouse-Summary"])
    assert summary["written_rows"] == "300" and int(summary["written_bytes"]) >= 300 * 8
    r = _get(clickhouse, "SELECT n FROM summed WHERE n < 10 ORDER BY n FORMAT Native",
             client_protocol_version="54405")  # fmt: skip
    summary = json.loads(r.headers["X-ClickHouse-Summary"])
    assert set(summary) == {
        "read_rows", "read_bytes", "written_rows", "written_bytes", "total_rows_to_read",
        "result_rows", "result_bytes", "elapsed_ns",
    }  # fmt: skip
    assert summary["result_rows"] == "20" and int(summary["elapsed_ns"]) > 0
    assert all(v.isdigit() for v in summary.values())


def test_the_summary_counts_rows_read_from_storage(clickhouse: ClickHouseSettings) -> None:
    _post(clickhouse, b"CREATE TABLE counted (n UInt64) ENGINE = MergeTree ORDER BY n")
    _post(clickhouse, b"INSERT INTO counted SELECT number FROM numbers(5000)")
    summary = json.loads(_get(clickhouse, "SELECT sum(n) FROM counted").headers[
        "X-ClickHouse-Summary"
    ])  # fmt: skip
    assert (summary["read_rows"], summary["read_bytes"]) == ("5000", "40000")
    assert (summary["result_rows"], summary["result_bytes"]) == ("1", "8")


def test_static_handlers_answer_without_a_login_and_hold_no_data(
    clickhouse: ClickHouseSettings,
) -> None:
    for path in ("/", "/ping", "/replicas_status"):
        r = requests.get(f"{clickhouse.url}{path}", timeout=10)
        assert (r.status_code, r.text) == (200, "Ok.\n"), path
    r = requests.get(f"{clickhouse.url}/play", params={"query": "SELECT 1"}, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert "<textarea" in r.text and "Authorization" in r.text
    r = requests.get(clickhouse.url, params={"query": "SELECT 1"}, timeout=10)
    assert r.headers["X-ClickHouse-Exception-Code"] == "516"
    c = connect(clickhouse)  # and the drivers' own pings still work
    try:
        assert c.ping()
    finally:
        c.close()
