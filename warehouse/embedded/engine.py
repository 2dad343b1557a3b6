"""The ClickHouse engine (chDB) in a process of its own, and a fresh connection for every
request.

The engine process (enginehost.py) confines itself before it loads the engine: it can read and
write only its data directory and read its libraries, opens no network connection and starts no
program (confine.py); it inherits no secret. This side starts it, hands it a socket pair per
engine connection and speaks wire.py over it; if it stops, every call says so.

chDB runs queries of different connections in parallel, and a connection's settings, current
database and temporary tables are its own. So each request gets a connection of its own (cheap
to open), with its settings applied and, for a reader, engine-level ``readonly=1`` set last;
it is closed after the request. Nothing one request sets can reach another, a slow query holds
only its own connection, and no reset can fail halfway. The engine's configuration
(engine_config.py) bounds every query and leaves host sources ungranted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpugap.schemas.errors import ServiceError
from gpugap.warehouse.embedded import wire
from gpugap.warehouse.embedded.confine import ConfinementError
from gpugap.warehouse.embedded.connection import Connection
from gpugap.warehouse.embedded.errors import EngineError

log = logging.getLogger(__name__)
# what the engine process inherits: no secret, nothing of the endpoint's configuration
_INHERITED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
START_TIMEOUT_S = 120.0


class EngineProcess:
    """The engine process (enginehost.py), and this side of its connections.

    ``confine``: ``required`` (the process confines itself or does not start), ``best-effort``
    (what the kernel allows, the rest logged) or ``off``. ``startup``: statements the engine
    runs before it serves (the workloads). ``on_exit`` is called, from a thread, if the process
    ends while the endpoint still uses it."""

    def __init__(
        self,
        path: Path,
        config: Path | None = None,
        *,
        confine: str = "required",
        startup: Sequence[str] = (),
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if re.search(r"[?&#%]", str(path)):
            raise EngineError(f"the data path may not contain ?, &, # or %: {path}", 36)
        scratch = path / "tmp"  # the engine's temporary files stay in its data directory
        scratch.mkdir(exist_ok=True)
        self._control, theirs = socket.socketpair()
        their_fd = theirs.fileno()  # the same number in the engine process (pass_fds)
        env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        env["TMPDIR"] = str(scratch)
        env["PYTHONPATH"] = _code_roots(env.get("PYTHONPATH"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpugap.warehouse.embedded.enginehost"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=path,
            pass_fds=(their_fd,),
        )
        theirs.close()
        self._stopping = False
        self._lines = _EngineLog(self.proc)
        job = {
            "control": their_fd,
            "parent": os.getpid(),
            "path": str(path.resolve()),
            "config": str(config.resolve()) if config is not None else None,
            "confine": confine,
            "startup": list(startup),
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode())
        self.proc.stdin.close()
        self._control.settimeout(START_TIMEOUT_S)
        try:
            ready, _ = wire.receive(self._control)
        except (OSError, wire.Closed):
            self.proc.kill()
            self.proc.wait()
            raise ServiceError(
                "the ClickHouse engine process did not start: "
                + (self._lines.tail() or "it said nothing")
            ) from None
        self._control.settimeout(None)
        if "error" in ready:
            self.proc.wait()
            if ready.get("confinement"):
                raise ConfinementError(ready["error"])
            raise ServiceError(f"the ClickHouse engine process did not start: {ready['error']}")
        self.confinement: dict[str, Any] = ready["confinement"]
        self._control_lock = threading.Lock()
        self.on_exit = on_exit
        threading.Thread(target=self._watch, name="engine-watch", daemon=True).start()
        self._keeper = self.connect()  # for KILL QUERY
        self._keeper_lock = threading.Lock()
        self.version = self._keeper.query("SELECT version()").data.decode().strip()
        names = self._keeper.query("SELECT name FROM system.table_functions", "TSVRaw")
        self.table_functions = frozenset(names.data.decode().split())
        self.baseline = self._keeper.changed_settings()

    def connect(self) -> Connection:
        """A new engine connection: a socket pair, one end handed to the engine process."""
        ours, theirs = socket.socketpair()
        try:
            with self._control_lock:
                socket.send_fds(self._control, [b"c"], [theirs.fileno()])
        except OSError:
            ours.close()
            raise EngineError("the engine process is not running", 1001) from None
        finally:
            theirs.close()
        conn = Connection(ours)
        conn.call({})  # its greeting: the engine opened the connection, or why not
        return conn

    def kill(self, marker: str) -> None:
        """Cancel the query (on any connection) whose log_comment is ``marker``."""
        with self._keeper_lock, contextlib.suppress(EngineError):  # it may have ended meanwhile
            self._keeper.query(
                "KILL QUERY WHERE Settings['log_comment'] = {m:String} ASYNC",
                params={"m": marker},
            )

    def close(self, timeout_s: float = 60.0) -> None:
        """Close the connections first (the caller's), then the engine: it finishes its
        writes and exits."""
        self._stopping = True
        with self._keeper_lock:
            self._keeper.close()
        self._control.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _watch(self) -> None:
        code = self.proc.wait()
        if not self._stopping:
            log.error("the ClickHouse engine process ended with %s: %s", code, self._lines.tail())
            if self.on_exit is not None:
                self.on_exit(code)


def _code_roots(inherited: str | None) -> str:
    """PYTHONPATH for the engine process: the directories this process found gpugap's
    packages in first, so that both run the same code (a checkout run as ``python -m
    gpugap`` from its root finds its own before an installed one)."""
    roots: list[str] = []
    for package in ("gpugap",):
        spec = importlib.util.find_spec(package)
        for location in spec.submodule_search_locations or () if spec else ():
            root = str(Path(location).resolve().parent)
            if root not in roots:
                roots.append(root)
    return os.pathsep.join([*roots, *(inherited.split(os.pathsep) if inherited else [])])


class _EngineLog:
    """The engine process's output, a line at a time into this process's log: its own
    messages (with what a query put in them) never start a line of ours."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._recent: list[str] = []
        threading.Thread(target=self._pump, args=(proc,), name="engine-log", daemon=True).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue
            self._recent = [*self._recent[-19:], line]
            log.warning("engine: %s", line)

    def tail(self) -> str:
        return " | ".join(self._recent[-5:])
