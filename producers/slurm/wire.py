"""A minimal Kafka producer in the standard library, for the Slurm hook's direct send.

Why not aiokafka here: slurmctld runs the hook for every job start and end, and importing
aiokafka alone takes ~0.2 s; this speaks just enough of the protocol (Metadata v1, Produce v3
with an uncompressed v2 record batch, acks=all) to hand a few records to the partition leaders
in a few milliseconds. Versions chosen because every broker from 0.11 to 4.x accepts them.
PLAINTEXT or SSL (TLS, also with a client certificate: the caller passes an ``ssl.SSLContext``);
SASL is not spoken: with SASL configured the hook spools and the drainer (aiokafka) ships.
Keys are partitioned with murmur2 exactly as the Java client and aiokafka do, so hook events
land on the same partitions as everything else keyed ``cluster/job``.
Any failure raises ``WireError``; the caller spools what was not acknowledged.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hook's start-up)
if TYPE_CHECKING:
    import ssl  # only a TLS send imports it (~15 ms)

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
RETRIABLE = {3, 5, 6, 7}  # unknown topic (auto-create pending), leader not available / moving


class WireError(Exception):
    pass


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _bytes_field(b: bytes | None) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def record_batch(records: Sequence[tuple[bytes | None, bytes, int]]) -> bytes:
    """(key, value, timestamp_ms) -> one uncompressed v2 record batch."""
    base_ts = records[0][2]
    body = bytearray()
    for i, (key, value, ts) in enumerate(records):
        rec = b"\x00" + _varint(ts - base_ts) + _varint(i) + _bytes_field(key)
        rec += _bytes_field(value) + _varint(0)
        body += _varint(len(rec)) + rec
    after_crc = (
        _I16.pack(0)  # attributes: no compression, CreateTime
        + _I32.pack(len(records) - 1)
        + _I64.pack(base_ts)
        + _I64.pack(max(r[2] for r in records))
        + _I64.pack(-1)  # producer id: not idempotent (duplicates are deduped by event_id)
        + _I16.pack(-1)
        + _I32.pack(-1)
        + _I32.pack(len(records))
        + bytes(body)
    )
    tail = _I32.pack(-1) + b"\x02" + struct.pack(">I", crc32c(after_crc)) + after_crc
    return _I64.pack(0) + _I32.pack(len(tail)) + tail


def _str(s: str) -> bytes:
    b = s.encode()
    return _I16.pack(len(b)) + b


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: struct.Struct) -> int:
        (v,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return int(v)

    def string(self) -> str | None:
        n = self.take(_I16)
        if n < 0:
            return None
        s = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return s


class Connection:
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        deadline: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.deadline, self.client_id, self.corr = deadline, client_id, 0
        try:
            sock = socket.create_connection((host, port), timeout=self._left())
        except OSError as exc:
            raise WireError(f"cannot connect to {host}:{port}: {exc}") from None
        if tls is None:
            self.sock = sock
            return
        try:  # the handshake runs here, under the socket's timeout (what is left)
            self.sock = tls.wrap_socket(sock, server_hostname=host)
        except OSError as exc:  # ssl.SSLError, SSLCertVerificationError, a timeout
            sock.close()
            raise WireError(f"TLS handshake with {host}:{port} failed: {exc}") from None

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WireError("out of time")
        return left

    def call(self, api_key: int, version: int, body: bytes) -> _Reader:
        self.corr += 1
        head = _I16.pack(api_key) + _I16.pack(version) + _I32.pack(self.corr) + _str(self.client_id)
        msg = head + body
        try:
            self.sock.settimeout(self._left())
            self.sock.sendall(_I32.pack(len(msg)) + msg)
            size = _I32.unpack(self._read(4))[0]
            r = _Reader(self._read(size))
        except (OSError, struct.error) as exc:
            raise WireError(f"broker connection failed: {exc}") from None
        if r.take(_I32) != self.corr:
            raise WireError("broker answered another request")
        return r

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise WireError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def _unready(v: dict[int, int] | int) -> bool:
    return isinstance(v, int) or any(x < 0 for x in v.values())


def _metadata(conn: Connection, topics: list[str]) -> tuple[dict[int, tuple[str, int]], dict]:
    body = _I32.pack(len(topics)) + b"".join(_str(t) for t in topics)
    r = conn.call(3, 1, body)
    brokers = {}
    for _ in range(r.take(_I32)):
        node = r.take(_I32)
        host, port = r.string() or "", r.take(_I32)
        r.string()  # rack
        brokers[node] = (host, port)
    r.take(_I32)  # controller
    leaders: dict[str, dict[int, int] | int] = {}
    for _ in range(r.take(_I32)):
        err, name = r.take(_I16), r.string() or ""
        r.pos += 1  # is_internal
        parts: dict[int, int] = {}
        for _ in range(r.take(_I32)):
            perr, idx, leader = r.take(_I16), r.take(_I32), r.take(_I32)
            for _ in range(2):  # replicas, isr: the count first, then skip its int32s
                n = r.take(_I32)
                r.pos += 4 * n
            parts[idx] = leader if perr == 0 else -perr
        leaders[name] = parts if err == 0 else -err
    return brokers, leaders


def _leaders(
    boot: Connection, topics: list[str], deadline: float
) -> tuple[dict[int, tuple[str, int]], dict]:
    """Metadata once every topic has a leader for each partition (auto-creation waits)."""
    while True:
        brokers, leaders = _metadata(boot, topics)
        bad = {t: leaders.get(t, -3) for t in topics}
        bad = {t: v for t, v in bad.items() if _unready(v)}
        if not bad:
            return brokers, leaders
        codes = {(-v if isinstance(v, int) else -min(v.values())) for v in bad.values()}
        if not codes <= RETRIABLE or deadline - time.monotonic() < 0.1:
            raise WireError(f"metadata errors {sorted(codes)} for {sorted(bad)}")
        time.sleep(0.05)  # the topic is being created


def send(
    bootstrap: str,
    records: Sequence[tuple[str, bytes, bytes, int]],
    *,
    deadline: float,
    client_id: str = "gpugap-slurm-hook",
    tls: ssl.SSLContext | None = None,
) -> None:
    """Send (topic, key, value, timestamp_ms) records with acks=all before ``deadline``
    (time.monotonic()); returns once every partition leader has acknowledged, else raises.
    ``tls``: connect to every broker over TLS with this context (security_protocol SSL)."""
    hosts = [h.strip().rsplit(":", 1) for h in bootstrap.split(",") if h.strip()]
    conns: dict[tuple[str, int], Connection] = {}
    last: Exception = WireError(f"no bootstrap server in {bootstrap!r}")
    try:
        boot = None
        for host, port in hosts:
            try:
                boot = conns[host, int(port)] = Connection(
                    host, int(port), client_id, deadline, tls
                )
                break
            except (WireError, ValueError) as exc:
                last = exc
        if boot is None:
            raise WireError(str(last))
        topics = sorted({r[0] for r in records})
        pending = list(records)
        while pending:
            brokers, leaders = _leaders(boot, topics, deadline)
            by_leader: dict[int, dict[tuple[str, int], list[tuple[bytes, bytes, int]]]] = {}
            placed = []
            for rec in pending:
                parts = leaders[rec[0]]
                assert isinstance(parts, dict)
                tp = (rec[0], partition_for(rec[1], len(parts)))
                placed.append((rec, tp))
                by_leader.setdefault(parts[tp[1]], {}).setdefault(tp, []).append(rec[1:])
            retry: set[tuple[str, int]] = set()
            for leader, batches in by_leader.items():
                addr = brokers.get(leader)
                if addr is None:
                    raise WireError(f"leader {leader} not in the broker list")
                conn = conns.get(addr) or conns.setdefault(
                    addr, Connection(*addr, client_id, deadline, tls)
                )
                retry |= _produce(conn, batches, deadline)
            # a partition whose leader just moved or was just created (error 6 seen right after
            # auto-creation): those records again, on fresh metadata, while time is left
            pending = [rec for rec, tp in placed if tp in retry]
            if pending:
                if deadline - time.monotonic() < 0.1:
                    raise WireError(f"produce to {sorted(retry)} kept failing (leader not ready)")
                time.sleep(0.05)
    finally:
        for c in conns.values():
            c.close()


def _produce(
    conn: Connection,
    batches: dict[tuple[str, int], list[tuple[bytes, bytes, int]]],
    deadline: float,
) -> set[tuple[str, int]]:
    """One Produce request; returns the partitions that answered a retriable error (their
    batches were not written)."""
    by_topic: dict[str, list[tuple[int, bytes]]] = {}
    for (topic, p), recs in batches.items():
        by_topic.setdefault(topic, []).append((p, record_batch(recs)))
    timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
    body = _I16.pack(-1) + _I16.pack(-1) + _I32.pack(timeout_ms) + _I32.pack(len(by_topic))
    for topic, parts in by_topic.items():
        body += _str(topic) + _I32.pack(len(parts))
        for p, batch in parts:
            body += _I32.pack(p) + _I32.pack(len(batch)) + batch
    r = conn.call(0, 3, body)
    retry: set[tuple[str, int]] = set()
    for _ in range(r.take(_I32)):
        name = r.string() or ""
        for _ in range(r.take(_I32)):
            p, err = r.take(_I32), r.take(_I16)
            r.pos += 16  # base offset, log append time
            if err in RETRIABLE:
                retry.add((name, p))
            elif err:
                raise WireError(f"produce to {name}[{p}] failed with error {err}")
    return retry
