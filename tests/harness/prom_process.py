"""A server of the Prometheus project (Prometheus, Alertmanager) as a test's process: started on
a free loopback port, ready when ``/-/ready`` answers 200, stopped with SIGTERM (then SIGKILL),
its output kept in a log whose tail goes into every error."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from gpugap.services.kafka import free_port


class PromProcess:
    name = "server"
    #: how often start() asks /-/ready
    poll_s = 0.2

    def __init__(self, exe: Path, log: Path) -> None:
        self.exe = exe
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        """The command line after the executable."""
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0) -> None:
        assert self.proc is None, "already running"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.exe), *self.args()],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(self.poll_s)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {timeout_s:.0f}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        """Stop it and remove what it kept (a subclass's own files)."""
        self.stop()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
