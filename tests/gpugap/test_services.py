"""`gpugap services` against the real broker process: up, status, down, no second download."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpugap.services.kafka import broker_ready, free_port, java_major, process_alive

pytestmark = pytest.mark.kafka


def gpugap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpugap", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_up_status_down_and_a_second_up_downloads_nothing(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "GPUGAP_SERVICES_STATE_DIR": str(tmp_path / "state"),
        "GPUGAP_SERVICES_CACHE_DIR": str(tmp_path / "cache"),  # empty: the first up fetches
        "GPUGAP_SERVICES_KAFKA_PORT": str(port),
        "GPUGAP_SERVICES_KAFKA_CONTROLLER_PORT": str(free_port()),
    }
    env.pop("KAFKA_HOME", None)
    try:
        first = gpugap(env, "services", "up")
        assert first.returncode == 0, first.stderr
        assert "jars downloaded" in first.stdout
        assert "fetching Apache Kafka" in first.stderr
        status = gpugap(env, "services", "status")
        assert status.returncode == 0
        assert f"bootstrap=127.0.0.1:{port}" in status.stdout
        assert broker_ready(f"127.0.0.1:{port}")
        pid = int(status.stdout.split("pid=")[1].split()[0])

        again = gpugap(env, "services", "up")  # already running: same process
        assert again.returncode == 0 and f"pid={pid}" in again.stdout

        down = gpugap(env, "services", "down")
        assert down.returncode == 0 and "stopped" in down.stdout
        assert not process_alive(pid)
        assert gpugap(env, "services", "status").returncode == 3

        jars = sorted((tmp_path / "cache").rglob("*.jar"))
        mtimes = [p.stat().st_mtime_ns for p in jars]
        second = gpugap(env, "services", "up")
        assert second.returncode == 0, second.stderr
        assert "no download" in second.stdout and "fetching" not in second.stderr
        assert [p.stat().st_mtime_ns for p in jars] == mtimes
        assert sorted((tmp_path / "cache").rglob("*.jar")) == jars
    finally:
        gpugap(env, "services", "down")
    assert not broker_ready(f"127.0.0.1:{port}")


def test_missing_java_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpugap.schemas.errors import ServiceError

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ServiceError, match=r"Java 17\+ is required"):
        java_major()


def test_port_in_use_is_explained(tmp_path: Path, kafka_bootstrap: str) -> None:
    host, port = kafka_bootstrap.rsplit(":", 1)
    env = {
        **os.environ,
        "GPUGAP_SERVICES_STATE_DIR": str(tmp_path),
        "GPUGAP_SERVICES_KAFKA_PORT": port,
        "GPUGAP_SERVICES_KAFKA_HOST": host,
    }
    result = gpugap(env, "services", "up")
    if "127.0.0.1" not in kafka_bootstrap and "localhost" not in kafka_bootstrap:
        pytest.skip("the session broker is not local")
    assert result.returncode == 2
    assert "already in use" in result.stderr
