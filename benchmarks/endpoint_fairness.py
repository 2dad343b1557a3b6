"""Fair query slots on the embedded endpoint: the sink's inserts and the admin's ``SELECT 1``
while the read-only user keeps twice its share of slow queries running, beside the same load
on an endpoint where one user may take every slot (the behaviour before the slots were shared
out per user).

    .venv/bin/python -m benchmarks endpoint-fairness [--phase-s 25] [--readers 16]

Three phases, each ``--phase-s`` long: (a) idle and (b) the reader's load on an endpoint with
the default share (``GPUGAP_CLICKHOUSE_SERVE_MAX_CONCURRENT_QUERIES_FOR_USER=0``: the 16 slots
divided between ``default`` and ``reader``, 8 each); (c) the same load on a second endpoint
with ``..._FOR_USER=16``. The admin inserts 1,000 GPU-minute rows through the sink's own
insert (``ClickHouseSink._insert``: ``client.insert`` as the sink calls it) every 0.5 s, and
runs ``SELECT 1`` on its own connection every 0.5 s, each one at a time as the sink does;
latencies count every attempt, a 202 (it waited the whole queue wait) included. The sink's
insert is two requests: clickhouse-connect asks ``DESCRIBE TABLE`` first, and retries that
read-only request itself (twice) when it gets a 503, so a 202 there shows as a longer insert,
not a failure: those retries are counted from clickhouse-connect's DEBUG log. The reader's
queries (``--readers`` threads, each starting its next query when one ends) are counted when
they end inside the phase. Every endpoint is a throwaway one on 127.0.0.1 (benchmarks.database),
stopped at the end of its phases. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from benchmarks.endpoint import READER, READER_PW, http_query, say, short, table
from benchmarks.slurm_hook import pct

DATABASE = "gpugap_bench_fairness"
SLOTS, QUEUE_WAIT_S = 16, 10.0  # the endpoint's defaults, set explicitly for both endpoints
INSERT_ROWS = 1000
EVERY_S = 0.5  # the admin's cadence, inserts and SELECT 1 each
WARMUP_S = 1.0  # the reader's queries take their slots before the admin's are timed


def slow_query(seconds: int) -> tuple[str, str]:
    """A reader's query of about ``seconds`` (rounded to 2 s) and its answer. ``readonly=1``
    forbids a query's SETTINGS (so no ``sleepEachRow`` with ``max_block_size=1``): scalar
    subqueries of ``sleep(2)``, which run one after the other (as benchmarks.endpoint.SLOW)."""
    n = max(1, seconds // 2)
    terms = " + ".join(f"(SELECT sleep(2) + {i})" for i in range(1, n + 1))
    return f"SELECT {terms}", str(n * (n + 1) // 2)


def refused(exc: BaseException) -> bool:
    """The endpoint's code 202 (no slot within the queue wait), as either client words it."""
    text = str(exc)
    return "Too many simultaneous queries" in text or "error code 202" in text


class Retries(logging.Handler):
    """clickhouse-connect's own retries of a 503 (the endpoint's 202), per thread: it retries a
    read-only request (an insert's DESCRIBE TABLE) and logs each retry at DEBUG."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: dict[int, int] = defaultdict(int)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying requests with status code 503"):
            self.counts[threading.get_ident()] += 1

    def mine(self) -> int:
        return self.counts[threading.get_ident()]


RETRIES = Retries()


@contextmanager
def counting_retries() -> Iterator[None]:
    log = logging.getLogger("clickhouse_connect")
    saved = log.level, log.propagate
    log.setLevel(logging.DEBUG)
    log.propagate = False  # its DEBUG records go to RETRIES only
    log.addHandler(RETRIES)
    try:
        yield
    finally:
        log.removeHandler(RETRIES)
        log.setLevel(saved[0])
        log.propagate = saved[1]


@dataclass
class Series:
    """One kind of request in one phase: latency of every attempt (ms), and its failures."""

    ms: list[float] = field(default_factory=list)
    refused: int = 0
    retried: int = 0  # 202s clickhouse-connect retried by itself (not failures)
    errors: list[str] = field(default_factory=list)  # anything but a 202
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, ms: float, exc: BaseException | None, retried: int = 0) -> None:
        with self.lock:
            self.ms.append(ms)
            self.retried += retried
            if exc is not None and refused(exc):
                self.refused += 1
            elif exc is not None:
                self.errors.append(short(exc, 200))

    def latency(self) -> str:
        if not self.ms:
            return "-"
        return f"{pct(self.ms, 50):,.0f} / {pct(self.ms, 95):,.0f} / {max(self.ms):,.0f}"

    def counts(self) -> str:
        return f"{len(self.ms)} / {self.refused} / {len(self.errors)}"

    def sent(self) -> str:
        return f"{len(self.ms)} / {self.refused} / {self.retried} / {len(self.errors)}"


@dataclass
class Phase:
    insert: Series = field(default_factory=Series)
    select: Series = field(default_factory=Series)
    reader: Series = field(default_factory=Series)
    readers: int = 0


@dataclass
class Target:
    """One running endpoint: its port, the admin's sink and client, the rows to insert."""

    port: int
    sink: Any
    admin: Any
    rows: list[Any]
    per_user: int


@contextmanager
def endpoint(per_user: int) -> Iterator[Target]:
    """A throwaway endpoint with the reader enabled and ``per_user`` slots per user (0: the
    default share), its warehouse migrated; the sink connected as the admin."""
    from benchmarks.database import bench_database
    from benchmarks.endpoint import START
    from benchmarks.warehouse import SYNTHETIC
    from gpugap.sinks.clickhouse.sink import ClickHouseSink
    from gpugap.warehouse.client import connect
    from gpugap.warehouse.rows import MINUTE_COLUMNS

    env = {
        "GPUGAP_CLICKHOUSE_READONLY_USER": READER,
        "GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PW,
        "GPUGAP_CLICKHOUSE_SERVE_MAX_CONCURRENT_QUERIES": str(SLOTS),
        "GPUGAP_CLICKHOUSE_SERVE_MAX_CONCURRENT_QUERIES_FOR_USER": str(per_user),
        "GPUGAP_CLICKHOUSE_SERVE_QUEUE_WAIT_S": str(QUEUE_WAIT_S),
    }
    with bench_database(None, DATABASE, env=env) as (settings, admin):
        params = {"gpus": 1000, "first_minute": 0, "start": START, "rows": INSERT_ROWS}
        rows = admin.query(SYNTHETIC, parameters=params).result_rows
        if len(rows) != INSERT_ROWS or len(rows[0]) != len(MINUTE_COLUMNS):
            raise RuntimeError(f"synthetic rows: {len(rows)} x {len(rows[0])}, not gpu_minutes")
        sink = ClickHouseSink(settings)
        sink._client = connect(settings)  # what ClickHouseSink.start() connects
        try:
            port = urlparse(settings.url).port or 0
            yield Target(port, sink, admin, rows, per_user or SLOTS // 2)
        finally:
            sink._client.close()


def paced(deadline: float, send: Callable[[], object], series: Series) -> None:
    """``send`` every EVERY_S until ``deadline``, one at a time (a late one starts the next
    at once): each attempt timed from its start."""
    while time.perf_counter() < deadline:
        t, retried = time.perf_counter(), RETRIES.mine()
        error: BaseException | None = None
        try:
            send()
        except Exception as exc:
            error = exc
        series.add((time.perf_counter() - t) * 1000, error, RETRIES.mine() - retried)
        time.sleep(max(0.0, min(t + EVERY_S, deadline) - time.perf_counter()))


def reader(
    deadline: float, port: int, query: tuple[str, str], query_s: int, series: Series
) -> None:
    """The reader's slow queries back to back until ``deadline``; one counts when it ends in
    the phase (the endpoint is stopped after, so those still running end with an error)."""
    sql, answer = query
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        error: BaseException | None = None
        try:
            http_query(port, READER, sql, answer, timeout_s=query_s + QUEUE_WAIT_S + 30)
        except Exception as exc:
            error = exc
        if time.perf_counter() > deadline:
            return
        series.add((time.perf_counter() - t) * 1000, error)


def run_phase(target: Target, name: str, readers: int, query_s: int, phase_s: float) -> Phase:
    from gpugap.warehouse.rows import MINUTE_COLUMNS

    ph = Phase(readers=readers)
    query = slow_query(query_s)
    t0 = time.perf_counter()
    deadline = t0 + (WARMUP_S if readers else 0.0) + phase_s
    say(f"{name}: {readers} reader queries of {query_s} s, {phase_s:.0f} s")
    threads = [
        threading.Thread(
            target=reader, args=(deadline, target.port, query, query_s, ph.reader), daemon=True
        )
        for _ in range(readers)
    ]
    for th in threads:
        th.start()
    if readers:
        time.sleep(WARMUP_S)
    admin = [
        threading.Thread(
            target=paced,
            args=(
                deadline,
                lambda: target.sink._insert("gpu_minutes", target.rows, MINUTE_COLUMNS),
                ph.insert,
            ),
            daemon=True,
        ),
        threading.Thread(
            target=paced,
            args=(deadline, lambda: target.admin.command("SELECT 1"), ph.select),
            daemon=True,
        ),
    ]
    for th in admin:
        th.start()
    # bounded: a request waits QUEUE_WAIT_S for a slot, then a 202; an insert is DESCRIBE
    # (tried 3 times) and INSERT
    for th in admin:
        th.join(timeout=max(0.0, deadline - time.perf_counter()) + 4 * QUEUE_WAIT_S + 10)
    say(
        f"{name}: insert {ph.insert.latency()} ms ({ph.insert.sent()}), "
        f"SELECT 1 {ph.select.latency()} ms ({ph.select.sent()}; sent / 202 / retried / other), "
        f"reader {ph.reader.counts()} (ended / 202 / other)"
    )
    return ph


def report(phases: dict[str, Phase], per_user: tuple[int, int], query_s: int) -> None:
    fair, before = per_user
    a, b, c = phases["a"], phases["b"], phases["c"]
    head = (
        "",
        "(a) idle",
        f"(b) reader x{b.readers}, {fair}/user",
        f"(c) reader x{c.readers}, {before}/user (before)",
    )
    rows: list[tuple[str, ...]] = [
        head,
        (
            f"sink insert {INSERT_ROWS:,} rows: p50 / p95 / max ms",
            *(p.insert.latency() for p in (a, b, c)),
        ),
        (
            "   sent / 202 / 202 retried by the client / other",
            *(p.insert.sent() for p in (a, b, c)),
        ),
        ("admin SELECT 1: p50 / p95 / max ms", *(p.select.latency() for p in (a, b, c))),
        (
            "   sent / 202 / 202 retried by the client / other",
            *(p.select.sent() for p in (a, b, c)),
        ),
        (
            f"reader {query_s} s queries: ended / 202 / other errors",
            "-",
            b.reader.counts(),
            c.reader.counts(),
        ),
    ]
    print(table(rows))
    for label, ph in phases.items():
        for kind, series in (("insert", ph.insert), ("SELECT 1", ph.select), ("reader", ph.reader)):
            for error in sorted(set(series.errors))[:3]:
                print(f"  ({label}) {kind} error: {error}")
    pb, pc = (pct(p.insert.ms, 95) if p.insert.ms else None for p in (b, c))
    ratio = f"{pc / pb:.1f}x" if pb and pc else "-"
    print(
        f"\ninsert p95, (c) {before}/user / (b) {fair}/user: {ratio} "
        f"({pc or 0:,.0f} ms / {pb or 0:,.0f} ms)"
    )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks endpoint-fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--phase-s", type=float, default=25.0, help="each phase's length (25 s)")
    p.add_argument(
        "--readers", type=int, default=SLOTS, help="concurrent reader queries in (b), (c) (16)"
    )
    p.add_argument(
        "--query-s",
        type=int,
        default=12,
        help="one reader query's length, even (12 s: longer than the 10 s queue wait)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    phases: dict[str, Phase] = {}
    shares = []
    for per_user, labels in ((0, ("a", "b")), (SLOTS, ("c",))):
        say(f"endpoint with MAX_CONCURRENT_QUERIES_FOR_USER={per_user}: starting")
        with endpoint(per_user) as target, counting_retries():
            shares.append(target.per_user)
            for label in labels:
                readers = 0 if label == "a" else args.readers
                phases[label] = run_phase(target, label, readers, args.query_s, args.phase_s)
    report(phases, (shares[0], shares[1]), args.query_s)
    print(f"(took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
