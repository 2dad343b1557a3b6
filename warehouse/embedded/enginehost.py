"""The engine process: chDB, confined, serving the endpoint's engine connections.

``gpugap clickhouse serve`` starts it (engine.py) with an environment of a few names and no
secret, hands it its job on stdin and a control socket; it confines itself (confine.py) before
it loads the engine, then serves each socket the endpoint passes it over the control socket as
one engine connection of its own (settings, database, temporary tables), in a thread. The
endpoint decides who may do what; this process only runs what it is sent, and cannot reach the
host whatever that is. It holds no password: its one engine user has none, and the endpoint's
users are the endpoint's business.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import socket
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

from gpugap.warehouse.embedded import confine, wire

_PR_SET_PDEATHSIG = 1
# what the engine reads of the machine besides its libraries: CPU and memory limits (cgroups,
# topology), the clock's zone, its own memory map (a thread finds its stack there)
MACHINE = (
    "/sys/fs/cgroup", "/sys/devices/system/cpu", "/sys/devices/system/node",
    "/sys/kernel/mm/transparent_hugepage", "/proc/self/maps", "/proc/meminfo",
    "/proc/sys/vm/overcommit_memory", "/etc/localtime", "/usr/share/zoneinfo",
    "/dev/urandom", "/etc/ld.so.cache",
)  # fmt: skip
SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
# the packages the engine process imports code from
PACKAGES = ("gpugap", "chdb", "chdb_core")


def library_paths() -> list[Path]:
    """Where this interpreter and the engine load code from: the interpreter's own library
    directories (the standard library, site-packages), the directories of gpugap's own
    packages (an editable install keeps them in a checkout, whose other files stay out) and
    the system's shared libraries."""
    found = [Path(p) for p in SYSTEM_LIBRARIES]
    found += [Path(p) for p in sysconfig.get_paths().values()]
    prefixes = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for entry in (Path(p) for p in sys.path if p and Path(p).is_absolute()):
        if entry.name in ("site-packages", "dist-packages") or any(
            entry.is_relative_to(prefix) for prefix in prefixes
        ):
            found.append(entry)
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None:
            for location in (Path(p) for p in spec.submodule_search_locations or ()):
                found.append(location)
                # a checkout keeps gpugap's parts beside it, linked in (gpugap/schemas ->
                # ../schemas): Landlock sees the files where they are
                found += [c.resolve() for c in location.iterdir() if c.is_symlink() and c.is_dir()]
    return sorted({p for p in found if p.exists()})


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    control = socket.socket(fileno=int(job["control"]))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the endpoint gone: so is this
    if os.getppid() != int(job["parent"]):
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the endpoint's
    path = Path(job["path"])
    try:
        report = None
        if job["confine"] != "off":
            config = [Path(job["config"])] if job["config"] else []
            report = confine.confine(
                [path],
                [*library_paths(), *(Path(p) for p in MACHINE), *config],
                required=job["confine"] == "required",
            )
        import chdb

        dsn = f"file:{path}" + (f"?config-file={job['config']}" if job["config"] else "")
        keeper = chdb.connect(dsn)  # the engine lives while one connection is open
        for statement in job.get("startup") or ():  # the workloads (engine_config.workloads)
            keeper._conn.query(statement, "TabSeparated")
    except confine.ConfinementError as exc:  # the endpoint reports it and stops
        wire.send(control, {"error": str(exc), "confinement": True})
        return 1
    except Exception as exc:
        wire.send(control, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    wire.send(control, {"ok": 1, "confinement": _describe(report)})
    threads: list[threading.Thread] = []
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1, 4)
        except OSError:
            break
        if not message and not fds:
            break  # the endpoint is stopping (or gone)
        for fd in fds:
            thread = threading.Thread(
                target=_serve, args=(socket.socket(fileno=fd), dsn), daemon=True
            )
            thread.start()
            threads.append(thread)
        threads = [t for t in threads if t.is_alive()]
    for thread in threads:  # the endpoint closed its sockets first: these end on their own
        thread.join(timeout=30)
    keeper.close()
    return 0


def _describe(report: confine.Report | None) -> dict[str, Any]:
    if report is None:
        return {"confined": False, "text": "not confined (GPUGAP_CLICKHOUSE_SERVE_CONFINE=off)"}
    return {"confined": report.complete, "text": report.describe(), "problems": report.problems}


def _serve(sock: socket.socket, dsn: str) -> None:
    """One engine connection: requests in order until the endpoint closes the socket."""
    import chdb

    with sock:
        try:
            wrapper = chdb.connect(dsn)  # (closes the connection when collected: kept)
        except Exception as exc:
            _answer_error(sock, exc)
            return
        inserter = None
        try:
            wire.send(sock, {"ok": 1})
            while True:
                head, payload = wire.receive(sock)
                try:
                    inserter = _do(sock, wrapper, head, payload, inserter)
                except Exception as exc:  # the engine's error: ClickHouse's text
                    _answer_error(sock, exc)
        except (wire.Closed, OSError, ValueError):
            pass  # the endpoint closed this connection (or broke the protocol)
        finally:
            if inserter is not None:
                inserter.cancel()
            wrapper.close()


def _do(
    sock: socket.socket, conn: Any, head: dict[str, Any], payload: bytearray, inserter: Any
) -> Any:
    """Run one request on ``conn`` (chDB's connection) and answer it; returns the INSERT
    still open on the connection, if any."""
    op = head["op"]
    if op == "query":
        res = conn._conn.query(head["sql"], head["fmt"], params=head.get("params") or {})
        if res.has_error():
            raise RuntimeError(res.error_message())
        data = res.get_memview().view() if res.size() else b""
        limit = head.get("limit")
        if limit is not None and len(data) > limit:  # (not sent: the endpoint says why)
            wire.send(sock, {"too_large": len(data), "limit": limit})
            return inserter
        summary = {
            "rows_read": res.storage_rows_read(),
            "bytes_read": res.storage_bytes_read(),
            "rows_written": res.rows_written(),
            "bytes_written": res.bytes_written(),
            "result_rows": res.rows_read(),
            "result_bytes": res.bytes_read(),
        }
        if head.get("admit") and len(data):
            # the endpoint counts the answer against its user's bytes waiting to be sent
            # before it takes it (or says to drop it)
            wire.send(sock, {"ok": 1, "admit": len(data), **summary})
            decision, _ = wire.receive(sock)
            if decision.get("take"):
                wire.send(sock, {"ok": 1}, data)
            return inserter
        wire.send(sock, {"ok": 1, **summary}, data)
        return inserter
    if op == "insert":
        if inserter is not None:
            inserter.cancel()
        inserter = conn.send_insert(head["statement"], head["fmt"])
        wire.send(sock, {"ok": 1})
        return inserter
    if inserter is None:
        raise RuntimeError("Code: 1001. DB::Exception: no INSERT is open on this connection")
    if op == "append":
        inserter.append(bytes(payload))
        wire.send(sock, {"ok": 1})
        return inserter
    if op == "finish":
        done, inserter = inserter.finish(), None
        wire.send(
            sock, {"ok": 1, "rows_written": done.rows_written, "bytes_written": done.bytes_written}
        )
        return None
    if op == "cancel":
        inserter.cancel()
        wire.send(sock, {"ok": 1})
        return None
    raise RuntimeError(f"Code: 1001. DB::Exception: unknown operation {op!r}")


def _answer_error(sock: socket.socket, exc: BaseException) -> None:
    wire.send(sock, {"error": str(exc)})


if __name__ == "__main__":
    sys.exit(main())
