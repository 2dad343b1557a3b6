"""Fixtures of the alert-target tests: a real Prometheus Alertmanager (built once into
~/.cache/gpugap, see tests/harness/alertmanager.py), one per test, and the webhook receiver it
notifies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.alertmanager import (
    Alertmanager,
    AlertmanagerBuildError,
    WebhookReceiver,
    ensure_built,
)


@pytest.fixture(scope="session")
def alertmanager_exe() -> Path:
    """The Alertmanager binary; a build that fails fails the tests (CI or not: never a skip)."""
    try:
        return ensure_built()
    except (AlertmanagerBuildError, OSError) as exc:
        pytest.fail(f"could not build Prometheus Alertmanager: {exc}")


@pytest.fixture
def webhook() -> WebhookReceiver:
    """The receiver Alertmanager notifies; the test serves it (``async with
    webhook.serving():``) in its own event loop."""
    return WebhookReceiver()


@pytest.fixture
def alertmanager(
    alertmanager_exe: Path, webhook: WebhookReceiver, tmp_path: Path
) -> Iterator[Alertmanager]:
    """A running Alertmanager of this test's own (free loopback port, its own storage, no
    cluster port), notifying ``webhook``; stopped afterwards."""
    with Alertmanager(alertmanager_exe, webhook.url, tmp_path / "alertmanager") as am:
        yield am
