"""The embedded endpoint as a child process (tests, the demo, ``services``): start it, wait
until it answers, stop it by PID (TERM, or KILL to simulate a crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpugap.schemas.errors import ServiceError


class EmbeddedClickHouse:
    def __init__(
        self,
        path: Path,
        port: int,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        log: Path | None = None,
        *,
        command: list[str] | None = None,
    ) -> None:
        self.path, self.port, self.host = path, port, host
        # what runs ``serve`` (a test runs it with its checks off: tests/security/unguarded.py)
        self.command = command or [sys.executable, "-m", "gpugap", "clickhouse", "serve"]
        self.env = {**os.environ, **(env or {})}
        self.log = log or path.parent / f"{path.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def password_file(self) -> Path:
        """Where the endpoint keeps the admin's password it generated (none configured)."""
        return self.path.parent / f"{self.path.name}.password"

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *self.command,
                    "--path",
                    str(self.path),
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"the ClickHouse endpoint exited with {self.proc.returncode}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            if answers(self.url):
                return
            time.sleep(0.2)
        self.stop()
        raise ServiceError(f"the ClickHouse endpoint did not answer on {self.url} in {timeout_s}s")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as in a crash."""
        self.stop(signal.SIGKILL)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
