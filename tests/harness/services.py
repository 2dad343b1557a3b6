"""Whether a service the tests need may be missing: under CI=true it fails the tests that need
it, elsewhere they are skipped with the reason."""

from __future__ import annotations

import os

import pytest

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(what: str) -> None:
    if CI:
        pytest.fail(f"{what} (CI=true: a service the tests need must start)")
    pytest.skip(what)


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False
