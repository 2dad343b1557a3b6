"""The embedded ClickHouse endpoint of this work tree ("current") beside the endpoint at a
baseline git ref ("baseline"), and beside chDB in-process where that means something:

1. isolation: while user A runs an 8 s query, how long does user B wait for ``SELECT 1``?
2. insert throughput: GPU-minute rows through clickhouse-connect, as the sink sends them;
3. memory and liveness under hostile request bodies: 30 MB, 2 GiB streamed, a zstd bomb;
4. the admin's ``SELECT 1`` and a 1,000-row insert while the reader keeps 40 connections
   asking for 15 MB Native answers at clickhouse-connect's and clickhouse-go's revisions;
5. ``SELECT 1`` one request after another, nothing else running.

A server's memory is its own and its children's (the engine's process, where it has one).

    .venv/bin/python -m benchmarks endpoint [--baseline-ref REF] [--quick]

The baseline runs from a throwaway ``git worktree`` (removed at the end) with its own code on
``PYTHONPATH`` and as the working directory, so the installed (editable) gpugap is not what it
imports; the module path each target imports is printed. Every server gets its data in a
temporary directory and a free port on 127.0.0.1, and is stopped (TERM, then KILL) at the end.
Progress goes to stderr, the table and one summary line per target to stdout.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
ADMIN, ADMIN_PW = "default", "bench-admin-secret"
READER, READER_PW = "reader", "bench-reader-secret"
PASSWORDS = {ADMIN: ADMIN_PW, READER: READER_PW}
# 8 s without changing a setting: each scalar subquery runs once, one after the other (they
# differ, so none is a cached copy of another). ``sleepEachRow(1) FROM numbers(8) SETTINGS
# max_block_size=1, ...`` also takes 8 s on chDB 4.4, but a user with readonly=1 may not
# change settings, so it would measure a refusal instead of a slow query.
SLOW = (
    "SELECT (SELECT sleep(2) + 1) + (SELECT sleep(2) + 2) + (SELECT sleep(2) + 3) "
    "+ (SELECT sleep(2) + 4)"
)
SLOW_ANSWER = "10"
B_START_S, B_EVERY_S = 0.5, 1.0  # B's queries start 0.5 s, 1.5 s, ... after A's
MIB = 1 << 20
GIB = 1 << 30
REPO = Path(__file__).resolve().parent.parent
START = datetime(2026, 1, 1, tzinfo=UTC)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def short(exc: BaseException | str, n: int = 120) -> str:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()


def answers(port: int, timeout_s: float = 1.0) -> bool:
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
        try:
            conn.request("GET", "/ping")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return False


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:,.0f}"


# --- servers ------------------------------------------------------------------------------


class StartError(Exception):
    pass


class Server:
    """``gpugap clickhouse serve`` run from ``root`` (its code, not the installed one)."""

    def __init__(self, name: str, root: Path, workdir: Path) -> None:
        self.name, self.root, self.workdir = name, root, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0
        self.log = workdir / "server.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGAP_")}
        env.update(
            PYTHONPATH=str(self.root),
            PYTHONUNBUFFERED="1",
            GPUGAP_CLICKHOUSE_PASSWORD=ADMIN_PW,
            GPUGAP_CLICKHOUSE_READONLY_PASSWORD=READER_PW,
            GPUGAP_SERVICES_STATE_DIR=str(self.workdir / "state"),
        )
        return env

    def code_path(self) -> str:
        """The file the server's ``import warehouse.embedded.server`` loads."""
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import warehouse.embedded.server as s; print(s.__file__)",
            ],
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise StartError(f"cannot import the endpoint's code: {short(out.stderr, 400)}")
        path = out.stdout.strip()
        if not Path(path).resolve().is_relative_to(self.root.resolve()):
            raise StartError(f"{self.name} would import {path}, not code under {self.root}")
        return path

    def start(self, timeout_s: float = 60.0) -> None:
        from gpugap.services.kafka import free_port

        self.starts += 1
        self.port = free_port()
        self.log = self.workdir / f"server{self.starts}.log"
        data = self.workdir / f"data{self.starts}"  # fresh: a killed server may leave a lock
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpugap",
                    "clickhouse",
                    "serve",
                    "--path",
                    str(data),
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                ],
                cwd=self.root,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches the benchmark, which stops it
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                raise StartError(f"exited with {rc}: {short(self.log_tail(), 600)}")
            if answers(self.port):
                return
            time.sleep(0.2)
        self.stop()
        raise StartError(
            f"did not answer /ping in {timeout_s:.0f} s: {short(self.log_tail(), 600)}"
        )

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.pid is not None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def mem(self, key: str = "VmRSS") -> int | None:
        """Bytes of ``key`` (VmRSS, VmHWM) in /proc/PID/status, of the server and of its
        children (the engine process) summed; None once it is gone."""
        pid = self.pid
        if pid is None:
            return None
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        total = None
        for process in [str(pid), *children]:
            try:
                for line in Path(f"/proc/{process}/status").read_text().splitlines():
                    if line.startswith(key + ":"):
                        total = (total or 0) + int(line.split()[1]) * 1024
            except (OSError, ValueError, IndexError):
                continue
        return total

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None

    def ensure(self) -> bool:
        """Running and answering; restarted when not. True if it had to be restarted."""
        if self.alive() and answers(self.port, 5.0):
            return False
        self.stop(grace_s=2.0)
        self.start()
        return True


# --- 1. isolation -------------------------------------------------------------------------


@dataclass
class Isolation:
    a_s: float | None = None  # how long A's query took
    a_error: str = ""
    b_ms: list[float] = field(default_factory=list)  # from the moment B's query was due
    b_errors: list[str] = field(default_factory=list)

    def b_text(self) -> str:
        if not self.b_ms:
            return f"failed ({len(self.b_errors)})"
        text = f"{statistics.median(self.b_ms):,.0f} / {max(self.b_ms):,.0f}"
        return text + (f" ({len(self.b_errors)} failed)" if self.b_errors else "")

    def a_text(self) -> str:
        if self.a_s is None:
            return "-"
        return f"{self.a_s:.1f}" + (f" ({short(self.a_error, 40)})" if self.a_error else "")


def isolation(run_a: Callable[[], None], run_b: Callable[[], None], n: int) -> Isolation:
    """A starts; B's ``n`` queries start on a schedule (each in its own thread, so one that
    waits does not delay the next), every one timed from when it was due."""
    iso = Isolation()
    lock = threading.Lock()
    t0 = time.perf_counter()

    def a() -> None:
        try:
            run_a()
        except Exception as exc:
            iso.a_error = short(exc)
        iso.a_s = time.perf_counter() - t0

    def b(due: float) -> None:
        time.sleep(max(0.0, due - time.perf_counter()))
        try:
            run_b()
        except Exception as exc:
            with lock:
                iso.b_errors.append(short(exc))
            return
        with lock:
            iso.b_ms.append((time.perf_counter() - due) * 1000)

    threads = [threading.Thread(target=a, daemon=True)] + [
        threading.Thread(target=b, args=(t0 + B_START_S + i * B_EVERY_S,), daemon=True)
        for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, t0 + 90 - time.perf_counter()))
    return iso


def http_query(port: int, user: str, sql: str, expect: str, timeout_s: float = 60) -> None:
    """One query on a new connection; raises unless the answer is ``expect``."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        conn.request("POST", "/", body=sql.encode(), headers={"Authorization": basic(user)})
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace").strip()
    finally:
        conn.close()
    if resp.status != 200 or text != expect:
        raise RuntimeError(f"HTTP {resp.status}: {text}")


def http_isolation(port: int, a_user: str, b_user: str, n: int) -> Isolation:
    return isolation(
        lambda: http_query(port, a_user, SLOW, SLOW_ANSWER),
        lambda: http_query(port, b_user, "SELECT 1", "1"),
        n,
    )


class Direct:
    """chDB in-process, for reference: two connections to one path."""

    def __init__(self, path: Path) -> None:
        import chdb

        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.a = chdb.connect(str(path))
        self.b = chdb.connect(str(path))

    def isolation(self, n: int) -> Isolation:
        def run_a() -> None:
            got = self.a.query(SLOW, "TabSeparated").bytes().decode().strip()
            if got != SLOW_ANSWER:
                raise RuntimeError(f"A answered {got!r}")

        return isolation(run_a, lambda: self.b.query("SELECT 1", "TabSeparated"), n)

    def close(self) -> None:
        for conn in (self.b, self.a):
            try:
                conn.close()
            except Exception as exc:
                say(f"closing chDB: {short(exc)}")


# --- 2. insert throughput -----------------------------------------------------------------


@dataclass
class InsertData:
    native_rows: int
    sink_rows: int
    native: bytes = b""
    cols: list[str] = field(default_factory=list)
    width: int = 0  # the columns SYNTHETIC gives (the first migration's)
    py_rows: list[Any] | None = None  # generated by the first endpoint, then reused


def prepare_inserts(direct: Direct, data: InsertData, repeats: int) -> float:
    """GPU-minute rows as Native bytes (as in ``python -m benchmarks warehouse``), made by chDB
    in-process, and chDB's own rate for them (rows/s, median)."""
    from benchmarks.warehouse import SYNTHETIC
    from gpugap.warehouse.migrate import migrations

    # the table as every migration leaves it (later ones add columns to the first's)
    direct.a.query("CREATE DATABASE IF NOT EXISTS bench_schema")
    direct.a.query("USE bench_schema")
    for migration in migrations():
        for statement in migration.statements():
            direct.a.query(statement)
    direct.a.query("CREATE DATABASE IF NOT EXISTS bench")
    direct.a.query("CREATE TABLE bench.bench_insert AS bench_schema.gpu_minutes")
    res = direct.a.query(
        "SELECT name FROM system.columns WHERE database = 'bench' AND table = 'bench_insert' "
        "ORDER BY position",
        "TabSeparated",
    )
    data.cols = res.bytes().decode().split()
    params = {
        "gpus": "1000",
        "first_minute": "0",
        "start": START.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": str(data.native_rows),
    }
    # through a table: SYNTHETIC's columns are unnamed expressions, and Native input matches
    # columns by name (straight from the SELECT, every column would be left at its default)
    direct.a.query("CREATE TABLE bench.gen AS bench.bench_insert ENGINE = MergeTree ORDER BY ()")
    # (SYNTHETIC gives the columns of the first migration; later ones added some after them)
    described = direct.a.query(f"DESCRIBE TABLE ({SYNTHETIC})", "TSV", params=params)
    data.width = width = len(described.bytes().decode().splitlines())
    named = ", ".join(data.cols[:width])
    direct.a.query(f"INSERT INTO bench.gen ({named}) " + SYNTHETIC, params=params)
    data.native = bytes(direct.a.query("SELECT * FROM bench.gen", "Native").bytes())
    direct.a.query("DROP TABLE bench.gen")
    statement = f"INSERT INTO bench.bench_insert ({', '.join(data.cols)})"
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        with direct.a.send_insert(statement, "Native") as ins:
            ins.append(data.native)
            ins.finish()
        rates.append(data.native_rows / (time.perf_counter() - t))
    direct.a.query("DROP TABLE bench.bench_insert")
    return statistics.median(rates)


INSERT_KINDS = ("native lz4", "native plain", "sink")


def insert_throughput(
    url: str, data: InsertData, repeats: int
) -> tuple[dict[str, float], dict[str, str]]:
    """Rows/s (median of ``repeats``) per kind, and the error of each kind that failed: the
    Native block through clickhouse-connect with lz4 (its default, the sink's) and without
    compression, and Python rows with ``client.insert``, the sink's own call."""
    import clickhouse_connect

    from benchmarks.warehouse import SYNTHETIC
    from gpugap.groundfloor.settings import ClickHouseSettings
    from gpugap.warehouse.client import client_options, connect
    from gpugap.warehouse.migrate import migrate

    settings = ClickHouseSettings(url=url, password=ADMIN_PW, database="bench")
    migrate(settings)
    client = connect(settings)
    plain = clickhouse_connect.get_client(**{**client_options(settings), "compress": False})
    rates: dict[str, list[float]] = {k: [] for k in INSERT_KINDS}
    errors: dict[str, str] = {}
    try:
        client.command("CREATE TABLE IF NOT EXISTS bench_insert AS gpu_minutes")
        if data.py_rows is None:
            params = {"gpus": 1000, "first_minute": 0, "start": START, "rows": data.sink_rows}
            data.py_rows = client.query(SYNTHETIC, parameters=params).result_rows
        py_rows = data.py_rows
        sends: dict[str, tuple[int, Callable[[], Any]]] = {
            "native lz4": (
                data.native_rows,
                lambda: client.raw_insert(
                    "bench_insert", data.cols, insert_block=data.native, fmt="Native"
                ),
            ),
            "native plain": (
                data.native_rows,
                lambda: plain.raw_insert(
                    "bench_insert", data.cols, insert_block=data.native, fmt="Native"
                ),
            ),
            "sink": (
                len(py_rows),
                lambda: client.insert(
                    "bench_insert", py_rows, column_names=data.cols[: data.width]
                ),
            ),
        }
        for _ in range(repeats):
            for kind, (rows, send) in sends.items():
                if kind in errors:
                    continue
                t = time.perf_counter()
                try:
                    written = send().written_rows
                except Exception as exc:
                    errors[kind] = short(exc, 300)
                    continue
                rates[kind].append(rows / (time.perf_counter() - t))
                if written != rows:
                    errors[kind] = f"the endpoint says it wrote {written:,} of {rows:,} rows"
        gpus, first = client.query(
            "SELECT uniqExact(gpu_uuid), min(minute) FROM bench_insert"
        ).result_rows[0]
        if len(errors) < len(sends) and (
            gpus != 1000 or first.replace(tzinfo=None) != START.replace(tzinfo=None)
        ):
            errors["check"] = f"bench_insert holds {gpus} GPUs from {first}: not the rows sent"
        client.command("DROP TABLE bench_insert")
    finally:
        client.close()
        plain.close()
    return {k: statistics.median(r) for k, r in rates.items() if r and k not in errors}, errors


# --- 3. hostile bodies --------------------------------------------------------------------


@dataclass
class Hostile:
    outcome: str = ""  # short, for the table
    detail: str = ""
    restarted: bool = False  # the server had to be (re)started before this test
    rss_before: int | None = None
    rss_peak: int | None = None
    rss_after: int | None = None
    ping_ms: list[float] = field(default_factory=list)
    ping_failed: int = 0
    alive_after: bool = False

    def rss_text(self) -> str:
        return f"{mib(self.rss_before)} / {mib(self.rss_peak)} / {mib(self.rss_after)}"

    def ping_text(self) -> str:
        if not self.ping_ms:
            return f"none answered ({self.ping_failed} failed)"
        text = f"{statistics.median(self.ping_ms):,.0f} / {max(self.ping_ms):,.0f}"
        return text + (f" ({self.ping_failed} failed)" if self.ping_failed else "")


class Watch:
    """While a hostile request runs: the server's RSS every 20 ms (KILLed above ``cap``, so
    a runaway baseline cannot take the machine down) and ``/ping`` on its own connection."""

    def __init__(self, server: Server, cap: int, ping_timeout_s: float = 10.0) -> None:
        self.server, self.cap, self.ping_timeout_s = server, cap, ping_timeout_s
        self.peak = 0
        self.killed_at: int | None = None
        self.ping_ms: list[float] = []
        self.ping_failed = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._rss, daemon=True),
            threading.Thread(target=self._ping, daemon=True),
        ]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.ping_timeout_s + 5)

    def _rss(self) -> None:
        while not self._stop.is_set():
            rss = self.server.mem()
            if rss is not None:
                self.peak = max(self.peak, rss)
                if rss > self.cap and self.killed_at is None:
                    self.killed_at = rss
                    self.server.kill()
            self._stop.wait(0.02)

    def _ping(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set() and self.server.alive():
            t = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(
                        HOST, self.server.port, timeout=self.ping_timeout_s
                    )
                conn.request("GET", "/ping")
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    raise http.client.HTTPException(f"HTTP {resp.status}")
                self.ping_ms.append((time.perf_counter() - t) * 1000)
            except (OSError, http.client.HTTPException):
                self.ping_failed += 1
                if conn is not None:
                    conn.close()
                conn = None
            self._stop.wait(0.05)
        if conn is not None:
            conn.close()


def hostile(server: Server, send: Callable[[Server], tuple[str, str]], cap: int) -> Hostile:
    res = Hostile()
    try:
        res.restarted = server.ensure()
    except StartError as exc:
        res.outcome, res.detail = "no server", f"could not restart it: {exc}"
        return res
    res.rss_before = server.mem()
    hwm_before = server.mem("VmHWM") or 0
    with Watch(server, cap) as watch:
        try:
            res.outcome, res.detail = send(server)
        except Exception as exc:
            res.outcome, res.detail = "client error", short(exc, 300)
        time.sleep(0.5)  # pings after the answer
    hwm = server.mem("VmHWM") or 0
    res.rss_peak = max(watch.peak, hwm if hwm > hwm_before else 0) or None
    res.ping_ms, res.ping_failed = watch.ping_ms, watch.ping_failed
    if watch.killed_at is not None:
        res.outcome += ", KILLED at RSS cap"
        res.detail += f"; the benchmark killed the server at RSS {mib(watch.killed_at)} MiB"
        server.stop(grace_s=2)
    elif not server.alive():
        res.outcome += ", server died"
        res.detail += f"; the server exited with {server.returncode()}"
        res.detail += f": {short(server.log_tail(), 300)}"
        server.stop(grace_s=0)
    elif not answers(server.port, 5.0):
        res.outcome += ", unresponsive"
        res.detail += "; no /ping answer 5 s after the request (stopped, restarted for the next)"
        res.rss_after = server.mem()
        server.stop(grace_s=2)
    else:
        res.alive_after = True
        time.sleep(0.5)
        res.rss_after = server.mem()
    return res


def post(
    server: Server,
    body: bytes,
    timeout_s: float,
    query: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[str, str]:
    """POST as the admin; (short outcome, detail)."""
    path = "/" if query is None else "/?" + urllib_quote(query)
    conn = http.client.HTTPConnection(HOST, server.port, timeout=timeout_s)
    t = time.perf_counter()
    try:
        conn.request(
            "POST", path, body=body, headers={"Authorization": basic(ADMIN), **(headers or {})}
        )
        resp = conn.getresponse()
        text = resp.read(4096).decode(errors="replace")
    except TimeoutError:
        took = time.perf_counter() - t
        return f"no answer in {took:.0f} s", f"no response within {timeout_s:.0f} s"
    except OSError as exc:
        took = time.perf_counter() - t
        return f"conn. error {took:.1f} s", short(exc, 300)
    finally:
        conn.close()
    took = time.perf_counter() - t
    return f"HTTP {resp.status} in {took:.1f} s", short(text, 300)


def urllib_quote(text: str) -> str:
    from urllib.parse import quote

    return "query=" + quote(text, safe="")


def big_query(server: Server, size: int = 30 * MIB, timeout_s: float = 60) -> tuple[str, str]:
    """(a) one ``SELECT '<30 MB string>'`` in the body, sent whole."""
    return post(server, b"SELECT '" + b"x" * size + b"'", timeout_s)


def huge_stream(server: Server, size: int = 2 * GIB, bound_s: float = 60) -> tuple[str, str]:
    """(b) a 2 GiB query body made by a generator, sent chunked: stops when the server
    answers early, closes the connection, stops reading for 10 s, dies, or after ``bound_s``."""

    def chunks() -> Iterator[bytes]:
        block = b"x" * MIB
        yield b"SELECT '" + block[8:]
        for _ in range(size // MIB - 2):
            yield block
        yield block[:-1] + b"'"

    conn = http.client.HTTPConnection(HOST, server.port, timeout=10)
    sent, t = 0, time.perf_counter()

    def where() -> str:
        return f"{sent / MIB:,.0f} MiB in {time.perf_counter() - t:.1f} s"

    try:
        conn.putrequest("POST", "/", skip_accept_encoding=True)
        conn.putheader("Authorization", basic(ADMIN))
        conn.putheader("Transfer-Encoding", "chunked")
        conn.putheader("Content-Type", "text/plain")
        conn.endheaders()
        sock = conn.sock
        for chunk in chunks():
            if sock is not None and select.select([sock], [], [], 0)[0]:
                break  # an early answer (or a close): read it below
            if time.perf_counter() - t > bound_s:
                return f"still reading at {bound_s:.0f} s", f"accepted {where()}, then closed"
            if not server.alive():
                return f"died after {sent / MIB:,.0f} MiB", f"the server went away after {where()}"
            try:
                conn.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except TimeoutError:
                return (
                    f"stalled at {sent / MIB:,.0f} MiB",
                    f"stopped reading (10 s) after {where()}",
                )
            except OSError as exc:
                return (
                    f"closed at {sent / MIB:,.0f} MiB",
                    f"closed the connection after {where()}: {short(exc)}",
                )
            sent += len(chunk)
        else:
            conn.send(b"0\r\n\r\n")
        if conn.sock is not None:
            conn.sock.settimeout(30)
        try:
            resp = conn.getresponse()
            text = resp.read(4096).decode(errors="replace")
        except TimeoutError:
            return "no answer", f"all {where()} sent, no response in 30 s"
        except (OSError, http.client.HTTPException) as exc:
            return f"closed at {sent / MIB:,.0f} MiB", f"after {where()}: {short(exc)}"
        return (
            f"HTTP {resp.status} at {sent / MIB:,.0f} MiB",
            f"after {where()}: {short(text, 300)}",
        )
    finally:
        conn.close()


_BOMB: list[bytes] = []


def zstd_bomb(size: int = GIB) -> bytes:
    """About 32 KB of zstd that inflates to ``size`` zero bytes (made once, streaming)."""
    if not _BOMB:
        from backports import zstd

        comp = zstd.ZstdCompressor(level=3)
        zeros = bytes(16 * MIB)
        parts = [comp.compress(zeros) for _ in range(size // len(zeros))]
        parts.append(comp.flush())
        _BOMB.append(b"".join(parts))
    return _BOMB[0]


def bomb(server: Server, timeout_s: float = 60) -> tuple[str, str]:
    """(c) the zstd bomb as the data of ``INSERT ... FORMAT CSV``."""
    post(server, b"CREATE DATABASE IF NOT EXISTS bench", 30)
    post(server, b"CREATE TABLE IF NOT EXISTS bench.bomb (x UInt8) ENGINE = Memory", 30)
    data = zstd_bomb()
    out, detail = post(
        server,
        data,
        timeout_s,
        query="INSERT INTO bench.bomb FORMAT CSV",
        headers={"Content-Encoding": "zstd"},
    )
    return out, f"{len(data):,} bytes -> 1 GiB: {detail}"


# --- 4. a reader's big answers; 5. SELECT 1 alone -----------------------------------------

BIG_NATIVE = "SELECT toString(number) AS s FROM numbers(1900000) FORMAT Native"  # ~15 MB


@dataclass
class Load:
    select_ms: list[float] = field(default_factory=list)
    insert_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reader: dict[str, int] = field(default_factory=dict)  # answers by status

    def text(self, which: str) -> str:
        ms = self.select_ms if which == "select" else self.insert_ms
        if not ms:
            return f"failed ({len(self.errors)})"
        return f"{statistics.median(ms):,.0f} / {max(ms):,.0f}"


def answers_load(server: Server, seconds: float = 8.0) -> Load:
    """The admin's SELECT 1 and a 1,000-row insert, each timed, every 0.5 s while 40 reader
    connections ask for BIG_NATIVE over and over."""
    load, stop, lock = Load(), threading.Event(), threading.Lock()
    http_query(server.port, ADMIN, "CREATE TABLE IF NOT EXISTS bench_sink (n UInt64) "
               "ENGINE = MergeTree ORDER BY n", "")  # fmt: skip
    rows = b"".join(b"%d\n" % i for i in range(1000))

    def reader(revision: str) -> None:
        while not stop.is_set():
            conn = http.client.HTTPConnection(HOST, server.port, timeout=60)
            try:
                conn.request(
                    "POST", f"/?client_protocol_version={revision}", body=BIG_NATIVE.encode(),
                    headers={"Authorization": basic(READER)},
                )  # fmt: skip
                resp = conn.getresponse()
                resp.read()
                key = str(resp.status)
            except (OSError, http.client.HTTPException) as exc:
                key = type(exc).__name__
            finally:
                conn.close()
            with lock:
                load.reader[key] = load.reader.get(key, 0) + 1

    readers = [
        threading.Thread(target=reader, args=(("54405", "54460")[i % 2],), daemon=True)
        for i in range(40)
    ]
    for t in readers:
        t.start()
    time.sleep(2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for kind, send in (
            ("select", lambda: http_query(server.port, ADMIN, "SELECT 1", "1")),
            ("insert", lambda: post_ok(server, rows, "INSERT INTO bench_sink FORMAT TSV")),
        ):
            t = time.perf_counter()
            try:
                send()
            except Exception as exc:
                load.errors.append(short(exc))
                continue
            (load.select_ms if kind == "select" else load.insert_ms).append(
                (time.perf_counter() - t) * 1000
            )
        time.sleep(0.5)
    stop.set()
    for t in readers:
        t.join(90)
    return load


def post_ok(server: Server, body: bytes, query: str) -> None:
    out, detail = post(server, body, 60, query=query)
    if not out.startswith("HTTP 200"):
        raise RuntimeError(f"{out}: {detail}")


def select_alone(server: Server, n: int = 200) -> float:
    """Median ms of ``n`` SELECT 1, each on a new connection, one after the other."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        http_query(server.port, ADMIN, "SELECT 1", "1")
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times[n // 5 :])


# --- the run ------------------------------------------------------------------------------


PAIRS = [(READER, ADMIN), (ADMIN, READER)]
HOSTILE: dict[str, Callable[[Server], tuple[str, str]]] = {
    "(a) 30 MB query body": big_query,
    "(b) 2 GiB body, streamed": huge_stream,
    "(c) zstd 32 KB -> 1 GiB": bomb,
}


@dataclass
class Result:
    code: str = ""
    error: str = ""  # the endpoint did not start
    iso: dict[tuple[str, str], Isolation] = field(default_factory=dict)
    insert: dict[str, float] = field(default_factory=dict)
    insert_errors: dict[str, str] = field(default_factory=dict)
    hostile: dict[str, Hostile] = field(default_factory=dict)
    load: Load | None = None
    select_ms: float | None = None
    notes: list[str] = field(default_factory=list)


def run_target(
    name: str, root: Path, workdir: Path, data: InsertData, args: argparse.Namespace
) -> Result:
    res = Result()
    server = Server(name, root, workdir)
    try:
        try:
            res.code = server.code_path()
            say(f"{name}: imports {res.code}")
            server.start()
        except StartError as exc:
            res.error = str(exc)
            say(f"{name}: the endpoint did not start: {short(exc, 600)}")
            return res
        for a_user, b_user in PAIRS[: 1 if args.quick else 2]:
            say(f"{name}: isolation, A={a_user} runs 8 s, B={b_user} runs SELECT 1 x{args.n}")
            try:
                server.ensure()
                res.iso[a_user, b_user] = http_isolation(server.port, a_user, b_user, args.n)
            except Exception as exc:
                res.iso[a_user, b_user] = Isolation(a_error=short(exc), b_errors=[short(exc)])
        say(f"{name}: inserts ({args.repeats} repeats)")
        try:
            server.ensure()
            res.insert, res.insert_errors = insert_throughput(server.url, data, args.repeats)
        except Exception as exc:
            res.insert_errors["all"] = short(exc, 300)
        for kind, error in res.insert_errors.items():
            say(f"{name}: inserts, {kind}: FAILED: {error}")
        for label, send in HOSTILE.items():
            say(f"{name}: {label}")
            res.hostile[label] = hostile(server, send, args.rss_cap_gib * GIB)
            say(f"{name}: {label}: {res.hostile[label].outcome}: {res.hostile[label].detail}")
        say(f"{name}: the admin beside a reader's 40 big Native answers")
        try:
            server.ensure()
            res.load = answers_load(server)
        except Exception as exc:
            res.load = Load(errors=[short(exc, 300)])
        say(f"{name}: SELECT 1 alone")
        try:
            server.ensure()
            res.select_ms = select_alone(server)
        except Exception as exc:
            res.notes.append(f"SELECT 1 alone failed: {short(exc)}")
    finally:
        server.stop()
    return res


def add_worktree(ref: str, where: Path) -> str:
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), sha],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return sha


def remove_worktree(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)],
        capture_output=True,
        check=False,
        timeout=120,
    )
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "prune"], capture_output=True, check=False, timeout=60
    )


def changed_files(sha: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "diff", "--shortstat", sha, "--", "warehouse/embedded"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.strip()
    return out or "no changes"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def hostile_cell(r: Result, label: str, what: str) -> str:
    h = r.hostile.get(label)
    if h is None:
        return "-"
    if what == "outcome":
        return h.outcome
    if what == "rss":
        return h.rss_text()
    if what == "ping":
        return h.ping_text()
    return ("yes" if h.alive_after else "NO") + (" (restarted before)" if h.restarted else "")


def insert_cell(r: Result, kind: str) -> str:
    if kind in r.insert_errors or "all" in r.insert_errors:
        return "FAILED"
    return rate(r.insert.get(kind))


def iso_cell(r: Result, pair: tuple[str, str], what: str) -> str:
    iso = r.iso.get(pair)
    if iso is None:
        return "-"
    return iso.b_text() if what == "b" else iso.a_text()


def reader_statuses(r: Result) -> str:
    if r.load is None:
        return "-"
    return " ".join(f"{k}:{v}" for k, v in sorted(r.load.reader.items()))


def report(
    results: dict[str, Result],
    *,
    direct_iso: Isolation | None,
    direct_rate: float | None,
    data: InsertData,
    args: argparse.Namespace,
    sha: str,
) -> None:
    cur, base = results["current"], results["baseline"]
    rows: list[tuple[str, ...]] = [("", "chDB in-process", "current", f"baseline {sha}")]

    def add(label: str, direct: str, get: Callable[[Result], str]) -> None:
        rows.append((label, direct, *("not started" if r.error else get(r) for r in (cur, base))))

    for pair in PAIRS[: 1 if args.quick else 2]:
        a_user, b_user = pair
        add(
            f"1. B={b_user} SELECT 1 x{args.n} while A={a_user} runs 8 s: median/max ms",
            direct_iso.b_text() if direct_iso else "-",
            lambda r: iso_cell(r, pair, "b"),  # noqa: B023
        )
        add(
            f"   A={a_user}'s 8 s query took (s)",
            direct_iso.a_text() if direct_iso else "-",
            lambda r: iso_cell(r, pair, "a"),  # noqa: B023
        )
    mb = len(data.native) / 1e6
    labels = {
        "native lz4": f"2. insert {data.native_rows:,} rows as Native ({mb:.0f} MB), lz4: rows/s",
        "native plain": "   the same, uncompressed: rows/s",
        "sink": f"   client.insert of {data.sink_rows:,} Python rows (the sink's call): rows/s",
    }
    for kind, label in labels.items():
        direct = rate(direct_rate) if kind != "sink" else "-"
        add(label, direct, lambda r: insert_cell(r, kind))  # noqa: B023
    for kind in INSERT_KINDS:
        c, b = cur.insert.get(kind), base.insert.get(kind)
        rows.append((f"   current / baseline ({kind})", "", f"{c / b:.2f}" if c and b else "-", ""))
    for label in HOSTILE:
        for what, text in (
            ("outcome", f"3. {label}: outcome"),
            ("rss", "   RSS before / peak / after (MiB)"),
            ("ping", "   /ping meanwhile: median/max ms"),
            ("alive", "   alive after"),
        ):
            add(text, "", lambda r: hostile_cell(r, label, what))  # noqa: B023
    add("4. admin SELECT 1 beside the reader's 40 x 15 MB Native: median/max ms", "",
        lambda r: r.load.text("select") if r.load else "-")  # fmt: skip
    add("   a 1,000-row insert meanwhile: median/max ms", "",
        lambda r: r.load.text("insert") if r.load else "-")  # fmt: skip
    add("   the reader's answers by status", "", reader_statuses)
    add("5. SELECT 1 alone, one after another: median ms", "",
        lambda r: f"{r.select_ms:.1f}" if r.select_ms is not None else "-")  # fmt: skip
    print(table(rows))
    print()
    for name, r in results.items():
        print(f"{name}: code {r.code or '-'}")
        if r.error:
            print(f"  did not start: {short(r.error, 800)}")
        for label, h in r.hostile.items():
            print(f"  {label}: {h.detail}")
        for kind, error in r.insert_errors.items():
            print(f"  inserts, {kind}: {error}")
    print()
    for name, r in results.items():
        print(summary(name, r, results, direct_iso))


def summary(name: str, r: Result, results: dict[str, Result], direct: Isolation | None) -> str:
    if r.error:
        return f"{name}: did not start ({short(r.error, 160)})"
    parts = []
    for (a, b), iso in r.iso.items():
        parts.append(f"B={b} waits {iso.b_text()} ms while A={a} runs")
    if direct is not None and direct.b_ms:
        parts[-1:] = (
            [parts[-1] + f" (chDB {statistics.median(direct.b_ms):.0f} ms)"] if parts else []
        )
    other = results["baseline" if name == "current" else "current"]
    for kind in ("native lz4", "sink"):
        if kind in r.insert:
            ratio = ""
            if other.insert.get(kind) and name == "current":
                ratio = f" = {r.insert[kind] / other.insert[kind]:.2f}x baseline"
            parts.append(f"insert {kind} {r.insert[kind]:,.0f} rows/s{ratio}")
    if r.insert_errors:
        parts.append(f"insert FAILED: {', '.join(r.insert_errors)}")
    held = [h for h in r.hostile.values() if h.alive_after and "KILLED" not in h.outcome]
    peak = max((h.rss_peak or 0 for h in r.hostile.values()), default=0)
    worst_ping = max((max(h.ping_ms, default=0) for h in r.hostile.values()), default=0)
    parts.append(
        f"hostile bodies: survived {len(held)}/{len(r.hostile)}, peak RSS {mib(peak)} MiB,"
        f" worst /ping {worst_ping:,.0f} ms"
    )
    return f"{name}: " + "; ".join(parts)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks endpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--baseline-ref", default="ffd1c2f", help="git ref of the baseline endpoint")
    p.add_argument("--quick", action="store_true", help="fewer repeats, one user pairing")
    p.add_argument(
        "--targets",
        default="baseline,current",
        help="which endpoints to run (comma-separated; default baseline,current)",
    )
    p.add_argument(
        "--rss-cap-gib",
        type=float,
        default=6.0,
        help="KILL a server whose RSS passes this during a hostile body (default 6)",
    )
    args = p.parse_args(argv)
    args.n = 3 if args.quick else 5
    args.repeats = 2 if args.quick else 5
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    data = InsertData(
        native_rows=200_000 if args.quick else 1_000_000,
        sink_rows=20_000 if args.quick else 100_000,
    )
    results: dict[str, Result] = {}
    direct_iso: Isolation | None = None
    direct_rate: float | None = None
    with tempfile.TemporaryDirectory(prefix="gpugap-bench-endpoint-") as tmp:
        tree = Path(tmp) / "baseline-src"
        try:
            sha = add_worktree(args.baseline_ref, tree)
        except subprocess.CalledProcessError as exc:
            say(f"cannot check out {args.baseline_ref}: {short(exc.stderr or str(exc), 400)}")
            remove_worktree(tree)
            return 2
        say(
            f"baseline {args.baseline_ref} = {sha} in {tree}; current = {REPO} "
            f"(warehouse/embedded vs {sha}: {changed_files(sha)})"
        )
        direct: Direct | None = None
        try:
            direct = Direct(Path(tmp) / "chdb")
            say("chDB in-process: isolation")
            direct_iso = direct.isolation(args.n)
            say("chDB in-process: inserts")
            direct_rate = prepare_inserts(direct, data, args.repeats)
            zstd_bomb()
            for name, root in (("baseline", tree), ("current", REPO)):
                if name in args.targets.split(","):
                    results[name] = run_target(name, root, Path(tmp) / name, data, args)
                else:
                    results[name] = Result(error="skipped (--targets)")
        finally:
            if direct is not None:
                direct.close()
            remove_worktree(tree)
    report(results, direct_iso=direct_iso, direct_rate=direct_rate, data=data, args=args, sha=sha)
    print(f"\n(took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
